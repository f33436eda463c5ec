"""How a trial ended, and the objective value the searcher sees for it.

Every trial ends with exactly one terminal status. ``reached`` carries an honest time to
target; every other status is *censored* data for the search: the trial said nothing about how
long reaching the target would take, only that it did not within what it was given. The
searcher still needs a number, so the objective uses the PAR-10 convention of algorithm
configuration (Hutter et al. 2009): a censored run scores 10 x the time cap, bad enough that
the sampler learns the region is poor, without being mistaken for a fast success.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

from raybatch import keys

PAR_FACTOR = 10.0
HANG_GRACE_S = 300.0
"""Seconds past a trial's time cap without a report after which it counts as hung: they cover
an evaluation and its report, which the trial's clock excludes."""
HANG_STARTUP_S = 300.0
"""Seconds a trial may take, beyond its hang window, before its first report: its worker's
start, ``build_model``, the data and the memory probe. A slow start is not a hang, and timed
apart it need not widen the window every later report is held to."""
INDIFFERENCE_ZONE = 0.10
"""The regret a search accepts: recipes within 10 % of each other's time are "within noise"
(the rungs' zone, the race's, and the verdict's all read it from here)."""


class TrialStatus(str, Enum):
    """The state of a trial; all but ``running`` are terminal."""

    RUNNING = "running"
    REACHED = "reached"
    """The target was met; ``time_to_target_s`` is known."""
    CENSORED = "censored"
    """The time or sample budget ran out first."""
    CAPPED = "capped"
    """Stopped by adaptive capping: already slower than the best time so far (x slack)."""
    DIVERGED = "diverged"
    """NaN/Inf loss, or loss above a multiple of the initial loss; stopped at once."""
    INFEASIBLE_MEMORY = "infeasible_memory"
    """Out of GPU memory at the probe or mid-training (or predicted so by the pre-screen)."""
    ERROR = "error"
    """Anything else; the reason holds the exception text."""
    PRESCREENED_OUT = "prescreened_out"
    """Never launched: predicted not to fit the memory budget, needing at least the memory
    of a trial that ran out, or a world size the cluster cannot place. Recorded by the
    searcher, never by a running trial."""
    LOST_AT_INTERRUPTION = "lost_at_interruption"
    """Launched, then orphaned when the driver was interrupted; its result is unknown."""

    @property
    def terminal(self) -> bool:
        return self is not TrialStatus.RUNNING


WORKLOAD_RAN = frozenset(
    s.value
    for s in (
        TrialStatus.REACHED,
        TrialStatus.CENSORED,
        TrialStatus.CAPPED,
        TrialStatus.DIVERGED,
        TrialStatus.INFEASIBLE_MEMORY,
    )
)
"""Statuses that show the workload itself was built and trained (fail-fast counts these as
healthy trials): every way a launched trial ends but ``error``."""


def penalty(cap_s: float) -> float:
    """The objective of a trial that did not reach the target: PAR-10, ``PAR_FACTOR`` x the
    time cap. The one place it is computed: the searcher, the scheduler, the trainable and the
    options all read it here."""
    return PAR_FACTOR * cap_s


def objective_value(status: TrialStatus, time_to_target_s: float | None, cap_s: float) -> float:
    """The value the searcher minimises: the time to target, or :func:`penalty`."""
    if status is TrialStatus.REACHED and time_to_target_s is not None:
        return float(time_to_target_s)
    return penalty(cap_s)


def final_status(
    result: dict[str, Any] | None, error: bool, penalty: float
) -> tuple[TrialStatus, float]:
    """A finished Tune trial's status and objective, from its last result.

    A trial whose last report is still ``running`` was stopped from outside: by the capping
    scheduler. A Ray-level error (the worker died past its retries) is ``error``.
    """
    if error or not result:
        return TrialStatus.ERROR, penalty
    status = TrialStatus(result.get(keys.STATUS, TrialStatus.ERROR.value))
    if status is TrialStatus.RUNNING:
        return TrialStatus.CAPPED, penalty
    value = result.get(keys.OBJECTIVE)
    if status is not TrialStatus.REACHED or value is None or not math.isfinite(value):
        return status, penalty
    return status, float(value)


def timed_evaluation(result: dict[str, Any]) -> tuple[float, float] | None:
    """The evaluation a trial's report holds on training time: ``(training seconds, target
    metric)``; ``None`` for a heartbeat or a trial's end at its time cap (each repeats the last
    evaluation's value at a later time, which would flatten a curve between evaluations), or a
    report without them. A point of the curves the scheduler judges at its rungs and the race
    meets on."""
    metric, trained = result.get(keys.METRIC), result.get(keys.TRAIN_S)
    running = result.get(keys.STATUS) in (TrialStatus.RUNNING.value, TrialStatus.REACHED.value)
    if result.get(keys.HEARTBEAT) or not running or metric is None or trained is None:
        return None
    return float(trained), float(metric)


def evaluation_of(result: dict[str, Any]) -> tuple[int, float] | None:
    """The evaluation a trial's report holds: ``(samples seen, target metric)``; ``None`` for
    a heartbeat, a report without the metric, or a metric that is not finite. A point of the
    learning curves the studies keep (the search's, and the race's beside it)."""
    metric = result.get(keys.METRIC)
    if metric is None or result.get(keys.HEARTBEAT) or not math.isfinite(float(metric)):
        return None
    return int(result.get(keys.SAMPLES_SEEN) or 0), float(metric)


def is_packed(share: Any) -> bool:
    """Whether a trial shared its GPU with others (a fraction of one GPU)."""
    return share is not None and 0 < float(share) < 1
