"""What a trial evaluates on: a fixed subset of the validation set early, the whole set near
the target.

The equal-time rungs need evaluations early in every trial (:func:`~raybatch.trial.cadence.
time_marks`), where one pass over the whole validation set can cost a large share of the rung:
on the benchmark's wide MLP (4,000 validation items, a 3 s training) one pass is 4 % of a whole
training, and evaluation held a third of a search's device seconds. Early on a rung compares
curves far apart, which a quarter of the set tells as well; near the target the set decides
when the trial reached it, and only the whole set may say so.

So a trial evaluates on a fixed subset (the same items in every trial, drawn once with a fixed
seed: its values compare across trials) until its subset value has come
:data:`NEAR_PROGRESS` of the way from its first evaluation to the target, or reached it; from
that evaluation on (that one included) it evaluates the whole set. A subset value never
reaches the target: the whole set is read at the same point first. A validation set too small
to cut (:data:`MIN_SUBSET_ITEMS`), or a fraction of 0 or 1, is evaluated whole from the start.
From that point on the evaluations also come closer together
(:data:`~raybatch.trial.cadence.NEAR_MARK_RATIO`): the time to target is read within 15 %.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from raybatch.metric import Target, target_value

EARLY_FRACTION = 0.25
"""The share of the validation set an early evaluation reads (``LoopOptions.early_eval``)."""
MIN_SUBSET_ITEMS = 1000
"""The smallest early subset: fewer items would tell curves apart by the subset's noise."""
NEAR_PROGRESS = 0.9
"""From this share of the way from the first value to the target on, the whole set is read: a
subset's noise would otherwise decide when the trial reached."""
SUBSET_SEED = 0

Evaluate = Callable[[Iterator[Any]], Mapping[str, float]]
"""Evaluates the model on the given batches (already on its device): the metrics' values."""


def early_subset_indices(size: int, fraction: float) -> list[int] | None:
    """The fixed items of the early subset of a validation set of ``size`` items, in order;
    ``None`` where the whole set is read from the start (too small to cut, or no fraction)."""
    import torch

    items = max(round(size * fraction), MIN_SUBSET_ITEMS)
    if not 0 < fraction < 1 or items * 2 > size:
        return None
    generator = torch.Generator().manual_seed(SUBSET_SEED)
    return sorted(torch.randperm(size, generator=generator)[:items].tolist())


class Validation:
    """A trial's evaluations: the early subset until near the target, then the whole set.

    Args:
        whole: The whole validation set's batches, afresh on each call.
        early: The early subset's batches (``None``: the whole set from the start).
        target: The trial's target (its metric and direction).
    """

    def __init__(self, whole: Callable[[], Iterator[Any]],
                 early: Callable[[], Iterator[Any]] | None, target: Target) -> None:  # fmt: skip
        self.whole = whole
        self.early = early
        self.target = target
        self.first: float | None = None
        self.near = False
        """Whether a value came :data:`NEAR_PROGRESS` of the way to the target: from then on the
        whole set is read, and the trial's evaluations come closer together
        (:meth:`~raybatch.trial.reporting.TrialReporter.near_target`)."""

    @property
    def on_subset(self) -> bool:
        """Whether the next evaluation reads the early subset."""
        return self.early is not None

    def evaluate(self, run: Evaluate) -> tuple[Mapping[str, float], bool]:
        """The values at this mark, and whether they are the whole set's (``run`` is called
        once, or twice at the evaluation that leaves the subset)."""
        if self.early is None:
            values = run(self.whole())
            self._seen(target_value(values, self.target.metric))
            return values, True
        values = run(self.early())
        if self._seen(target_value(values, self.target.metric)):
            self.early = None  # from here on (this mark included) the whole set
            return run(self.whole()), True
        return values, False

    def _seen(self, value: float) -> bool:
        """Whether the trial is near its target, this value included (and from then on)."""
        if self.first is None:
            self.first = value
        self.near = self.near or self._near(value)
        return self.near

    def _near(self, value: float) -> bool:
        if self.target.reached(value):
            return True
        assert self.first is not None
        gap = self.target.value - self.first
        if gap == 0:
            return True
        progress = (value - self.first) / gap
        return progress >= NEAR_PROGRESS


def subset_of(dataset: Any, fraction: float) -> Any | None:
    """The early subset of ``dataset`` (a ``torch.utils.data.Subset``), or ``None``."""
    from torch.utils.data import Subset

    try:
        size = len(dataset)
    except TypeError:  # an iterable dataset: no fixed items to choose from
        return None
    indices = early_subset_indices(size, fraction)
    return None if indices is None else Subset(dataset, indices)


__all__ = ["EARLY_FRACTION", "MIN_SUBSET_ITEMS", "NEAR_PROGRESS", "Validation",
           "early_subset_indices", "subset_of"]  # fmt: skip
