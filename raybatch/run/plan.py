"""The searcher's plan: the opening, the time model measured in a trial, then the ladder.

:class:`Plan` is the part of :class:`raybatch.run.searcher.RaybatchSearcher` that decides what
runs before TPE takes over, kept apart from the pre-screen, placement and Optuna's bookkeeping:

1. **the opening** (:func:`raybatch.run.seeding.opening_points`): the largest batch that fits at
   a sweep of LRs, and the reference recipe, enqueued in the study; an opening point that runs
   out of memory for real is replaced by the next smaller micro batch, so that the largest
   batch that *really* fits is swept;
2. **the time model** (:mod:`raybatch.timemodel.model`), measured inside the search's first trial
   that reaches the target (:mod:`raybatch.timemodel.measure`): one trial at a time is asked;
3. **the ladder** (:class:`raybatch.run.seeding.Ladder`), queued once every opening point has
   ended: the LR multiplier that was fastest at the largest batch, carried to the batches the
   model predicts fastest (a geometric ladder without one).

Where it keeps its state: the baseline as found and whether the ladder is queued live in the
study (they survive a resume through it); the rest is in the searcher's Tune checkpoint
(:data:`CHECKPOINTED`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from raybatch import keys
from raybatch.keys import KnobPoint, knob_items
from raybatch.run.seeding import Ladder
from raybatch.run.study import SearchStudy
from raybatch.space.config import TrialConfig
from raybatch.space.search_space import SearchSpace
from raybatch.timemodel.model import TimeModel

if TYPE_CHECKING:
    import optuna

CHECKPOINTED = (
    "opening", "opening_number", "opening_time", "sweep", "time_model", "time_model_problem",
)  # fmt: skip
"""The plan's attributes kept in the searcher's Tune checkpoint."""


class Plan:
    """What runs before TPE: the opening points, then the ladder ranked by a measured model.

    The searcher that runs it gives it the search's study (:meth:`attach`), where its points
    are queued (the opening once, while the study is new) and what it found survives a resume.

    Args:
        space: The coupled space.
        opening: The opening points' searched knobs, in order.
        ladder: The second stage (``None``: TPE goes on alone after the opening).
        baseline: The largest batch's integer knobs, all of them (a knob with one choice is not
            among the searched ones); default: read from the first opening point.
    """

    def __init__(
        self,
        space: SearchSpace,
        opening: Sequence[KnobPoint] = (),
        ladder: Ladder | None = None,
        baseline: KnobPoint | None = None,
    ) -> None:
        self.space = space
        self._record: SearchStudy | None = None  # the searcher's, given by attach()
        self.ladder = ladder
        self.opening = [p.copy() for p in opening]
        self._to_queue = [p.copy() for p in opening]  # queued in the study once, when it is new
        self._baseline = baseline.copy() if baseline is not None else None
        self.sweep: set[int] | None = None
        self.opening_number: dict[int, int] = {}  # Optuna trial number -> opening index
        self.opening_time: dict[int, float | None] = {}  # opening index -> time to target
        self.time_model: dict[str, Any] | None = None
        """The time model a trial measured at the target (:meth:`TimeModel.to_dict`, with the
        ``trial_id`` that measured it), once one has."""
        self.time_model_problem: str | None = None  # why the asked trial could not measure it
        self.measuring: str | None = None  # the Tune trial asked to measure it, while it runs

    @property
    def record(self) -> SearchStudy:
        """The searcher's study, where the plan queues its points.

        Raises:
            RuntimeError: The plan is not part of a searcher yet (a programming error).
        """
        if self._record is None:
            raise RuntimeError("a Plan runs inside a RaybatchSearcher, which attaches its study")
        return self._record

    def attach(self, record: SearchStudy) -> None:
        """Run in ``record``, the searcher's study."""
        self._record = record

    def queue_opening(self) -> None:
        """Queue the opening points in the study, once, while it has no trial."""
        if self._to_queue:
            self.record.enqueue_if_new(self._to_queue)
            self._to_queue = []

    def state(self) -> dict[str, Any]:
        """What the searcher's checkpoint keeps (:data:`CHECKPOINTED`)."""
        self.sweep_indices()
        return {name: getattr(self, name) for name in CHECKPOINTED}

    def restore(self, state: dict[str, Any]) -> None:
        for name in CHECKPOINTED:
            setattr(self, name, state[name])
        self.measuring = None  # a trial asked before the interruption is asked again
        self._to_queue = []  # the study has them since the first suggestion

    # ------------------------------------------------------------------ the time model

    def wants_time_model(self, recipe: TrialConfig) -> bool:
        """Whether a trial launched now is asked to measure the time model at the target: one
        trial at a time, until one has, while the ladder still needs it; never a data-parallel
        one (its model lives in its workers)."""
        ladder = self.ladder
        return (
            ladder is not None and ladder.measure and ladder.model is None
            and self.time_model is None and self.measuring is None
            and recipe.world_size == 1 and not self.record.ladder_queued()
        )  # fmt: skip

    def ended(self, trial_id: str, result: dict[str, Any]) -> None:
        """A Tune trial ended: the one asked to measure the model brings it back (or why not).
        So does one asked before an interruption and run again by Tune after the resume."""
        if trial_id == self.measuring:
            self.measuring = None
        text = result.get(keys.TIME_MODEL)
        if text and self.time_model is None:
            self.time_model = {**json.loads(text), keys.TRIAL_ID: trial_id}
        elif result.get(keys.TIME_MODEL_ERROR):
            self.time_model_problem = str(result[keys.TIME_MODEL_ERROR])

    # ------------------------------------------------------------------ the opening

    def note_opening(self, ot_trial: optuna.Trial) -> None:
        """Remember which opening point an asked trial runs (enqueued params come back as
        given)."""
        for i, point in enumerate(self.opening):
            if i in self.opening_time or i in self.opening_number.values():
                continue
            if all(ot_trial.params.get(k) == v for k, v in point.items()):
                self.opening_number[ot_trial.number] = i
                return

    def queue_ladder(self) -> None:
        """Queue the ladder once every opening point has finished (once: the study remembers
        it across a resume). Until then a free slot gets TPE's suggestion rather than idling:
        on a cluster the last opening trial may run long while other GPUs wait."""
        if self.ladder is None or self.record.ladder_queued():
            return
        done = len(self.opening_time) >= len(self.opening)
        if done or (not self.opening_number and not self.record.queued()):
            # Every opening point has ended, or none is running or waiting any more (one was
            # lost at an interruption): the ladder goes on with what is known.
            if self.time_model is not None and self.ladder.model is None:
                self.ladder.model = TimeModel.from_dict(self.time_model)
            self.record.queue_ladder(self.ladder.points(self.best_multiplier(), self.baseline))

    @property
    def baseline(self) -> KnobPoint:
        """The largest batch that fits (its integer knobs): the opening's first point, or the
        smaller one that replaced it after it ran out of memory."""
        stored = self.record.baseline()
        if stored is not None:
            merged: KnobPoint = {**(self._baseline or KnobPoint()), **stored}
            return merged
        if self._baseline is not None:
            return self._baseline.copy()
        first = self.opening[0] if self.opening else KnobPoint()
        return cast(KnobPoint, {k: v for k, v in first.items() if k in keys.RAW_KNOBS[:3]})

    def sweep_indices(self) -> set[int]:
        """The opening's indices of the largest batch's LR sweep (fixed when first asked, so a
        point replaced by a smaller batch stays one of them)."""
        if self.sweep is None:
            self.sweep = {i for i, p in enumerate(self.opening) if self.at_baseline(p)}
        return self.sweep

    def at_baseline(self, point: KnobPoint) -> bool:
        """Whether an opening point runs the largest batch. A knob the point leaves out is one
        the space does not search (a single choice, e.g. ``world_size`` [1]): it is the
        baseline's by construction, so only the knobs the point names are compared."""
        named = dict(knob_items(point))
        return all(named.get(k, v) == v for k, v in knob_items(self.baseline))

    def best_multiplier(self) -> float:
        """The LR multiplier that reached the target fastest at the largest batch (1.0 when
        none did)."""
        times = [
            (t, self.opening[i].get(keys.LR_MULTIPLIER, 1.0))
            for i, t in self.opening_time.items()
            if t is not None and self.at_baseline(self.opening[i])
        ]
        return min(times)[1] if times else 1.0

    def opening_done(self, number: int, time_to_target: float | None, memory: bool) -> None:
        """An opening trial ended; one that did not fit is replaced by a smaller micro batch."""
        i = self.opening_number.pop(number, None)
        if i is None:
            return
        # Only the largest batch's sweep follows the batch down (the reference is a recipe of
        # its own), and only to a point not already planned or run (Optuna would not queue it
        # twice, and the ladder would wait for it forever).
        at_baseline = i in self.sweep_indices()
        smaller = self._smaller(self.opening[i]) if memory and at_baseline else None
        if smaller is None or smaller in self.opening or self.record.has_run(smaller):
            self.opening_time[i] = time_to_target
            return
        self.record.set_baseline({**self.baseline, keys.MICRO_BATCH_SIZE: smaller[
            keys.MICRO_BATCH_SIZE]})  # fmt: skip
        self.opening = [*self.opening[:i], smaller, *self.opening[i + 1 :]]
        self.record.study.enqueue_trial(dict(smaller))

    def _smaller(self, point: KnobPoint) -> KnobPoint | None:
        micro = point.get(keys.MICRO_BATCH_SIZE)
        below = [m for m in self.space.search.micro_batch_size if micro is not None and m < micro]
        return {**point, keys.MICRO_BATCH_SIZE: max(below)} if below else None


__all__ = ["CHECKPOINTED", "Plan"]
