"""The pre-screen's answer for one configuration: fits, does not, or cannot tell."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raybatch import keys
from raybatch.memory.model import EstimateSource


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


def needs_at_least(config: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether ``config`` needs at least the memory ``other`` needs, whatever the model.

    Peak memory grows with the micro batch and the world size (DDP buckets); accumulation adds
    one gradient buffer kept alive across micro steps, the same for 2 steps as for 16.
    """
    return bool(
        config[keys.MICRO_BATCH_SIZE] >= other[keys.MICRO_BATCH_SIZE]
        and min(config[keys.ACCUMULATION_STEPS], 2) >= min(other[keys.ACCUMULATION_STEPS], 2)
        and config.get(keys.WORLD_SIZE, 1) >= other.get(keys.WORLD_SIZE, 1)
    )


def learned_oom(config: dict[str, Any], out_of_memory: list[dict[str, Any]]) -> str | None:
    """Why ``config`` is known not to fit without an estimate: it needs at least the memory
    of a launched trial that ran out (:func:`needs_at_least`); ``None`` when none did."""
    failed = next((o for o in out_of_memory if needs_at_least(config, o)), None)
    if failed is None:
        return None
    return (
        f"needs at least the memory of trial {failed[keys.TUNE_TRIAL_ID]}"
        f" (micro batch {failed[keys.MICRO_BATCH_SIZE]} x"
        f" {failed[keys.ACCUMULATION_STEPS]}), which ran out of memory"
    )
