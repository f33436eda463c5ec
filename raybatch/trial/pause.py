"""A trial's state at an evaluation, saved so that it goes on where it was.

Tune pauses a trial (a scheduler's ``PAUSE``) and restores an interrupted run from the
checkpoint a trial's last report carried; without one, the trial trains again from its first
step. raybatch's own loop, in one process, saves at evaluations :data:`SAVE_RATIO` apart in
training time or more, and at the first past each rung where a scheduler may pause it: the
model, optimizer, warmup schedule, weight average, fp16 scaler, the random generators, how
many micro batches it has taken (the data goes on at the next:
:func:`raybatch.batches.train_batches`'s ``start``) and the reporter (its counts, marks and
clock). A trial resumed from it sees the batches and random draws an uninterrupted one would,
and its clock goes on from the training seconds it had.
"""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from raybatch.errors import first_line

log = logging.getLogger(__name__)

SAVE_RATIO = 1.5
"""An evaluation saves the trial's state when it comes this factor or more later in training
than the last save: every time mark's (:data:`~raybatch.trial.cadence.TIME_MARK_RATIO`, sqrt 3
apart; at sqrt 3 itself, an evaluation a step past its mark skipped the next mark's save), where
the scheduler judges and pauses, so that a paused trial goes on from where it was; the near
marks, 1.15 apart, save less often..."""
SAVE_SHARE = 0.05
"""...and when the training since the last save is at least 20 times what that save cost
(writing it, and Tune's copy): saving costs at most 5 % of the training it keeps. On the real
benchmark's two-second trainings, ten saves a trial had held the devices 2-7 s a search more."""
STATE_FILE = "raybatch_trial.pt"
STATE_FORMAT = 1
"""The saved state's layout: a save of another is not read (the trial trains afresh)."""


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
    """Saves the trial's state at evaluations, :data:`SAVE_RATIO` apart in training time.

    Each save is a fresh directory, handed to Tune with the evaluation's report (Tune copies it
    into the trial's storage before the report returns), then deleted (:meth:`close`).

    Args:
        capture: Returns the state to save (:func:`capture`).
        ratio: The least factor of training time between two saves.
        share: The most a save may cost, as a share of the training since the last.
        rungs: Training times at which a scheduler may pause the trial: the first evaluation
            past one saves, whatever the two rules above say. A pause there went on from the
            save before: on the real benchmark, its trials trained again 0.3-1.3 trainings of
            the best recipe a search, where each save costs a few hundredths of a second.
    """

    def __init__(
        self,
        capture: Callable[[], dict[str, Any]],
        ratio: float = SAVE_RATIO,
        share: float = SAVE_SHARE,
        rungs: Iterable[float] = (),
    ) -> None:
        self.capture = capture
        self.ratio = ratio
        self.share = share
        self.rungs = sorted(rungs)
        self.saved_at_s: float | None = None
        self.cost_s = 0.0
        """What the last save cost, in wall seconds (set by whoever hands it to Tune)."""
        self.directory: str | None = None

    def due(self, train_s: float) -> bool:
        """Whether an evaluation at ``train_s`` seconds of training saves."""
        last = self.saved_at_s
        if last is None or any(last < rung <= train_s for rung in self.rungs):
            return True
        return train_s >= last * self.ratio and (train_s - last) * self.share >= self.cost_s

    def save(self, train_s: float) -> str:
        """Write the state into a fresh directory; its path."""
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


def capture(parts: Any, validation: Any, reporter: Any) -> dict[str, Any]:
    """What a paused trial keeps: the loop's parts (model, optimizer, warmup schedule, weight
    average, fp16 scaler), the micro batches taken, where its validation stands, its reporter
    and the random generators."""
    ema = parts.ema
    return {
        "format": STATE_FORMAT,
        "model": parts.model.state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "scheduler": parts.scheduler.state_dict(),
        "ema": None if ema is None else {"module": ema.module.state_dict(), "updates": ema.updates},
        "scaler": parts.scaler.state_dict() if parts.scaler is not None else None,
        "micro_steps": parts.taken,
        "validation": {
            "first": validation.first,
            "near": validation.near,
            "on_subset": validation.on_subset,
        },
        "reporter": reporter.state(),
        "rng": rng_state(),
    }


def restore(parts: Any, validation: Any, reporter: Any, state: dict[str, Any]) -> None:
    """Put the loop's parts, its validation and its reporter back as :func:`capture` saw them
    (the generators are put back by the loop, last, right before its clock starts).

    Raises:
        ValueError: A state of another format. Any error here leaves the parts half loaded:
            the loop builds them again and trains afresh.
    """
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"a saved state of format {state.get('format')!r}, not {STATE_FORMAT}")
    parts.model.load_state_dict(state["model"])
    parts.optimizer.load_state_dict(state["optimizer"])
    parts.scheduler.load_state_dict(state["scheduler"])
    if parts.ema is not None and state["ema"] is not None:
        parts.ema.module.load_state_dict(state["ema"]["module"])
        parts.ema.updates = int(state["ema"]["updates"])
    if parts.scaler is not None and state["scaler"] is not None:
        parts.scaler.load_state_dict(state["scaler"])
    kept = state["validation"]
    validation.first, validation.near = kept["first"], bool(kept["near"])
    if not kept["on_subset"]:
        validation.early = None
    reporter.restore(state["reporter"])  # last: it fails whole or not at all
    parts.taken = int(state["micro_steps"])


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


__all__ = ["SAVE_RATIO", "STATE_FILE", "STATE_FORMAT", "Saver", "capture", "checkpointing",
           "load", "restore", "rng_state", "saved_state", "set_rng_state",
           "storage_reachable"]  # fmt: skip
