"""The examples' data built once per machine, then read back as tensors.

The bundled workloads take their data from scikit-learn, whose import alone costs a process
about a second of a core (it pulls in SciPy's statistics and pandas), while the data take
milliseconds to read back from a file. Every trial process builds its workload's data once, so
each cold process of a search paid that second: on the demo, whose best recipe trains in a
couple of seconds, a slot's start-up. Here the first process to build a split writes it to the
cache; the others read the tensors and never import scikit-learn.

The cache is keyed by the split's name and arguments and by the scikit-learn release that made
it, so a new release builds anew. A file that cannot be read is built again; a folder that
cannot be written is no error (the data are built, as before). ``RAYBATCH_DATA_CACHE`` names
the folder (default: ``$XDG_CACHE_HOME/raybatch/data``, else ``~/.cache/raybatch/data``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

CACHE_ENV = "RAYBATCH_DATA_CACHE"
FORMAT = 1
"""Bumped when what a cached file holds changes."""

Split = tuple[TensorDataset, TensorDataset]
UNREADABLE = (OSError, EOFError, RuntimeError, KeyError, TypeError, ValueError,
              pickle.UnpicklingError)  # fmt: skip
"""What ``torch.load`` raises for a file absent, cut short or not of this layout."""


def cache_dir() -> Path:
    """Where the examples' data are kept (:data:`CACHE_ENV`, else the user's cache folder)."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "raybatch" / "data"


def cache_path(name: str, params: dict[str, Any]) -> Path:
    """The file of the split ``name`` built with ``params``."""
    try:
        release = metadata.version("scikit-learn")
    except metadata.PackageNotFoundError:
        release = "none"
    key = json.dumps({"format": FORMAT, "sklearn": release, **params}, sort_keys=True)
    return cache_dir() / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"


def cached_split(name: str, build: Callable[..., Split], **params: Any) -> Split:
    """The split ``build(**params)`` makes, read from the cache where it was built before (on
    this machine, by this scikit-learn), else built and kept there. The arguments are the key:
    the data are what they say."""
    path = cache_path(name, params)
    try:
        saved = torch.load(path, weights_only=True)
        return TensorDataset(*saved["train"]), TensorDataset(*saved["val"])
    except UNREADABLE:  # absent, cut short or of another layout: built again below
        pass
    train, val = build(**params)
    _keep(path, {"train": list(train.tensors), "val": list(val.tensors)})
    return train, val


def _keep(path: Path, tensors: dict[str, list[torch.Tensor]]) -> None:
    """Write ``tensors`` to ``path`` whole or not at all (another process may be reading or
    writing the same file: each writes its own and renames it into place)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(tensors, f)
            os.chmod(tmp, 0o644)  # as a file the user wrote: mkstemp's are theirs alone
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:  # a read-only or full disk: the data were built, the cache is a saving
        pass


__all__ = ["CACHE_ENV", "cache_dir", "cache_path", "cached_split"]
