"""Lazy re-exports for a package's ``__init__`` (PEP 562).

Every trial of a search runs in a fresh Ray worker process; a package ``__init__`` that
imported its modules eagerly would make each worker pay for modules (and their PyTorch, Ray or
Optuna imports) it never uses. A package declares which of its modules holds each public name,
and the module is imported on first use.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping
from typing import Any

IMPORTED_AT = time.perf_counter()
"""When this process first imported raybatch (the package imports this module first): where
a reused trial process's start-up is charged from (:mod:`raybatch.cluster.process_age`)."""

DEFERRED_IMPORTS: Mapping[str, str] = {
    "torch": "PyTorch (seconds to import) loads only where a model is built, traced or trained:"
    " `import raybatch`, the CLI's start and Ray's zero-GPU tasks (the NVML reader) go without",
    "ray": "Ray loads only where a cluster is reached or Tune runs: `raybatch --help`, `export`"
    " and the rows, report and exports of a finished run go without",
    "optuna": "Optuna (and SQLAlchemy) load only where a study is opened, not in a trial worker",
    "numpy": "NumPy loads with PyTorch's work, not with the package",
    "pydantic": "pydantic loads where a file is validated, never on a trial's GPU path",
    "matplotlib": "an optional plotting dependency: only the report draws",
    "sklearn": "an examples-only dependency: only a bundled example's data needs it",
    "transformers": "an optional dependency: only the Hugging Face adapter and export use it",
    "lightning": "an optional dependency: only the Lightning adapter uses it",
    "pynvml": "an optional dependency (nvidia-ml-py): without it, no GPU is read, cleanly",
}
"""Third-party packages imported inside functions, each with why it is deferred: the one place
that says it, instead of a comment at each of their many imports. Any other import inside a
function says why on its line or the comment line above it (the package's tests check both)."""


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
