"""When a trial evaluates and when it reports between evaluations.

Three kinds of mark, each for a reader of the reports:

- training-time marks (:func:`time_marks`), read on the host clock: the equal-time rungs
  (:mod:`raybatch.tuning.rungs`) need an evaluation near each whatever the batch size, and near
  the target each evaluation sets the next at most 15 % later (:data:`NEAR_MARK_RATIO`), so a
  time to target is read close to the crossing;
- sample marks, ``eval_every_samples`` training samples apart. Beside time marks they are a
  backstop: at most that many samples between two evaluations, counted from the last one
  (where the time marks are far apart, late in a long cap). Alone (a cadence the user chose)
  they are a fixed grid, the same for every batch size. Evaluations are not free: on a small
  task they held a quarter of a search's device time when quarter-epoch marks ran beside the
  time marks and near-target marks piled up (two evaluations a few steps apart);
- heartbeats (:func:`heartbeat_for`): a report of the training time without an evaluation, so
  the capping scheduler can stop a trial whose next mark is far off (it acts only on a report).

A :class:`Cadence` only says what is due; the reporter reads the clock and reports
(:mod:`raybatch.trial.reporting`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raybatch.space.search_space import SearchSpace

HEARTBEATS = 32
"""Reports between marks per time cap, at least: a trial capped at ``slack x`` the incumbent is
stopped within ``max_time_s / 32`` of training past its cap (1.9 s at the CLI's 60 s)..."""
HEARTBEAT_MAX_S = 5.0
"""...and within 5 s whatever the cap: a cap of hours must not let a trial run minutes past a
cap of seconds. A report every 5 s costs one device sync and one Tune result."""


TIME_MARK_RATIO = 3**0.5
"""Training-time marks are this far apart (a factor): two between rungs a factor 3 apart, so
each rung is judged within ``sqrt(3)`` x its time (:mod:`raybatch.tuning.rungs`)."""
NEAR_MARK_RATIO = 1.15
"""Near the target the time marks are this far apart (a factor): a time to target is read at
the first evaluation past the crossing, so marks ``sqrt(3)`` apart overstated it by up to 73 %
(the real benchmark's times sat on the marks); near the target the whole validation set is read
(:mod:`raybatch.trial.validation`), and each evaluation there sets the next at most 15 % later."""
TIME_MARKS_BELOW_CAP = 10
"""The first time mark is the cap / ``sqrt(3)^10`` (= cap / 243): below the lowest rung before
any trial has reached (the cap / 81), and below B/9 wherever B lies above the cap / 27."""


EVALS_PER_EPOCH = 4
"""Sample marks per epoch where they are a trial's only marks (a data-parallel trial's: its
workers agree on sample counts, not on a host clock; a cadence the user chose is kept)."""
BACKSTOP_EVALS_PER_EPOCH = 1
"""Beside the training-time marks, sample marks are a backstop: an evaluation at least once an
epoch (:class:`Cadence`). Quarter epochs there doubled a small task's
evaluations for no rung's sake (a digits CNN: 32 evaluations, half its training time)."""


def default_eval_every(train_size: int, space: SearchSpace, per_epoch: int = EVALS_PER_EPOCH
                       ) -> int:  # fmt: skip
    """About ``1/per_epoch`` of an epoch, rounded up to a multiple of the largest effective
    batch."""
    share = max(train_size // per_epoch, 1)
    largest = space.max_effective_batch_size()
    return math.ceil(share / largest) * largest


def time_marks(max_time_s: float) -> list[float]:
    """Evaluation marks on training time, geometric up to the time cap: the equal-time rungs
    (:mod:`raybatch.tuning.rungs`) need an evaluation near each, whatever the batch size, where a
    sample mark (an epoch apart) may come only after the first rungs have passed. From the cap
    / ``sqrt(3)`` on they are :data:`NEAR_MARK_RATIO` apart, as near the target: there each
    evaluation decides whether the trial reaches before its cap, and an epoch can be longer
    than the 42 % of the cap left (a trial that crossed the target there was censored)."""
    marks = [max_time_s / TIME_MARK_RATIO**k for k in range(TIME_MARKS_BELOW_CAP, 0, -1)]
    while marks[-1] * NEAR_MARK_RATIO < max_time_s:
        marks.append(marks[-1] * NEAR_MARK_RATIO)
    return marks


def rung_grid(max_time_s: float) -> list[float]:
    """Every other time mark below the cap (the cap / 3, / 9, ... / 243): where a capping
    scheduler's rungs below ``B`` sit (:func:`~raybatch.tuning.rungs.grid_rungs`, anchored at the
    cap / 3), and so where it may pause the trial."""
    return time_marks(max_time_s)[:TIME_MARKS_BELOW_CAP][::2]


def heartbeat_for(max_time_s: float) -> float:
    """The longest a trial trains between two reports (:data:`HEARTBEATS`,
    :data:`HEARTBEAT_MAX_S`)."""
    return min(max_time_s / HEARTBEATS, HEARTBEAT_MAX_S)


class Cadence:
    """The marks of one trial: when an evaluation is due, and when a heartbeat is.

    Args:
        eval_every_samples: An evaluation is due each time this many more samples are seen:
            on a fixed grid without time marks, since the last evaluation with them.
        max_time_s: The trial's time cap, which sets the default ``heartbeat_s``.
        heartbeat_s: Between marks, report at least once per this many seconds of training
            (default: :func:`heartbeat_for` ``max_time_s``).
        eval_at_s: Training times at which an evaluation is also due (:func:`time_marks`);
            with none, the user's cadence is kept as given, near the target too.
    """

    def __init__(
        self,
        eval_every_samples: int,
        max_time_s: float,
        heartbeat_s: float | None = None,
        eval_at_s: Sequence[float] = (),
    ) -> None:
        self.eval_every_samples = eval_every_samples
        self.next_mark = eval_every_samples
        self.last_mark = 0
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else heartbeat_for(max_time_s)
        self.eval_at_s = sorted(float(t) for t in eval_at_s)
        self.time_mark_due = False
        self.reported_train_s = 0.0
        self._near_ratio: float | None = None  # set once near the target (:meth:`near_target`)
        self._timed = bool(self.eval_at_s)  # evaluations on training time, not the user's

    def near_target(self, ratio: float = NEAR_MARK_RATIO) -> None:
        """From the next evaluation on, each sets the next at most ``ratio`` x its training
        time later; only where there are time marks (a cadence the user chose is kept)."""
        if self._timed:
            self._near_ratio = ratio

    def due(self, samples_seen: int) -> bool:
        """A sample mark, or a training-time mark, has been passed since the last evaluation."""
        return samples_seen >= self.next_mark or self.time_mark_due

    def time_mark_passed(self, train_s: float) -> bool:
        """Whether ``train_s`` has reached the next time mark; if so, an evaluation is due."""
        passed = bool(self.eval_at_s) and train_s >= self.eval_at_s[0]
        self.time_mark_due = self.time_mark_due or passed
        return passed

    def heartbeat_due(self, train_s: float) -> bool:
        """Whether ``heartbeat_s`` of training have passed since the last report."""
        return train_s - self.reported_train_s >= self.heartbeat_s

    def passed(self, samples_seen: int) -> None:
        """An evaluation at ``samples_seen``: none is owed. On a grid (no time marks) the sample
        marks move past it; as a backstop the next comes ``eval_every_samples`` after it."""
        if self._timed:
            self.last_mark = samples_seen
            self.next_mark = samples_seen + self.eval_every_samples
        while self.next_mark <= samples_seen:
            self.last_mark = self.next_mark
            self.next_mark += self.eval_every_samples
        self.time_mark_due = False

    def trained(self, train_s: float) -> None:
        """An evaluation at ``train_s`` of training: the time marks it passed are dropped (not
        owed). Near the target the next is ``ratio`` x ``train_s``, the only time mark left:
        each evaluation sets it afresh, so the one an earlier evaluation set, and a time mark
        between, would only add an evaluation a few steps after this one."""
        self.eval_at_s = [t for t in self.eval_at_s if t > train_s]
        if self._near_ratio is not None and train_s > 0:
            self.eval_at_s = [train_s * self._near_ratio]

    def reported(self, train_s: float) -> None:
        """A report carried ``train_s``: the next heartbeat is due ``heartbeat_s`` after it."""
        self.reported_train_s = train_s


__all__ = [
    "BACKSTOP_EVALS_PER_EPOCH",
    "EVALS_PER_EPOCH",
    "HEARTBEATS",
    "HEARTBEAT_MAX_S",
    "NEAR_MARK_RATIO",
    "TIME_MARKS_BELOW_CAP",
    "TIME_MARK_RATIO",
    "Cadence",
    "default_eval_every",
    "heartbeat_for",
    "rung_grid",
    "time_marks",
]
