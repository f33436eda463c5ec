"""The searcher's plan: the opening, the time model measured in a trial, then the ladder.

:class:`Plan` is the part of :class:`raybatch.tuning.searcher.RaybatchSearcher` that decides what
runs before TPE takes over, kept apart from the pre-screen, placement and Optuna's bookkeeping:

1. **the opening** (:class:`raybatch.tuning.opening.Opening`): the largest batch that fits at a
   sweep of LRs, and the reference recipe, enqueued in the study; an opening point that runs
   out of memory for real is replaced by the next smaller micro batch, so that the largest
   batch that *really* fits is swept;
2. **the time model** (:mod:`raybatch.timemodel.model`), measured inside the search's first trial
   that reaches the target (:mod:`raybatch.timemodel.measure`): every trial launched before one
   has is asked;
3. **the ladder** (:class:`raybatch.tuning.seeding.Ladder`), queued once the opening has settled
   (:meth:`Opening.settled`: its sweep compared at equal time): the LR multiplier that was
   fastest at the largest batch, carried to the batches the model predicts fastest (a
   geometric ladder without one).

Where it keeps its state: the baseline as found and whether the ladder is queued live in the
study (they survive a resume through it); the rest is pickled with the searcher in its Tune
checkpoint (:meth:`raybatch.tuning.searcher.RaybatchSearcher.save`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from raybatch import keys
from raybatch.keys import KnobPoint
from raybatch.space.config import TrialConfig
from raybatch.space.search_space import SearchSpace
from raybatch.timemodel.model import MeasuredTimeModel, TimeModel
from raybatch.tuning.opening import Opening
from raybatch.tuning.progress import log
from raybatch.tuning.seeding import (
    Ladder,
    budget_check,
    max_batch_point,
    opening_points,
    reference_point,
)
from raybatch.tuning.study import SearchStudy

if TYPE_CHECKING:
    import optuna


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
        mode: The target's direction (``max`` or ``min``): the opening reads its sweep's curves.
        horizon_s: The guess of ``B`` before any reach (the time cap / eta): the opening
            settles once its leader trained that long without reaching (:class:`Opening`).
    """

    def __init__(
        self,
        space: SearchSpace,
        opening: Sequence[KnobPoint] = (),
        ladder: Ladder | None = None,
        baseline: KnobPoint | None = None,
        mode: str = "max",
        horizon_s: float | None = None,
    ) -> None:
        self._record: SearchStudy | None = None  # the searcher's, given by attach()
        self.opening = Opening(space, opening, baseline, mode, horizon_s)
        self.ladder = ladder
        self.time_model: MeasuredTimeModel | None = None
        """The time model a trial measured at the target, and which trial, once one has."""
        self.time_model_problem: str | None = None  # why the last asked trial to say measured none
        self.said_tpe = False  # the line that TPE suggests from here, once a session
        self.paused: set[int] = set()  # Optuna numbers of the trials the scheduler paused

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
        self._record = self.opening.record = record

    def queue_opening(self) -> None:
        """Queue the opening points in the study, once, while it has no trial."""
        self.opening.queue()

    def asked(self, ot_trial: optuna.Trial) -> None:
        """Optuna trial ``ot_trial`` was asked: the opening notes which point it runs."""
        self.opening.note(ot_trial)

    def told(self, number: int, time_to_target: float | None, memory: bool) -> None:
        """Optuna trial ``number`` ended or was refused: reached in ``time_to_target`` (``None``:
        not), or out of memory (``memory``: the opening steps down a micro batch)."""
        self.opening.done(number, time_to_target, memory)

    # ------------------------------------------------------------------ the time model

    def wants_time_model(self, recipe: TrialConfig) -> bool:
        """Whether a trial launched now is asked to measure the time model at the target: every
        trial, until one has, while the ladder still needs it; never a data-parallel one (its
        model lives in its workers). Not one at a time: the trial asked is often one the
        scheduler stops, while one launched beside it reaches (a real search on a digits CNN
        ran its ladder without a model so). Each asked trial that reaches measures it, in about
        a second of its device time; the first model to come back is the one kept."""
        ladder = self.ladder
        return (
            ladder is not None and ladder.measure and ladder.model is None
            and self.time_model is None and recipe.world_size == 1
            and not self.record.ladder_queued()
        )  # fmt: skip

    def ended(self, trial_id: str, result: dict[str, Any]) -> None:
        """A Tune trial ended: one asked to measure the model brings it back (or why not), the
        first kept. So does one asked before an interruption and run again by Tune after the
        resume."""
        text = result.get(keys.TIME_MODEL)
        if text and self.time_model is None:
            self.time_model = MeasuredTimeModel(TimeModel.from_dict(json.loads(text)), trial_id)
            said = f" (gradient noise scale {self.time_model.model.noise.b_simple:.4g})"
            late = self.record.ladder_queued()  # queued without a model: a geometric one ran
            when = (": the ladder was queued before it (a geometric one); it is kept for the"
                    " record and the predictions" if late else
                    ": the ladder's batches come from it once the opening has ended")  # fmt: skip
            log.info(f"time model measured in trial {trial_id}{said}{when}")
        elif self.time_model is None and result.get(keys.TIME_MODEL_ERROR):
            self.time_model_problem = str(result[keys.TIME_MODEL_ERROR])
            log.info(f"time model not measured in trial {trial_id}: {self.time_model_problem}")

    # ------------------------------------------------------------------ the ladder

    def queue_ladder(self) -> None:
        """Queue the ladder once every opening point has finished, or every one was asked and
        the opening settled while some wait paused (:meth:`Opening.settled`); once: the study
        remembers it across a resume. Until then a free slot with nothing paused gets TPE's
        suggestion rather than idling: on a cluster the last opening trial may run long while
        other GPUs wait."""
        if self.ladder is None or self.record.ladder_queued():
            return
        opening = self.opening
        out = set(opening.numbers) - self.paused  # not ended nor paused
        asked = not self.record.queued()
        if opening.finished or (
            asked and (not out or (opening.settled(out) and bool(self.paused)))
        ):
            # Every opening point has ended; or none is running or waiting any more (one was
            # lost at an interruption, or the scheduler paused it); or the opening settled
            # while others wait paused (B, the fastest LR so far and the time model are known:
            # a paused point goes on later, if its rung passes it): the ladder goes on with
            # what is known.
            if self.time_model is not None and self.ladder.model is None:
                self.ladder.model = self.time_model.model
            points = self.ladder.points(opening.best_multiplier(), opening.baseline)
            self.record.queue_ladder(points)
            how = ("the batches the time model predicts fastest" if self.ladder.model is not None
                   else "a geometric ladder of batches (no time model)")  # fmt: skip
            log.info(f"the opening has ended: the ladder next, {len(points)} recipe(s): {how},"
                     f" each at the largest batch's fastest LR ({opening.best_multiplier():.3g}x)"
                     " carried by the rule and as is")  # fmt: skip

    def awaits_opening(self) -> bool:
        """Whether the ladder waits for the opening to settle: every point has been asked, the
        opening has not settled (:meth:`Opening.settled`: a sweep point runs short of the time
        the sweep's curves are compared at; none reached: short of the rung under the guess of
        ``B``, some sweep point still runs; past it, some sweep point is not yet evaluated, or
        one runs short of the time compared at), and some is running or paused. While it
        waits, a free slot goes to the opening's leader (the scheduler resumes the paused trial
        that got furthest) rather than to a new trial, so that the LR the ladder carries is
        chosen at equal time: the sweep's fastest to reach, else its leader's, else the one
        ahead (:meth:`Opening.best_multiplier`). Without the wait, paused trials go on only
        once nothing new waits, at the search's end: on the simulated family the ladder then
        ran at the LR multiplier 1, and the optimum of ``needs_accumulation`` (64 x 4) was
        never proposed. Past the rung under the guess of ``B`` the wait ends without a reach (its
        cost on that member at two slots is in ``docs/search.md``)."""
        ladder, opening = self.ladder, self.opening
        return (
            ladder is not None and not self.record.ladder_queued() and not opening.finished
            and not opening.settled(set(opening.numbers) - self.paused)
            and not self.record.queued()
        )  # fmt: skip

    def phase(self) -> str:
        """The phase the search is in, as its progress lines name it: ``the opening`` (the
        largest batch's LR sweep and the reference), ``the ladder``, or ``Optuna's TPE``."""
        if self.ladder is not None and not self.record.ladder_queued():
            return "the opening"
        if self.record.queued():
            return "the ladder" if self.record.ladder_queued() else "the opening"
        return "Optuna's TPE"

    def say_tpe(self) -> None:
        """Say, once a session, that Optuna's TPE suggests from now on: the plan's points have
        all been asked (the line that marks the search's last phase)."""
        if self.said_tpe or self.record.queued():
            return
        if self.ladder is not None and not self.record.ladder_queued():
            return  # a free slot during the opening: TPE fills it, the ladder is to come
        self.said_tpe = True
        log.info("the plan's recipes have all been asked: Optuna's TPE suggests from here")


def search_plan(
    space: SearchSpace, estimator: Any, budget: int | None, margin: float = 0.0,
    measure: bool = True, mode: str = "max", horizon_s: float | None = None,
) -> tuple[Plan, KnobPoint, KnobPoint | None]:  # fmt: skip
    """The plan ``raybatch search`` runs, and its baseline and reference: the largest batch
    that fits (the estimate, or real steps where measured, within ``margin`` for the trial's
    probe to decide) at the LR sweep and the reference recipe, then the ladder (its time model
    measured in a trial where ``measure``), for a target in direction ``mode``; ``horizon_s``,
    the scheduler's guess of ``B`` before a reach (:func:`~raybatch.tuning.rungs.guess_of_b`),
    ends the opening's wait for a reach (``None``: it waits). The one way a plan is built: the
    driver and the simulated benchmark both call it."""
    baseline = max_batch_point(space, budget_check(estimator, budget, margin))
    reference = reference_point(space)
    ladder = Ladder(space, estimator, budget, measure=measure)
    plan = Plan(space, opening_points(space, baseline, reference), ladder, baseline, mode,
                horizon_s)  # fmt: skip
    return plan, baseline, reference


__all__ = ["Plan", "search_plan"]
