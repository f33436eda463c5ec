"""raybatch's version, and the format of what a search writes, each in one place.

The version is the installed distribution's metadata (``pyproject.toml``). A source tree that
is not installed (``PYTHONPATH`` pointing at a checkout) has no metadata: it reports
``0+unknown`` rather than a number that might be stale.

The format (:data:`RUN_FORMAT`) is what a later raybatch reads back: ``run.json``,
``best_config.yaml``/``.json`` and the searcher's Tune checkpoint each carry it, and
:func:`check_format` is the one place that reads it, refusing what it cannot read with the
file named, instead of misreading it.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from raybatch.errors import Issue, RunDirError

RUN_FORMAT = 2
"""The format of the files a search writes and reads back. Bump it when any of them changes in
a way this reader would misread; older formats are then refused (or migrated here). 2: the
searcher Tune pickles whole is composed of other parts (its screen, its launches), and the
provenance is a typed record."""
FORMAT_KEY = "format"
"""Where each file keeps it."""


def check_format(found: object, source: str) -> None:
    """Refuse a file (``source``) whose format is not :data:`RUN_FORMAT`.

    Raises:
        RunDirError: Written by a raybatch of another format, or by none (no format).
    """
    if found == RUN_FORMAT:
        return
    what = "missing" if found is None else f"{found!r}"
    why = (
        f"{what}: written by another raybatch version (this one reads format {RUN_FORMAT});"
        " use the raybatch that wrote it, or start a new search"
    )
    raise RunDirError([Issue(FORMAT_KEY, why)], source)


try:
    __version__ = version("raybatch")
except PackageNotFoundError:
    __version__ = "0+unknown"

__all__ = ["FORMAT_KEY", "RUN_FORMAT", "__version__", "check_format"]
