"""The pre-screen's answer for one configuration: fits, does not, or cannot tell."""

from __future__ import annotations

from dataclasses import dataclass

from raybatch.memory.model import EstimateSource
from raybatch.space.config import TrialConfig


@dataclass(frozen=True)
class PrescreenResult:
    """Whether one configuration fits, before it spends GPU time.

    Attributes:
        micro_batch_size: The configuration's micro batch.
        fits: ``True`` / ``False``; ``None`` when nothing could be predicted (trace failed and
            no probe could run): the trial's own probe must decide. Never a silent ``True``.
        predicted_bytes: Predicted (or measured, for a probe) peak bytes.
        breakdown: ``predicted_bytes`` by :class:`Category`, when known.
        budget_bytes: The budget compared against.
        source: ``trace``, ``probe`` or ``calibrated``.
        reason: One line for a person.
    """

    micro_batch_size: int
    fits: bool | None
    predicted_bytes: int | None
    breakdown: dict[str, int] | None
    budget_bytes: int | None
    source: EstimateSource
    reason: str


@dataclass(frozen=True)
class RanOut:
    """A launched trial that ran out of memory although the estimate let it through."""

    trial_id: str
    recipe: TrialConfig


def needs_at_least(recipe: TrialConfig, other: TrialConfig) -> bool:
    """Whether ``recipe`` needs at least the memory ``other`` needs, whatever the model.

    Peak memory grows with the micro batch and the world size (DDP buckets); accumulation adds
    one gradient buffer kept alive across micro steps, the same for 2 steps as for 16.
    """
    return (
        recipe.micro_batch_size >= other.micro_batch_size
        and min(recipe.accumulation_steps, 2) >= min(other.accumulation_steps, 2)
        and recipe.world_size >= other.world_size
    )


def learned_oom(recipe: TrialConfig, ran_out: list[RanOut]) -> str | None:
    """Why ``recipe`` is known not to fit without an estimate: it needs at least the memory
    of a launched trial that ran out (:func:`needs_at_least`); ``None`` when none did."""
    failed = next((o for o in ran_out if needs_at_least(recipe, o.recipe)), None)
    if failed is None:
        return None
    return (
        f"needs at least the memory of trial {failed.trial_id}"
        f" (micro batch {failed.recipe.micro_batch_size} x"
        f" {failed.recipe.accumulation_steps}), which ran out of memory"
    )
