"""The study's seeds: the reference recipe and the "largest batch that fits" baseline.

Every search starts from these two points, so every search shows how its optimum compares
with what a user would otherwise run: the published recipe, and the largest batch that fits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raybatch import keys
from raybatch.space.config import TrialConfig
from raybatch.space.search_space import SearchSpace


def searched_knobs(space: SearchSpace, knobs: dict[str, Any]) -> dict[str, Any]:
    """Only the knobs Optuna samples (single-choice knobs are constants, not parameters)."""
    s = space.search
    out = {}
    for name, choices in (
        (keys.MICRO_BATCH_SIZE, s.micro_batch_size),
        (keys.ACCUMULATION_STEPS, s.accumulation_steps),
        (keys.WORLD_SIZE, s.world_size),
    ):
        if len(choices) > 1:
            out[name] = knobs[name]
    for name, rng in (
        (keys.LR_MULTIPLIER, s.lr_multiplier),
        (keys.WEIGHT_DECAY_MULTIPLIER, s.weight_decay_multiplier),
    ):
        if rng is not None and rng.low < rng.high:
            out[name] = min(max(knobs.get(name, 1.0), rng.low), rng.high)
    return out


def reference_point(space: SearchSpace) -> dict[str, Any] | None:
    """The reference recipe as raw knobs of the space (micro x accumulation = its batch)."""
    s = space.search
    batch = space.reference.batch_size
    for micro in sorted(s.micro_batch_size, reverse=True):
        if batch % micro == 0 and batch // micro in s.accumulation_steps and 1 in s.world_size:
            return {keys.MICRO_BATCH_SIZE: micro, keys.ACCUMULATION_STEPS: batch // micro,
                    keys.WORLD_SIZE: 1}  # fmt: skip
    return None


def budget_check(estimator: Any, budget: int | None) -> Callable[[TrialConfig], bool]:
    """Whether a recipe's predicted peak fits the budget (everything fits without one)."""

    def fits(recipe: TrialConfig) -> bool:
        return estimator is None or budget is None or estimator.predict(recipe) <= budget

    return fits


def max_batch_point(space: SearchSpace, fits: Callable[[TrialConfig], bool]) -> dict[str, Any]:
    """The "largest batch that fits" baseline: biggest fitting micro batch, accumulation 1."""
    s = space.search
    world = 1 if 1 in s.world_size else min(s.world_size)
    accumulation = 1 if 1 in s.accumulation_steps else min(s.accumulation_steps)
    for micro in sorted(s.micro_batch_size, reverse=True):
        knobs = {keys.MICRO_BATCH_SIZE: micro, keys.ACCUMULATION_STEPS: accumulation,
                 keys.WORLD_SIZE: world}  # fmt: skip
        if fits(space.derive(**knobs)):
            return knobs
    return {keys.MICRO_BATCH_SIZE: min(s.micro_batch_size), keys.ACCUMULATION_STEPS: accumulation,
            keys.WORLD_SIZE: world}  # fmt: skip
