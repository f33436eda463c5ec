"""The pre-screen's answer for one configuration: fits, does not, or cannot tell."""

from __future__ import annotations

from dataclasses import dataclass

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
