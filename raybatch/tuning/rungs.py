"""Equal-time rungs: every trial judged at the same training times, tied to the target.

As in ASHA (Li et al. 2020; Ray Tune's ``ASHAScheduler`` on a ``time_attr``), but the time is
the trial's *training* seconds and the rungs are tied to the target: ``B``, the best estimate
of the optimum's time to target, and below it a fixed grid (about ``B/eta^2, B/eta``:
:func:`grid_rungs`). A trial goes on at a rung
while either holds:

- it is **within the indifference zone** of the best curve seen: by the rung it reached the
  level the best trial had at ``rung / (1 + zone)`` (the regret the search accepts);
- it is **in the top 1/eta** of the trials that got to the rung (ASHA's rule), so a rung never
  stops every trial.

The zone hedges against early ranks that do not hold (a recipe with a long warmup starts
slowly), so it is wider at earlier rungs (:func:`hedged_zone`). Trials are compared at equal
training time, whatever order they ran in: values between evaluations are interpolated, a
trial is never stopped for being evaluated late, and one that got to a rung first is judged
there again once another curve has.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass

from raybatch.errors import Issue, OptionError
from raybatch.status import INDIFFERENCE_ZONE
from raybatch.trial.cadence import time_marks

DEFAULT_ETA = 3.0
DEFAULT_ZONE = INDIFFERENCE_ZONE
RUNG_COUNT = 3
"""Rungs at ``B/eta^2 .. B``: with eta 3, B/9, B/3 and B. None at B/27: a recipe with a large
LR starts slowly and catches up, and a rung that early stops recipes near the optimum
(``docs/search.md`` has the figures)."""
TOLERANCE = 1e-9
"""Relative: a rung and the time mark it sits on, computed apart, differ by a rounding."""
GUESS_RUNG_COUNT = 4
"""Before any trial has reached the target, ``B`` is a guess (the time cap / eta), an upper
bound that may be far above the optimum's time: the rungs then go one further down (the cap /
81 .. the cap / 3), so that trials started together are compared early."""


class Trajectory:
    """A trial's best metric so far against its training time, in the target's direction.

    Values are stored as "progress" (the metric, negated for a ``min`` target), so higher is
    always better and the best-so-far curve is monotone.

    Args:
        mode: The target's direction (``max``: accuracy; ``min``: loss).
    """

    def __init__(self, mode: str = "max") -> None:
        self.sign = 1.0 if mode == "max" else -1.0
        self.times: list[float] = []
        self.best: list[float] = []
        self.judged: set[float] = set()  # the rungs (seconds) it was judged at, beside others

    def add(self, train_s: float, metric: float) -> None:
        """One evaluation: the metric at ``train_s`` seconds of training (in order)."""
        value = self.sign * float(metric)
        if value != value:  # NaN: no progress
            return
        if self.times and train_s < self.times[-1]:
            # Run again from an earlier point: from its save (raybatch.trial.pause), or from
            # its start (a retry with none). What it showed up to that point stands.
            kept = bisect.bisect_right(self.times, train_s)
            self.times, self.best = self.times[:kept], self.best[:kept]
            self.judged = {t for t in self.judged if t <= train_s}
        if self.best and value < self.best[-1]:
            value = self.best[-1]
        self.times.append(float(train_s))
        self.best.append(value)

    @property
    def progress(self) -> float | None:
        """The best level reached so far."""
        return self.best[-1] if self.best else None

    def value_at(self, train_s: float, before_first: bool = True) -> float | None:
        """The best level at ``train_s``, interpolated between evaluations; ``None`` past the
        curve's end (the trial has not trained that long). Before the first evaluation the
        first value stands where ``before_first`` (the trial being judged: never stopped for
        being evaluated late), else ``None`` (a peer's curve shows nothing there yet)."""
        if not self.times or train_s > self.times[-1] * (1.0 + TOLERANCE):
            return None
        train_s = min(train_s, self.times[-1])  # a rung a rounding past its mark is at it
        i = bisect.bisect_left(self.times, train_s)
        if i == 0:
            return self.best[0] if before_first or train_s == self.times[0] else None
        t0, t1 = self.times[i - 1], self.times[i]
        v0, v1 = self.best[i - 1], self.best[i]
        return v0 if t1 <= t0 else v0 + (v1 - v0) * (train_s - t0) / (t1 - t0)


def guess_of_b(max_time_s: float, eta: float = DEFAULT_ETA) -> float:
    """The guess of ``B``, the optimum's time to target, before any trial reached: trials
    capped at ``max_time_s`` of training, the optimum is guessed a rung (``eta``) below the
    cap. The scheduler's rungs and the opening's wait for a reach take it alike."""
    return max_time_s / eta


def rung_times(horizon_s: float, eta: float = DEFAULT_ETA, count: int = RUNG_COUNT) -> list[float]:
    """The rungs' training times for a best estimate ``horizon_s`` of the optimum's time to
    target, earliest first: ``B/eta^(count-1) .. B``."""
    return [horizon_s / eta**k for k in range(count - 1, -1, -1)]


def grid_rungs(
    best_s: float, anchor_s: float, eta: float = DEFAULT_ETA, count: int = RUNG_COUNT
) -> list[float]:
    """The rungs once a trial has reached the target in ``best_s`` (``B``): the ``count - 1``
    highest points of the fixed grid ``anchor_s x eta^k`` at or below ``B / sqrt(eta)``, then
    ``B``. The grid does not move when ``B`` does: a trial judged at a grid rung before a reach,
    or before a faster one, is never left unjudged between rungs that moved past it (a wide MLP
    trained 0.6 s to 1.9 s with no rung between once ``B`` moved twice), and a rung is never
    judged twice a few steps apart. Only the top rung, ``B`` itself, moves with it."""
    step = math.log(eta)
    k = math.floor(math.log(best_s / math.sqrt(eta) / anchor_s) / step + 1e-9)
    below = [anchor_s * eta ** (k - j) for j in range(count - 2, -1, -1)]
    return [*below, best_s]


MIN_SHARE = 0.2
"""A curve extrapolates to the target once it has come this share of the way from its first
evaluation: before, its pace says more about its warmup than about its time to target."""


def extrapolated(trajectory: Trajectory, target: float) -> float | None:
    """The training time at which ``trajectory`` would reach ``target`` (the metric's value, read
    in the curve's direction, as its evaluations are) at its average pace since its first
    evaluation; ``None`` before it has come :data:`MIN_SHARE` of the way. Curves slow down as they
    go, so this is an optimistic estimate of its time to target: rungs placed by it come
    early rather than late, and early is what a rung costs least at."""
    goal = trajectory.sign * target
    if len(trajectory.times) < 2 or trajectory.best[0] >= goal:
        return None
    first, last = trajectory.best[0], trajectory.best[-1]
    share = (last - first) / (goal - first)
    if share < MIN_SHARE:
        return None
    start = trajectory.times[0]
    return start + (trajectory.times[-1] - start) / min(share, 1.0)


def lowest_mark(horizon_s: float, eta: float = DEFAULT_ETA) -> float:
    """The trials' first time mark (:func:`~raybatch.trial.cadence.time_marks`) for the time cap
    ``horizon_s x eta``: no curve has an evaluation before it."""
    return time_marks(horizon_s * eta)[0]


def guessed_rungs(horizon_s: float, eta: float, curves: Iterable[Trajectory],
                  target: float | None) -> list[float]:  # fmt: skip
    """The rungs before any trial has reached the target: ``B`` is a guess (``horizon_s``, the
    time cap / eta), only a bound, so the rungs go one further down than after
    (:data:`GUESS_RUNG_COUNT`: the cap / 81 .. the cap / 3), and trials started together are
    compared from their first evaluations on. Where a curve already extrapolates to ``target``
    (:func:`extrapolated`) far below the guess, the grid rungs under that estimate are added,
    down to the trials' lowest time mark: a rung no trial evaluates near compares first
    evaluations taken at different times (the simulated family paused every trial at one)."""
    guess = rung_times(horizon_s, eta, GUESS_RUNG_COUNT)
    ends = [extrapolated(c, target) for c in curves] if target is not None else []
    soon = min((e for e in ends if e is not None), default=None)
    if soon is None:
        return guess
    lowest = lowest_mark(horizon_s, eta) * (1.0 - TOLERANCE)
    lower = grid_rungs(soon, horizon_s, eta)[:-1]
    return [r for r in lower if lowest <= r < guess[0] * (1.0 - TOLERANCE)] + guess


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile with linear interpolation (NumPy's default, which ASHA uses)."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def passes(trial: Trajectory, rung_s: float, others: Iterable[Trajectory], zone: float,
           eta: float, first_stands: bool = False) -> bool | None:  # fmt: skip
    """Whether ``trial`` goes on at the rung at ``rung_s`` seconds of training, against the
    curves of every other trial seen (running or ended); ``None`` where nothing else got to the
    rung (the trial goes on, and is judged there again once another curve has). Where
    ``first_stands`` (a rung at the trials' lowest time mark: :func:`lowest_mark`), a peer's
    first evaluation stands for the rung, as the judged trial's own does: each is taken at the
    first step past that mark, so no curve shows the rung itself, and a real search paused
    every trial there waiting for peers that never came."""
    mine = trial.value_at(rung_s)
    if mine is None:  # not there yet: no verdict
        return None
    curves = list(others)
    at_rung = [v for v in (c.value_at(rung_s, first_stands) for c in curves) if v is not None]
    if not at_rung:  # the first trial at this rung
        return None
    earlier = rung_s / (1.0 + zone)
    shown = [v for v in (c.value_at(earlier, first_stands) for c in curves) if v is not None]
    if shown and mine >= max(shown):  # within the zone of every curve that shows that time
        return True
    return mine >= quantile([*at_rung, mine], 1.0 - 1.0 / eta)


HEDGE = 0.25
"""How much wider the zone is at earlier rungs: ``eta ** (HEDGE x k)`` at ``k`` rungs below
the top (at B/9 a trial 1.9x slower to its level goes on, at B/3 1.45x, at B 1.1x)."""


def hedged_zone(zone: float, eta: float, below_top: int, hedge: float = HEDGE) -> float:
    """The zone at a rung ``below_top`` rungs under the highest: a trial may be that much
    slower to its level and go on. Early ranks hold less (a recipe with a long warmup or a
    large LR starts slowly and catches up), so the earlier the rung, the wider the zone:
    ``(1 + zone) x eta ** (hedge x below_top) - 1`` (Hyperband hedges the same doubt with
    brackets that start later)."""
    return float((1.0 + zone) * eta ** (hedge * below_top) - 1.0)


@dataclass(frozen=True)
class RungRule:
    """How the rungs judge a trial: ASHA's rule on training time, tied to the target.

    Attributes:
        zone: The indifference zone at the rungs: a trial at most ``1 + zone`` times slower
            than the best curve to its level goes on (``None``: no rungs).
        eta: A trial outside the zone goes on while it is in the top ``1/eta`` at its rung.
        hedge: How much wider the zone is at earlier rungs (0: the same at every rung).
        horizon_s: The guess of ``B`` until a trial has reached (``None``: no rungs before).
        target: The target's value: curves extrapolated to it add rungs below the guess
            (:func:`guessed_rungs`).

    Example::

        raybatch.CappingScheduler(rungs=raybatch.RungRule(zone=0.1, hedge=0.0, horizon_s=20.0))
    """

    zone: float | None = DEFAULT_ZONE
    eta: float = DEFAULT_ETA
    hedge: float = HEDGE
    horizon_s: float | None = None
    target: float | None = None

    def __post_init__(self) -> None:
        issues = [Issue(name, f"must be {allowed}, got {value!r}")
                  for name, value, allowed, ok in (
                      ("zone", self.zone, ">= 0 or None", self.zone is None or self.zone >= 0),
                      ("eta", self.eta, "> 1", self.eta > 1.0))
                  if not ok]  # fmt: skip
        if issues:
            raise OptionError(issues)


__all__ = [
    "DEFAULT_ETA",
    "DEFAULT_ZONE",
    "GUESS_RUNG_COUNT",
    "RUNG_COUNT",
    "RungRule",
    "Trajectory",
    "extrapolated",
    "grid_rungs",
    "guess_of_b",
    "guessed_rungs",
    "hedged_zone",
    "lowest_mark",
    "passes",
    "quantile",
    "rung_times",
]
