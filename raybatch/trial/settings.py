"""A trial's settings: what every trial of a search shares besides its config.

One frozen object, built once by :func:`raybatch.trainable` and carried by the function it
returns (:func:`parts_of`), so that the searcher's penalty, the scheduler's cap and the
resources asked of Ray all follow from the settings the trials run with, instead of being
repeated by hand where they could disagree.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raybatch.cluster.budget import CUDA_CONTEXT_OVERHEAD_BYTES
from raybatch.errors import Issue, NotATrainableError, UnknownSettingError
from raybatch.memory.sizes import parse_size
from raybatch.metric import Target
from raybatch.status import penalty
from raybatch.trial.loop import LoopOptions
from raybatch.workload import Workload

if TYPE_CHECKING:  # typing only: a trial's import path holds no pydantic
    from raybatch.space.search_space import SearchSpace

PARTS_ATTRIBUTE = "raybatch_parts"
"""The attribute of a :func:`raybatch.trainable` function that holds its :class:`TrialParts`."""


@dataclass(frozen=True)
class TrialSettings:
    """Everything a trial needs besides its config (picklable, sent to every trial).

    Attributes:
        target: The metric value to reach.
        max_time_s: Cap on a trial's training time (evaluation excluded); a censored trial's
            objective is 10x this (PAR-10).
        max_samples: Optional sample budget per trial.
        eval_every_samples: Sample mark spacing, a fixed grid with no time marks; ``None``
            evaluates at training-time marks, with at least one evaluation an epoch (a
            data-parallel trial: a quarter epoch), rounded up to a multiple of the space's
            largest effective batch (:func:`~raybatch.trial.cadence.default_eval_every`).
        divergence_factor: Loss above this multiple of the initial loss is divergence.
        memory_budget: Bytes (or "8GiB") for the CPU-side pre-screen when no GPU is present.
        device: ``auto`` (the GPU Ray assigned to the trial, else CPU: never merely a visible
            one), ``cpu`` or ``cuda``.
        gpu_budget_bytes: One trial's budget on one GPU (the search's); a trial packed with
            others caps its allocator to its share of it
            (:func:`raybatch.cluster.placement.packed_memory_fraction`).
        data_parallel_gpus: Whether data-parallel workers reserve a GPU each (NCCL) or a CPU
            (gloo); the search decides from the cluster. ``None``: GPUs when the cluster has any.
        gpu_model: Pin data-parallel GPU workers to GPUs of this model (the search's
            ``--gpu-model``), as the trial itself is pinned.
        cuda_context_bytes: One process's CUDA context on the search's GPUs (measured at the
            search's start, :mod:`raybatch.cluster.gpu_budget`): a packed trial's allocator cap
            leaves room for its own.
        loop: Options of the training loop.
    """

    target: Target
    max_time_s: float = 600.0
    max_samples: int | None = None
    eval_every_samples: int | None = None
    divergence_factor: float = 10.0
    memory_budget: str | int | None = None
    device: str = "auto"
    gpu_budget_bytes: int | None = None
    data_parallel_gpus: bool | None = None
    gpu_model: str | None = None
    cuda_context_bytes: int = CUDA_CONTEXT_OVERHEAD_BYTES
    loop: LoopOptions = field(default_factory=LoopOptions)

    @property
    def budget_bytes(self) -> int | None:
        """The memory budget the pre-screen compares against: the GPU's, else ``memory_budget``."""
        if self.gpu_budget_bytes is not None:
            return self.gpu_budget_bytes
        return None if self.memory_budget is None else parse_size(self.memory_budget)

    @property
    def penalty(self) -> float:
        """The objective a trial that did not reach the target is told (PAR-10: 10x the cap).

        One value for the trainable, the searcher and the scheduler: the searcher reads it from
        here (:meth:`RaybatchSearcher.for_trainable`) instead of being told it by hand.
        """
        return penalty(self.max_time_s)


@dataclass(frozen=True)
class TrialParts:
    """What a :func:`raybatch.trainable` function was made of."""

    workload: Workload
    space: SearchSpace
    settings: TrialSettings


def settings_of(target: Target, sync_batchnorm: bool, **settings: Any) -> TrialSettings:
    """Split keyword settings between :class:`TrialSettings` and its :class:`LoopOptions`.

    Raises:
        UnknownSettingError: A name that is neither (a misspelt ``max_time`` would otherwise
            be dropped silently and the trial would run with the default), with the name it
            most likely meant.
    """
    trial_fields = {f.name for f in dataclasses.fields(TrialSettings)} - {"target", "loop"}
    loop_fields = {f.name for f in dataclasses.fields(LoopOptions)}
    unknown = sorted(set(settings) - trial_fields - loop_fields)
    if unknown:
        known = sorted(trial_fields | loop_fields)
        issues = []
        for name in unknown:
            near = difflib.get_close_matches(name, known, n=1)
            meant = f"did you mean {near[0]!r}? " if near else ""
            issues.append(Issue(name, f"not a setting of a trial: {meant}the settings are the"
                                      " fields of TrialSettings and LoopOptions"))  # fmt: skip
        raise UnknownSettingError(issues, "raybatch.trainable()")
    loop = {k: v for k, v in settings.items() if k in loop_fields}
    loop.setdefault("sync_batchnorm", sync_batchnorm)
    return TrialSettings(
        target=target,
        loop=LoopOptions(**loop),
        **{k: v for k, v in settings.items() if k in trial_fields},
    )


def parts_of(
    trainable: Callable[..., Any], instead: str = "pass its space and settings explicitly"
) -> TrialParts:
    """The parts of a function made by :func:`raybatch.trainable`; ``instead`` says what the
    caller takes without one (the refusal names it).

    Raises:
        NotATrainableError: ``trainable`` was not made by :func:`raybatch.trainable` (wrapped
            by ``tune.with_parameters``, say).
    """
    parts = getattr(trainable, PARTS_ATTRIBUTE, None)
    if not isinstance(parts, TrialParts):
        name = str(getattr(trainable, "__name__", trainable))
        why = f"was not made by raybatch.trainable(): {instead}"
        raise NotATrainableError([Issue("trainable", why)], name)
    return parts
