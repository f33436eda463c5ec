"""raybatch's version, in one place: the installed distribution's metadata (``pyproject.toml``).

A source tree that is not installed (``PYTHONPATH`` pointing at a checkout) has no metadata:
it reports ``0+unknown`` rather than a number that might be stale.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("raybatch")
except PackageNotFoundError:
    __version__ = "0+unknown"

__all__ = ["__version__"]
