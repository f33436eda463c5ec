"""What ends a trial, each as the reason a user reads: the target reached, a budget spent, a
diverged loss, an exception.

Each rule is a pure function of the trial's figures that says why the trial stops (``None``: it
goes on), so the wording of the run's log lives in one place and is tested without a clock; the
reporter (:mod:`raybatch.trial.reporting`) applies them when it reads its clock and reports.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass

from raybatch.errors import first_line
from raybatch.memory.probe import is_out_of_memory
from raybatch.metric import Target
from raybatch.status import TrialStatus, objective_value


@dataclass(frozen=True)
class TrialLimits:
    """The target, the budgets and the divergence rule of one trial.

    Attributes:
        target: The value to reach.
        max_time_s: Cap on training time (evaluation excluded); past it, ``censored``.
        max_samples: Optional sample budget; past it, ``censored``.
        divergence_factor: A loss above this multiple of the first loss is ``diverged``.
    """

    target: Target
    max_time_s: float
    max_samples: int | None = None
    divergence_factor: float = 10.0

    def diverged(self, loss: float, initial_loss: float | None, steps: int) -> str | None:
        """A NaN/Inf loss, or one past ``divergence_factor`` x the first."""
        if not math.isfinite(loss):
            return f"loss is {loss} at step {steps}"
        if initial_loss is not None and loss > self.divergence_factor * max(initial_loss, 1e-12):
            return (f"loss {loss:.4g} exceeds {self.divergence_factor:g} x the initial"
                    f" {initial_loss:.4g} at step {steps}")  # fmt: skip
        return None

    def spent(self, train_s: float, samples_seen: int) -> str | None:
        """The time cap (on training time) or the sample budget, spent."""
        if train_s > self.max_time_s:
            spent = f"time cap of {self.max_time_s:g} s of training reached at {samples_seen}"
            spent += " samples"
        elif self.max_samples is not None and samples_seen >= self.max_samples:
            spent = f"sample budget of {self.max_samples} spent"
        else:
            return None
        return f"{spent} without reaching {self.target.metric} {self.target.value:g}"

    def reached(self, metric: float, samples_seen: int, time_to_target_s: float) -> str:
        """Why a trial whose evaluation read ``metric`` stops: it reached the target."""
        return (f"{self.target.metric} {metric:.4g} reached {self.target.value:g} after"
                f" {samples_seen} samples in {time_to_target_s:.3f} s of training")  # fmt: skip

    def objective(self, status: TrialStatus, time_to_target_s: float | None) -> float:
        """What the searcher minimises (:func:`raybatch.status.objective_value`)."""
        return objective_value(status, time_to_target_s, self.max_time_s)


def failure(exc: BaseException, during: str = "") -> tuple[TrialStatus, str, str | None]:
    """How an exception ends a trial: ``infeasible_memory`` for an out-of-memory error (the
    recipe did not fit: no traceback), else ``error`` with its traceback."""
    text = first_line(exc)
    if is_out_of_memory(exc):
        return TrialStatus.INFEASIBLE_MEMORY, f"out of memory {during}: {text}".strip(), None
    where = f" ({during})" if during else ""
    return (TrialStatus.ERROR, f"{type(exc).__name__}: {text}{where}",
            "".join(traceback.format_exception(exc)))  # fmt: skip


__all__ = ["TrialLimits", "failure"]
