"""``raybatch check``: what a search would see and do on a cluster, before it spends anything.

The same decisions the search makes at its start (:func:`raybatch.run.driver.search`) — GPU or
CPU trials from the cluster's resources, the per-GPU budget from NVML on the GPU nodes (the
smallest), how many trials of each recipe share a GPU, which world sizes cannot be placed —
computed and shown, so a user finds a CPU-only head node, a node whose driver NVML cannot
reach, or a space asking for more GPUs than exist, in seconds rather than in a failed search.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from raybatch.cluster.budget import CUDA_CONTEXT_OVERHEAD_BYTES, MemoryBudget
from raybatch.cluster.gpu_budget import cluster_context_bytes
from raybatch.cluster.hardware import ClusterView, gpu_request
from raybatch.cluster.placement import unplaceable_reason
from raybatch.cluster.resources import gpu_fraction
from raybatch.errors import OptionError, TraceError
from raybatch.memory.estimator import MemoryEstimator
from raybatch.space.search_space import SearchSpace
from raybatch.workload import Workload


@dataclass(frozen=True)
class RecipeCheck:
    """One recipe of the space as ``raybatch check`` sees it before a search.

    Attributes:
        micro_batch_size, accumulation_steps, world_size, effective_batch_size: The recipe's
            batch shape.
        predicted_bytes: The estimate's peak (``None``: no budget, or untraceable).
        fits: Whether that peak fits the budget (``None``: not known).
        trials_per_gpu: Trials that share one GPU (``None``: not packed, or not known).
        placement: Why its workers cannot be placed now (``None``: they can).
    """

    micro_batch_size: int
    accumulation_steps: int
    world_size: int
    effective_batch_size: int
    predicted_bytes: int | None
    fits: bool | None
    trials_per_gpu: int | None
    placement: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Preflight:
    """What ``raybatch check`` reports (``to_dict`` is its ``--json``)."""

    view: ClusterView
    trial_device: str
    budget: MemoryBudget | None
    recipes: list[RecipeCheck] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.view.to_dict(),
            "trial_device": self.trial_device,
            "budget_bytes": None if self.budget is None else self.budget.bytes,
            "budget_source": None if self.budget is None else self.budget.source,
            "recipes": [r.to_dict() for r in self.recipes],
            "unplaceable": [r.to_dict() for r in self.recipes if r.placement is not None],
            "warnings": self.warnings,
        }


def preflight(
    view: ClusterView,
    workload: Workload | None = None,
    space: SearchSpace | None = None,
    memory_budget: str | int | None = None,
    gpus_per_trial: str | float | None = None,
    measure_context: bool = False,
) -> Preflight:
    """The search's start-up decisions on ``view``, and per recipe of ``space`` (if given):
    its predicted peak, trials per GPU, and whether its world size can be placed. With
    ``measure_context`` (connected to the cluster), the CUDA context is measured on a GPU as
    the search measures it, so the budget and the packing are the search's."""
    warnings = list(view.warnings())
    gpus = view.gpus_per_trial(gpus_per_trial)
    cuda = gpus not in (0, 0.0)
    try:  # what the search would refuse, said here as a warning
        gpu_request(view, gpus_per_trial, memory_budget, warnings)
    except OptionError as exc:
        warnings.extend(f"a search would be refused: {i.field}: {i.message}" for i in exc.issues)
    device = "cuda" if cuda and view.gpus > 0 else "cpu"
    context = CUDA_CONTEXT_OVERHEAD_BYTES
    if cuda and measure_context:
        context = cluster_context_bytes(view, None, warnings)
    budget = None
    if cuda or memory_budget is not None:
        budget = view.budget(memory_budget, context_bytes=context)
    if cuda and budget is None:
        warnings.append(
            "no GPU memory budget: NVML answered on no GPU node; a search needs --memory-budget"
        )
    recipes = []
    if workload is not None and space is not None:
        recipes = _recipes(view, workload, space, budget, device, gpus, context)
    return Preflight(view, device, budget, recipes, warnings)


def _recipes(
    view: ClusterView,
    workload: Workload,
    space: SearchSpace,
    budget: MemoryBudget | None,
    device: str,
    gpus: str | float,
    context: int,
) -> list[RecipeCheck]:
    use_gpu = device == "cuda"
    estimator = MemoryEstimator.for_space(workload, space, use_gpu) if budget is not None else None
    room = view.placeable(use_gpu)
    rows = []
    for recipe in space.grid():
        predicted: int | None = None
        if estimator is not None:
            try:
                predicted = estimator.predict(recipe)
            except TraceError:
                predicted = None
        placement = unplaceable_reason(recipe.world_size, use_gpu, room)
        per_gpu: int | None = None
        if use_gpu and recipe.world_size == 1:
            if gpus == "auto" and predicted is not None and budget is not None:
                per_gpu = round(1 / gpu_fraction(predicted, budget.bytes, context_bytes=context))
            elif isinstance(gpus, int | float) and gpus > 0:
                per_gpu = max(int(1 / gpus + 1e-9), 1)
        fits = None if predicted is None or budget is None else predicted <= budget.bytes
        rows.append(
            RecipeCheck(
                recipe.micro_batch_size, recipe.accumulation_steps, recipe.world_size,
                recipe.effective_batch_size, predicted, fits, per_gpu, placement,
            )
        )  # fmt: skip
    return rows


__all__ = ["Preflight", "RecipeCheck", "preflight"]
