"""The search's plan before TPE takes over: the largest batch at a sweep of LRs and the
reference recipe, then a ladder of other batches at the LR that worked best.

Every search starts from the strong simple baseline a user would otherwise run -- the largest
batch that fits, at its best of a few LRs -- and from the published recipe, so every search
shows how its optimum compares with both, and cannot lose to the baseline for want of trying
it. The second stage (:class:`Ladder`) carries the best LR to the batches the time model
(:mod:`raybatch.timemodel.model`) predicts fastest.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from raybatch import keys
from raybatch.errors import RaybatchError
from raybatch.keys import KnobPoint
from raybatch.memory.sizes import format_bytes
from raybatch.space.config import TrialConfig
from raybatch.space.search_space import SearchSpace


def searched_knobs(space: SearchSpace, knobs: KnobPoint) -> KnobPoint:
    """Only the knobs Optuna samples (single-choice knobs are constants, not parameters)."""
    s = space.search
    out = KnobPoint()
    if len(s.micro_batch_size) > 1:
        out["micro_batch_size"] = knobs["micro_batch_size"]
    if len(s.accumulation_steps) > 1:
        out["accumulation_steps"] = knobs["accumulation_steps"]
    if len(s.world_size) > 1:
        out["world_size"] = knobs["world_size"]
    lr, wd = s.lr_multiplier, s.weight_decay_multiplier
    if lr is not None and lr.low < lr.high:
        out["lr_multiplier"] = min(max(knobs.get("lr_multiplier", 1.0), lr.low), lr.high)
    if wd is not None and wd.low < wd.high:
        multiplier = knobs.get("weight_decay_multiplier", 1.0)
        out["weight_decay_multiplier"] = min(max(multiplier, wd.low), wd.high)
    return out


def reference_point(space: SearchSpace) -> KnobPoint | None:
    """The reference recipe as raw knobs of the space (micro x accumulation = its batch)."""
    s = space.search
    batch = space.reference.batch_size
    for micro in sorted(s.micro_batch_size, reverse=True):
        if batch % micro == 0 and batch // micro in s.accumulation_steps and 1 in s.world_size:
            return KnobPoint(micro_batch_size=micro, accumulation_steps=batch // micro,
                             world_size=1)  # fmt: skip
    return None


def budget_check(
    estimator: Any, budget: int | None, margin: float = 0.0
) -> Callable[[TrialConfig], bool]:
    """Whether a recipe's predicted peak fits the budget (everything fits without one);
    with ``margin``, also one predicted over it by at most that fraction (for a real probe
    to decide: the ``probe_margin`` of :class:`raybatch.tuning.gates.MemoryFits`)."""

    def fits(recipe: TrialConfig) -> bool:
        if estimator is None or budget is None:
            return True
        return bool(estimator.fits(recipe, budget, margin))

    return fits


def max_batch_point(space: SearchSpace, fits: Callable[[TrialConfig], bool]) -> KnobPoint:
    """The "largest batch that fits" baseline: biggest fitting micro batch, accumulation 1."""
    s = space.search
    world = 1 if 1 in s.world_size else min(s.world_size)
    accumulation = 1 if 1 in s.accumulation_steps else min(s.accumulation_steps)
    for micro in sorted(s.micro_batch_size, reverse=True):
        knobs = KnobPoint(micro_batch_size=micro, accumulation_steps=accumulation,
                          world_size=world)  # fmt: skip
        if fits(space.derive(micro, accumulation, world)):
            return knobs
    return KnobPoint(micro_batch_size=min(s.micro_batch_size), accumulation_steps=accumulation,
                     world_size=world)  # fmt: skip


def nothing_fits(
    space: SearchSpace, estimator: Any, budget: int, margin: float = 0.0
) -> str | None:
    """Why not even the space's smallest micro batch fits the budget (``None``: it fits), said
    before any trial: the searcher would otherwise reject every suggestion until it gave up."""
    smallest = max_batch_point(space, lambda _: False)  # none fits: the smallest micro batch
    recipe = space.derive(**smallest)
    measured = estimator.measured(recipe, budget)
    if measured is not None:  # real steps on the device said it
        return None if measured.fits else f"no micro batch fits: {measured.reason}"
    predicted = int(estimator.predict(recipe))
    if predicted <= budget * (1 + margin):
        return None
    return (
        f"no micro batch fits {format_bytes(budget)}: the smallest"
        f" ({smallest[keys.MICRO_BATCH_SIZE]}) needs {format_bytes(predicted)}"
    )


LR_SWEEP = (1.0, 2.0, 4.0, 0.5)
"""The LR multipliers the largest batch is tried at first, in this order: the rule's own LR
(the comparison baseline), then upwards (on our real tasks the largest batch's best LR was 2x
and 4x the rule's), then below. The strong simple baseline -- the largest batch at its best of
four LRs -- is thereby part of every search's plan, charged like any trial."""


def lr_sweep(space: SearchSpace) -> list[float]:
    """:data:`LR_SWEEP` within the space's LR range (clamped, duplicates dropped)."""
    rng = space.search.lr_multiplier
    if rng is None or rng.low >= rng.high:
        return [1.0 if rng is None else rng.low]
    out: list[float] = []
    for m in LR_SWEEP:
        clamped = min(max(m, rng.low), rng.high)
        if clamped not in out:
            out.append(clamped)
    return out


def opening_points(
    space: SearchSpace, baseline: KnobPoint, reference: KnobPoint | None
) -> list[KnobPoint]:
    """What every search runs first, as the searched knobs Optuna is given: the largest batch at
    the rule's LR and at twice it, the reference recipe, then the largest batch at the sweep's
    other LRs (:func:`lr_sweep`).

    The first two trials run with no incumbent to cap them (only a trial three times behind the
    other is stopped), so they are the two bets least alike in LR: where the rule's LR is too
    low, the other reaches early and caps the rest. The reference comes third, ahead of the
    rest of the sweep: a recipe known to train well, it is the likeliest to give an incumbent
    soon if neither did. Run last, it left the whole sweep uncapped: on a task where the
    largest batch never reached the target, four trials ran to the time cap. Run second, beside
    the largest batch at a rule's LR too low, both crawled uncapped (the simulated family's
    ``rule_lr_too_low``: 6x the compute)."""
    sweep: list[KnobPoint] = [{**baseline, "lr_multiplier": m} for m in lr_sweep(space)]
    points = [*sweep[:2], *([reference] if reference is not None else []), *sweep[2:]]
    out: list[KnobPoint] = []
    for p in points:
        knobs = searched_knobs(space, p)
        if knobs not in out:
            out.append(knobs)
    return out


def _distance(recipe: TrialConfig, goal: float) -> tuple[float, int]:
    """How far a recipe's effective batch is from ``goal`` (log scale); larger micro first."""
    return abs(math.log(recipe.effective_batch_size / goal)), -recipe.micro_batch_size


class Ladder:
    """The search's second stage: other effective batches at the LR the first stage found best.

    Once the largest batch has been tried at each LR of the sweep, its best multiplier ``m``
    is carried to the recipes the time model predicts fastest -- or, without a model, to a
    geometric ladder of effective batches a quarter and a sixteenth of the largest -- each at
    two LRs (:meth:`points`): the rule's carry of ``m`` and the largest batch's own absolute LR.

    Args:
        space: The coupled space.
        estimator: The memory estimator (``None``: every recipe fits).
        budget_bytes: The per-GPU budget the recipes must fit.
        model: Predicts a recipe's relative time to target
            (:class:`~raybatch.timemodel.model.TimeModel`);
            ``None``: the geometric ladder, unless one is measured.
        size: Recipes on the ladder (each at two LRs, see :meth:`points`).
        measure: Have the search measure the model inside its first trial that reaches the
            target (:class:`~raybatch.tuning.searcher.RaybatchSearcher` asks every trial it
            launches until one has); ``False``: the model given, or the geometric ladder.
    """

    def __init__(
        self,
        space: SearchSpace,
        estimator: Any = None,
        budget_bytes: int | None = None,
        model: Any = None,
        size: int = 2,
        measure: bool = False,
    ) -> None:
        self.space = space
        self.measure = measure
        self.estimator = estimator
        self.budget_bytes = budget_bytes
        self.model = model
        self.size = size

    def fits(self, recipe: TrialConfig) -> bool:
        return budget_check(self.estimator, self.budget_bytes)(recipe)

    def recipes(self, baseline: KnobPoint) -> list[TrialConfig]:
        """The ladder's recipes at the rule's LR, best first, one per effective batch, none at
        the ``baseline``'s (the largest batch, already swept)."""
        s = self.space.search
        top = self.space.derive_from({**baseline, keys.LR_MULTIPLIER: 1.0})
        grid = []
        for micro in s.micro_batch_size:
            for accumulation in s.accumulation_steps:
                for world in s.world_size:
                    try:
                        recipe = self.space.derive(micro, accumulation, world)
                    except RaybatchError:  # outside the space's limits
                        continue
                    if recipe.effective_batch_size != top.effective_batch_size and self.fits(
                        recipe
                    ):
                        grid.append(recipe)
        if self.model is not None:
            ranked = sorted(grid, key=self.model.predicted_time)
        else:
            goals = [top.effective_batch_size / 4**i for i in range(1, self.size + 1)]
            ranked = [min(grid, key=functools.partial(_distance, goal=g)) for g in goals if grid]
        out: list[TrialConfig] = []
        for r in ranked:
            if all(o.effective_batch_size != r.effective_batch_size for o in out):
                out.append(r)
            if len(out) == self.size:
                break
        return out

    def points(self, multiplier: float, baseline: KnobPoint) -> list[KnobPoint]:
        """The second stage's searched knobs: each ladder batch bracketed by two LRs.

        The best LR of a smaller batch lies between two carries of the largest batch's best
        (``multiplier``): the space's rule (the LR shrinks with the batch, linearly or by its
        square root) and a constant LR (the same absolute LR as the largest batch's best, which
        the rule would call ``multiplier x`` the rule's scale ratio). On real tasks the optimum
        sat on either side (digits: 128 at 4x the linear rule, i.e. the largest batch's LR), so
        both ends are run. Where the two coincide (the rule is ``none``), the first batch is
        bracketed at ``2 x`` and ``/ 2`` instead.
        """
        rng = self.space.search.lr_multiplier
        low, high = (rng.low, rng.high) if rng is not None else (1.0, 1.0)
        recipes = self.recipes(baseline)
        top_lr = self.space.derive_from({**baseline, keys.LR_MULTIPLIER: multiplier}).lr
        chosen: list[tuple[TrialConfig, float]] = []
        for r in recipes:
            chosen.append((r, multiplier))
            constant = top_lr / r.lr if r.lr > 0 else multiplier  # r at the rule's own LR
            if not math.isclose(constant, multiplier, rel_tol=0.05):
                chosen.append((r, constant))
        if recipes and len(chosen) == len(recipes):  # no rule: bracket the first batch's LR
            chosen += [(recipes[0], multiplier * 2), (recipes[0], multiplier / 2)]
        out: list[KnobPoint] = []
        for r, m in chosen:
            knobs = KnobPoint(micro_batch_size=r.micro_batch_size,
                              accumulation_steps=r.accumulation_steps, world_size=r.world_size,
                              lr_multiplier=min(max(m, low), high))  # fmt: skip
            point = searched_knobs(self.space, knobs)
            if point not in out:
                out.append(point)
        return out
