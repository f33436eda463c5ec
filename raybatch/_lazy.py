"""Lazy re-exports for a package's ``__init__`` (PEP 562).

Every trial of a search runs in a fresh Ray worker process; a package ``__init__`` that
imported its modules eagerly would make each worker pay for modules (and their PyTorch, Ray or
Optuna imports) it never uses. A package declares which of its modules holds each public name,
and the module is imported on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, ...]]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for ``package``, from ``{module: names}``.

    Module names are relative to the package (``"wrapper"`` for ``package.wrapper``).
    """
    module_of = {name: module for module, names in exports.items() for name in names}
    names = sorted(module_of)

    def getattr_(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def dir_() -> list[str]:
        return names

    return names, getattr_, dir_
