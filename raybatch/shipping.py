"""Getting the user's workload code to every Ray worker, on every node.

Ray pickles a Tune trainable, and everything it closes over, with ``ray.cloudpickle``, which
pickles classes and functions *by reference* (module and name). That fails on a worker where
the module is not importable: a workload file loaded by path, its sibling modules, a package
found through the driver's current folder, an editable install on the driver alone. Such
modules are registered with :func:`ray.cloudpickle.register_pickle_by_value`, so their code
travels inside the pickle; installed distributions stay by reference, as a cluster has them.

This rather than a ``runtime_env`` (``working_dir``, ``py_modules``): it ships code only, never
the data files beside a training script, and it works where raybatch does not own ``ray.init``
(a notebook already connected). Its limit: a module imported inside a method is looked up by
name on the worker, so import helpers at the top of the workload file. Code in ``__main__`` is
already pickled by value; the modules it imports from its own folder are registered here.

Any other object of a registered module is still pickled by reference, a ``functools.cache``
wrapper among them, so a reducer rebuilds such wrappers on the worker around their function,
which travels by value (with an empty cache, as a fresh process would have).
"""

from __future__ import annotations

import copyreg
import functools
import importlib.metadata
import os
import sys
import sysconfig
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

_NEVER = frozenset({"raybatch", "__main__", "__mp_main__"})


@cache
def _distribution_packages() -> frozenset[str]:
    """Top-level import names provided by installed distributions (importable on workers)."""
    return frozenset(importlib.metadata.packages_distributions())


@cache
def _library_roots() -> tuple[str, ...]:
    """Folders holding the standard library and installed packages."""
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return tuple(sorted(os.path.realpath(r) + os.sep for r in roots))


def _module_file(module: ModuleType) -> str | None:
    file = getattr(module, "__file__", None)
    return os.path.realpath(file) if isinstance(file, str) else None


def is_user_module(module: ModuleType) -> bool:
    """A module a worker may not be able to import by name: the user's own code.

    Not user code: the standard library, builtins, installed distributions (and anything
    under the interpreter's prefix), and raybatch itself.
    """
    name = module.__name__
    top = name.partition(".")[0]
    if top in _NEVER or top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return False
    if top in _distribution_packages():  # before the file's real path: most modules are theirs
        return False
    file = _module_file(module)
    if file is None:
        return False
    return not file.startswith(_library_roots())


def _defining_modules(obj: object) -> list[ModuleType]:
    """The modules of ``obj``'s class and of the functions/classes it holds (model_fn...)."""
    names = [type(obj).__module__]
    for value in getattr(obj, "__dict__", {}).values():
        if isinstance(value, type) or (callable(value) and hasattr(value, "__code__")):
            names.append(getattr(value, "__module__", None) or "")
    return [sys.modules[n] for n in dict.fromkeys(names) if n in sys.modules]


def _folder(module: ModuleType) -> Path:
    """The folder of a module's file (``__main__`` with no file, as in a notebook: the cwd)."""
    file = _module_file(module)
    return Path(file).parent if file else Path.cwd()


def user_modules(folders: Iterable[Path], extra: Iterable[ModuleType] = ()) -> list[ModuleType]:
    """User modules loaded from ``folders`` (or below them), plus the ``extra`` ones."""
    roots = tuple(os.path.realpath(f) + os.sep for f in folders)
    found = {m.__name__: m for m in extra}
    for module in list(sys.modules.values()):
        if not isinstance(module, ModuleType) or not is_user_module(module):
            continue
        file = _module_file(module)
        if file is not None and file.startswith(roots):
            found[module.__name__] = module
    return [found[name] for name in sorted(found)]


def cached(function: Any, maxsize: int | None, typed: bool) -> Any:
    """``function`` wrapped in ``functools.lru_cache`` again (on the worker that unpickles it)."""
    return functools.lru_cache(maxsize=maxsize, typed=typed)(function)


def _reduce_cache_wrapper(wrapper: Any) -> Any:
    """Pickle a cached function of a module shipped by value as its function and cache
    parameters; any other one by reference (its name), as pickle does by default."""
    from ray import cloudpickle

    if wrapper.__module__ not in cloudpickle.list_registry_pickle_by_value():
        return wrapper.__qualname__
    parameters = wrapper.cache_parameters()
    return cached, (wrapper.__wrapped__, parameters["maxsize"], parameters["typed"])


_CACHE_WRAPPER = type(functools.cache(len))
"""``functools._lru_cache_wrapper``, named without its private name."""


def ship_by_value(obj: object) -> list[str]:
    """Register the user code behind ``obj`` to be pickled by value; the module names.

    Covers the modules defining ``obj``'s class (and the functions it holds, as a
    :class:`~raybatch.workload.SimpleWorkload` holds ``model_fn``) and every user module loaded from
    their folders: the siblings they import. Idempotent.
    """
    from ray import cloudpickle

    defining = _defining_modules(obj)
    folders = [
        _folder(m)
        for m in defining
        if m.__name__ in ("__main__", "__mp_main__") or is_user_module(m)
    ]
    modules = user_modules(folders, [m for m in defining if is_user_module(m)])
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    if modules:
        copyreg.pickle(_CACHE_WRAPPER, _reduce_cache_wrapper)
    return [m.__name__ for m in modules]
