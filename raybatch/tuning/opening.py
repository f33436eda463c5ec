"""The plan's opening: the largest batch that fits at a sweep of LRs, and the reference recipe.

Enqueued in the search's study once, while it is new, so they run before TPE
(:func:`raybatch.tuning.seeding.opening_points` chooses them). An opening point that runs out of
memory for real is replaced by the next smaller micro batch (only the largest batch's sweep
follows the batch down: the reference is a recipe of its own), so that the largest batch that
*really* fits is swept; the smaller baseline is kept in the study, where it survives a resume.
What the opening measured (the fastest LR multiplier at the largest batch) is what the plan's
ladder carries to other batches (:mod:`raybatch.tuning.plan`): the fastest to reach the target;
where none of the sweep has reached when the ladder is queued, the leader's (the first the
scheduler resumed), else the one ahead at equal training time (each sweep point's curve is
kept, as the scheduler keeps it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from raybatch import keys
from raybatch.keys import KnobPoint, knob_items
from raybatch.space.search_space import SearchSpace
from raybatch.tuning.rungs import DEFAULT_ETA, Trajectory
from raybatch.tuning.study import SearchStudy

if TYPE_CHECKING:
    import optuna


class Opening:
    """The opening points, which Optuna trial runs which, and how each ended.

    Args:
        space: The coupled space (its micro batches, to step down after an OOM).
        points: The opening points' searched knobs, in order.
        baseline: The largest batch's integer knobs, all of them (a knob with one choice is not
            among the searched ones); default: read from the first point.
        mode: The target's direction (``max`` or ``min``), to read the sweep's curves.
        horizon_s: The guess of the optimum's time to target before any trial reached (the
            time cap / eta, as the scheduler's rungs take it; ``None``: none, and the opening
            waits for a reach or for no sweep point to run). The wait for a reach ends at the
            rung under it (:meth:`settled`).
    """

    horizon_s: float | None = None  # an Opening pickled before it was kept: no guess

    def __init__(
        self, space: SearchSpace, points: Sequence[KnobPoint], baseline: KnobPoint | None,
        mode: str = "max", horizon_s: float | None = None,
    ) -> None:  # fmt: skip
        self.space = space
        self.points = [p.copy() for p in points]
        self._to_queue = [p.copy() for p in points]  # queued in the study once, when it is new
        self._baseline = baseline.copy() if baseline is not None else None
        self.sweep: set[int] | None = None
        self.numbers: dict[int, int] = {}  # Optuna trial number -> opening index
        self.times: dict[int, float | None] = {}  # opening index -> time to target
        self.record: SearchStudy | None = None  # the searcher's study, given by its plan
        self.leader: int | None = None
        """The sweep point that first went on from a pause before any point reached: the one
        the scheduler found furthest, whose LR the ladder carries if none of the sweep has
        reached when it is queued."""
        self.mode = mode
        self.curves: dict[int, Trajectory] = {}  # sweep index -> its curve on training time
        self.horizon_s = horizon_s

    def _study(self) -> SearchStudy:
        if self.record is None:
            raise RuntimeError("an Opening runs inside a Plan, which attaches its study")
        return self.record

    def queue(self) -> None:
        """Queue the points in the study, once, while it has no trial."""
        if self._to_queue:
            self._study().enqueue_if_new(self._to_queue)
            self._to_queue = []

    def note(self, ot_trial: optuna.Trial) -> None:
        """Remember which point an asked trial runs (enqueued params come back as given)."""
        for i, point in enumerate(self.points):
            if i in self.times or i in self.numbers.values():
                continue
            if all(ot_trial.params.get(k) == v for k, v in point.items()):
                self.numbers[ot_trial.number] = i
                return

    @property
    def finished(self) -> bool:
        """Every point has ended."""
        return len(self.times) >= len(self.points)

    @property
    def reached(self) -> bool:
        """Some point has reached the target: the search's first ``B`` and time model."""
        return any(t is not None for t in self.times.values())

    def evaluated(self, number: int, train_s: float, metric: float) -> None:
        """Optuna trial ``number`` evaluated ``metric`` at ``train_s`` seconds of training: a
        point of its curve where it runs one of the largest batch's sweep."""
        i = self.numbers.get(number)
        if i is not None and i in self.sweep_indices():
            self.curves.setdefault(i, Trajectory(self.mode)).add(train_s, metric)

    def settled(self, running: set[int]) -> bool:
        """Whether the ladder has what it needs from the opening, the LR it carries, chosen at
        equal time. Once some point reached the target (``B``, and the time model, measured
        near it): every sweep point still running (Optuna trials ``running``) has trained as
        long as the sweep's curves are compared at (:meth:`ahead`). Before: short of the rung
        under the guess of ``B`` (:attr:`horizon_s` / eta), every sweep point paused or ended at
        a rung, two curves or more compared there; once a point trained that long without
        reaching, every sweep point evaluated or ended and each still running as long as the
        curves are compared at: no reach is waited for, and the ladder runs geometric where no
        model was measured by then (:class:`~raybatch.tuning.seeding.Ladder`). With two slots a
        sweep point always runs while the ladder is withheld (the scheduler resumes the leader
        into the free slot), so the wait lasts until a leader gets that far. Waiting to the
        guess itself, the sweep's leaders leapfrogged to it: in a real friedman search, whose
        optimum reaches in two thirds of the guess, the largest batch trained 4.3 trainings of
        the optimum before the ladder began. On a digits CNN the largest batch
        reaches at no LR in the cap: with no end to the wait but a reach, each sweep point in
        turn trained to its cap (4 caps, 60 of a search's 107 training seconds)."""
        at = self._compared_at()
        sweep = self.sweep_indices()
        ends = {i: c.times[-1] for i, c in self.curves.items() if c.times}
        going = [self.numbers[n] for n in running if self.numbers.get(n) in sweep]
        if not self.reached:
            if self.horizon_s is None or max(ends.values(), default=0.0) < self.settle_s():
                return at is not None and not going  # each paused or ended at a rung
            if not all(i in self.times or i in ends for i in sweep):
                return False  # a sweep point not yet evaluated nor ended: not compared at all
        # At None: one curve only (past the guess, the others ended before an evaluation).
        return at is None or all(ends.get(i, 0.0) >= at for i in going)

    def settle_s(self) -> float:
        """The training time past which the wait for a sweep point to reach ends: the rung
        under the guess of ``B``."""
        assert self.horizon_s is not None
        return self.horizon_s / DEFAULT_ETA

    def _compared_at(self) -> float | None:
        """The longest training time two sweep curves or more have got to."""
        ends = sorted((c.times[-1] for c in self.curves.values() if c.times), reverse=True)
        return ends[1] if len(ends) >= 2 else None

    def resumed(self, number: int) -> None:
        """Optuna trial ``number`` went on from a pause; the first sweep point to, before any
        point reached, is the :attr:`leader`."""
        i = self.numbers.get(number)
        if self.leader is None and i is not None and not self.reached and (
                i in self.sweep_indices()):  # fmt: skip
            self.leader = i

    @property
    def baseline(self) -> KnobPoint:
        """The largest batch that fits (its integer knobs): the first point, or the smaller one
        that replaced it after it ran out of memory."""
        stored = self._study().baseline()
        if stored is not None:
            merged: KnobPoint = {**(self._baseline or KnobPoint()), **stored}
            return merged
        if self._baseline is not None:
            return self._baseline.copy()
        first = self.points[0] if self.points else KnobPoint()
        return cast(KnobPoint, {k: v for k, v in first.items() if k in keys.RAW_KNOBS[:3]})

    def sweep_indices(self) -> set[int]:
        """The indices of the largest batch's LR sweep (fixed when first asked, so a point
        replaced by a smaller batch stays one of them)."""
        if self.sweep is None:
            self.sweep = {i for i, p in enumerate(self.points) if self.at_baseline(p)}
        return self.sweep

    def at_baseline(self, point: KnobPoint) -> bool:
        """Whether a point runs the largest batch. A knob the point leaves out is one the space
        does not search (a single choice, e.g. ``world_size`` [1]): it is the baseline's by
        construction, so only the knobs the point names are compared."""
        named = dict(knob_items(point))
        return all(named.get(k, v) == v for k, v in knob_items(self.baseline))

    def best_multiplier(self) -> float:
        """The LR multiplier that reached the target fastest at the largest batch; where none
        did, the :attr:`leader`'s (the furthest when the scheduler chose); else the one ahead
        at equal training time (:meth:`ahead`); else 1.0."""
        times = [
            (t, self.points[i].get(keys.LR_MULTIPLIER, 1.0))
            for i, t in self.times.items()
            if t is not None and self.at_baseline(self.points[i])
        ]
        if times:
            return min(times)[1]
        chosen = self.leader if self.leader is not None else self.ahead()
        if chosen is not None and chosen < len(self.points):
            return float(self.points[chosen].get(keys.LR_MULTIPLIER, 1.0))
        return 1.0

    def ahead(self) -> int | None:
        """The sweep point whose curve is best at the longest training time that two sweep
        curves or more have got to (``None`` where fewer than two have a curve). Compared at
        equal time, as the rungs compare: a point paused early is not behind one that trained
        on for longer."""
        at = self._compared_at()
        if at is None:
            return None
        values = {i: v for i, c in self.curves.items()
                  if (v := c.value_at(at, False)) is not None}  # fmt: skip
        return max(values, key=lambda i: (values[i], -i)) if values else None

    def done(self, number: int, time_to_target: float | None, memory: bool) -> None:
        """Optuna trial ``number`` ended; a point that did not fit (``memory``) is replaced by
        a smaller micro batch."""
        i = self.numbers.pop(number, None)
        if i is None:
            return
        # Only the largest batch's sweep follows the batch down, and only to a point not already
        # planned or run (Optuna would not queue it twice, and the ladder would wait for it
        # forever).
        record = self._study()
        smaller = self._smaller(self.points[i]) if memory and i in self.sweep_indices() else None
        if smaller is None or smaller in self.points or _asked(record.study, smaller):
            self.times[i] = time_to_target
            return
        micro = smaller[keys.MICRO_BATCH_SIZE]
        self.curves.pop(i, None)  # the larger batch's curve is not the replacement's
        record.set_baseline({**self.baseline, keys.MICRO_BATCH_SIZE: micro})
        self.points = [*self.points[:i], smaller, *self.points[i + 1 :]]
        record.study.enqueue_trial(dict(smaller))

    def _smaller(self, point: KnobPoint) -> KnobPoint | None:
        micro = point.get(keys.MICRO_BATCH_SIZE)
        below = [m for m in self.space.search.micro_batch_size if micro is not None and m < micro]
        return {**point, keys.MICRO_BATCH_SIZE: max(below)} if below else None


def _asked(study: optuna.Study, params: KnobPoint) -> bool:
    """Whether a trial with exactly these parameters was asked already."""
    trials = study.get_trials(deepcopy=False)
    return any(all(t.params.get(k) == v for k, v in params.items()) for t in trials if t.params)


__all__ = ["Opening"]
