"""A trial's state at an evaluation, saved so that it goes on where it was.

Tune pauses a trial (a scheduler's ``PAUSE``) and restores an interrupted run from the
checkpoint a trial's last report carried; without one, the trial trains again from its first
step. raybatch's own loop, in one process, saves at evaluations :data:`SAVE_RATIO` apart in
training time or more: the model, optimizer, warmup schedule, weight average, fp16 scaler, the
random generators, how many micro batches it has taken (the data goes on at the next:
:func:`raybatch.batches.train_batches`'s ``start``) and the reporter (its counts, marks and
clock). A trial resumed from it sees the batches and random draws an uninterrupted one would,
and its clock goes on from the training seconds it had.
"""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raybatch.errors import first_line

log = logging.getLogger(__name__)

SAVE_RATIO = 3**0.5
"""An evaluation saves the trial's state when it comes this factor or more later in training
than the last save (the time marks' spacing, :data:`~raybatch.trial.cadence.TIME_MARK_RATIO`):
about ten saves a trial, and one resumed at a rung repeats at most 42 % of its training."""
STATE_FILE = "raybatch_trial.pt"


def rng_state() -> dict[str, Any]:
    """The random generators a training step draws from (Python, NumPy, PyTorch's, CUDA's)."""
    import numpy as np
    import torch

    out: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                           "torch": torch.get_rng_state()}  # fmt: skip
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    """Put the generators back as :func:`rng_state` read them."""
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Saver:
    """Saves the trial's state at an evaluation, :data:`SAVE_RATIO` apart in training time.

    Each save is a fresh directory, handed to Tune with the evaluation's report (Tune copies it
    into the trial's storage before the report returns); the one before is deleted then.

    Args:
        capture: Returns the state to save (the loop's parts, its data position, the reporter).
        ratio: The least factor of training time between two saves.
    """

    def __init__(self, capture: Callable[[], dict[str, Any]], ratio: float = SAVE_RATIO) -> None:
        self.capture = capture
        self.ratio = ratio
        self.saved_at_s: float | None = None
        self.directory: str | None = None

    def __call__(self, train_s: float) -> str | None:
        if self.saved_at_s is not None and train_s < self.saved_at_s * self.ratio:
            return None
        import torch

        self.close()
        self.directory = tempfile.mkdtemp(prefix="raybatch-trial-")
        torch.save(self.capture(), Path(self.directory) / STATE_FILE)
        self.saved_at_s = train_s
        return self.directory

    def close(self) -> None:
        """Delete the last save's directory (Tune holds its copy)."""
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


def load(checkpoint: Any) -> dict[str, Any] | None:
    """The state a Tune checkpoint holds (``None``: no checkpoint, or not one of these)."""
    if checkpoint is None:
        return None
    import torch

    try:
        with checkpoint.as_directory() as directory:
            path = Path(directory) / STATE_FILE
            if not path.is_file():
                return None
            state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
            return state
    except Exception as exc:  # gone (a run directory moved), or damaged: train afresh
        log.warning(f"the trial's saved state could not be read ({type(exc).__name__}:"
                    f" {first_line(exc)}): it trains again from its first step")  # fmt: skip
        return None


def storage_reachable() -> bool:
    """Whether this node can write the run's storage, where Tune keeps a trial's checkpoints.

    On a cluster whose storage is a local path on the head node, a checkpoint reported from
    another node fails the trial (Ray checks for a marker file it wrote there): such a trial
    saves nothing, and trains again from its first step if Tune runs it again.
    """
    try:
        # Ray's developer API; the same check Ray makes before it copies a checkpoint.
        from ray.train._internal.session import get_storage

        get_storage()._check_validation_file()
    except Exception:
        return False
    return True


def saved_state() -> dict[str, Any] | None:
    """The state the trial's Tune checkpoint holds: the trial was paused, or its run
    interrupted and restored (``None``: it starts afresh)."""
    from ray import tune

    return load(tune.get_checkpoint())


def checkpointing(to_tune: bool) -> dict[str, Any]:
    """The loop's ``resume`` and ``save`` for a trial: reporting to Tune, it goes on from the
    state its checkpoint holds and saves where Tune's storage is reachable; else neither."""
    if not to_tune:
        return {"resume": None, "save": False}
    return {"resume": saved_state(), "save": storage_reachable()}


__all__ = ["SAVE_RATIO", "STATE_FILE", "Saver", "checkpointing", "load", "rng_state",
           "saved_state", "set_rng_state", "storage_reachable"]  # fmt: skip
