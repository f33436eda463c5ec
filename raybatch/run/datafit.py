"""The space's batches against the workload's data, checked before a search starts.

A trial refuses a micro batch larger than its share of the training set
(:func:`raybatch.batches.train_batches`): not one full batch would fit. A space written for
another dataset (a preset's ``limits.dataset_size`` is the size it was written for, not the
user's) can hold such choices, and the search's opening proposes the largest batch first: every
trial of the opening would fail the same way, after Ray and the trials had started. Said here
instead, in seconds, naming the space's field and the choices to drop.
"""

from __future__ import annotations

from raybatch import keys
from raybatch.errors import Issue, SpaceError
from raybatch.space.search_space import SearchSpace
from raybatch.workload import Workload


def training_set_size(workload: Workload) -> int | None:
    """How many items the workload's training set holds (``None``: it cannot say here: no
    ``len``, or building it in the driver failed; the trials will say what they find)."""
    try:
        return len(workload.train_dataset())  # type: ignore[arg-type]
    except Exception:  # a courtesy: the trial's own check is the rule
        return None


def check_batches_fit_data(workload: Workload, space: SearchSpace) -> None:
    """Refuse a space whose micro batches (per data-parallel worker) do not fit in the
    workload's training set, before anything starts.

    Raises:
        SpaceError: Naming ``search.micro_batch_size`` in the space's source, the choices too
            large and the training set's size.
    """
    size = training_set_size(workload)
    if size is None:
        return
    world = min(space.search.world_size)
    too_large = [m for m in space.search.micro_batch_size if size // world < m]
    if not too_large:
        return
    per_worker = "" if world == 1 else f" per worker of {world}"
    choices = ", ".join(str(m) for m in sorted(too_large))
    why = (
        f"{choices} larger than {workload.name}'s training set ({size} samples{per_worker}):"
        " not one batch of them fits; drop them from the space"
    )
    raise SpaceError([Issue(f"search.{keys.MICRO_BATCH_SIZE}", why)], space.source)


__all__ = ["check_batches_fit_data", "training_set_size"]
