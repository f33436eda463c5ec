"""What a trial has counted and read: samples and steps, the losses, the last evaluation, and
the figures at its target.

The reporter (:mod:`raybatch.trial.reporting`) decides and reports; the tally only holds, so a
paused trial keeps it whole (:meth:`TrialTally.kept`) and a report reads it in one place
(:meth:`TrialTally.fields`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raybatch import keys


@dataclass
class TrialTally:
    """One trial's counts and last readings.

    Attributes:
        samples_seen: Training samples seen so far.
        steps: Optimizer steps taken so far.
        reports: Reports sent (evaluations, heartbeats and the final one).
        metric: The target's metric at the last evaluation.
        loss: The last loss read; ``initial_loss`` the first (the divergence rule's reference).
        values: Every validation metric of the last evaluation, by name.
        time_to_target_s: Training seconds to the target (evaluation excluded), once reached;
            ``elapsed_to_target_s`` the wall clock's, ``samples_to_target`` the samples'.
    """

    samples_seen: int = 0
    steps: int = 0
    reports: int = 0
    metric: float | None = None
    loss: float | None = None
    initial_loss: float | None = None
    values: dict[str, float] = field(default_factory=dict)
    time_to_target_s: float | None = None
    elapsed_to_target_s: float | None = None
    samples_to_target: int | None = None

    KEPT = ("samples_seen", "steps", "reports", "metric", "loss", "initial_loss", "values")
    """What a paused trial keeps: it has not reached its target, so nothing at the target."""

    def kept(self) -> dict[str, Any]:
        """The fields a paused trial's state keeps (:attr:`KEPT`)."""
        return {name: getattr(self, name) for name in self.KEPT}

    def fields(self, train_s: float, data_wait_s: float) -> dict[str, Any]:
        """The tally's part of a report (see :mod:`raybatch.keys`)."""
        per_s = (lambda value: value / train_s) if train_s > 0 else (lambda value: 0.0)
        return {
            keys.METRIC: self.metric,
            keys.LOSS: self.loss,
            keys.SAMPLES_SEEN: self.samples_seen,
            keys.STEPS: self.steps,
            keys.TIME_TO_TARGET_S: self.time_to_target_s,
            keys.ELAPSED_TO_TARGET_S: self.elapsed_to_target_s,
            keys.SAMPLES_TO_TARGET: self.samples_to_target,
            keys.THROUGHPUT: per_s(self.samples_seen),
            keys.DATA_WAIT_FRACTION: per_s(data_wait_s),
            **{keys.VALIDATION_PREFIX + name: v for name, v in self.values.items()},
        }


__all__ = ["TrialTally"]
