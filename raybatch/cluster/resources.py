"""Per-trial resources: a GPU fraction from the memory estimate, whole GPUs for data parallelism.

Ray Tune's ``tune.with_resources`` takes a callable of the trial's config; this module builds
that callable. With ``gpus_per_trial="auto"`` a trial asks for ``1/k`` of a GPU, where ``k``
is how many trials of its predicted peak fit side by side in one GPU's budget — three trials
that each need a quarter of the card share one GPU, and since ``k x peak <= budget`` by
construction, Ray's packing can never put more on a GPU than its budget holds. A trial with
``world_size > 1`` is only the driver of a Ray Train run whose workers reserve a whole GPU (or
a CPU) each, so the Tune trial itself asks for almost nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from raybatch import keys
from raybatch.cluster.budget import CUDA_CONTEXT_OVERHEAD_BYTES, resolve_budget
from raybatch.cluster.hardware import one_gpu_model, read_cluster
from raybatch.cluster.placement import (
    GPUS_PER_TRIAL_ALLOWED,
    MAX_TRIALS_PER_GPU,
    gpus_per_trial_ok,
    model_resource,
)
from raybatch.errors import Issue, OptionError
from raybatch.memory.estimator import MemoryEstimator
from raybatch.space.config import RECIPE_KEYS, TrialConfig, carried_recipe
from raybatch.space.search_space import SearchSpace
from raybatch.workload import Workload

log = logging.getLogger(__name__)

PIN = "gpu_model (e.g. raybatch.trainable(..., gpu_model={!r}))"
"""How a plugin user pins the trials to one GPU model (the CLI's ``--gpu-model``)."""


DRIVER_CPUS = 0.01
"""What the Tune trial of a data-parallel run holds itself: it only waits on its Ray Train
workers, which reserve their own CPUs/GPUs; Ray needs a non-empty request."""


def gpu_fraction(
    predicted_bytes: int,
    budget_bytes: int,
    max_per_gpu: int = MAX_TRIALS_PER_GPU,
    context_bytes: int = CUDA_CONTEXT_OVERHEAD_BYTES,
) -> float:
    """The GPU share for a trial: ``1/k`` with ``k`` trials of this size fitting the GPU.

    ``budget_bytes`` is what one trial alone may use; it already paid for one CUDA context.
    Each of ``k`` packed processes has its own context, outside the allocator, so ``k`` is the
    largest with ``k x (predicted + context) <= budget + context``
    (:func:`raybatch.cluster.placement.packed_memory_fraction` caps each one to its slot).
    A trial that does not fit even alone gets a whole GPU (its probe then says infeasible).
    """
    if predicted_bytes <= 0:
        return 1.0 / max_per_gpu
    side_by_side = min(
        (budget_bytes + context_bytes) // (predicted_bytes + context_bytes), max_per_gpu
    )
    if side_by_side <= 1:
        return 1.0
    # Round down to Ray's resource precision (1e-4) so k shares never exceed one GPU.
    return math.floor(10_000 / side_by_side) / 10_000


def runs_alone(config: dict[str, Any]) -> bool:
    """Whether the trial must hold a whole GPU: a confirmation run (a measurement, no
    neighbours), or the retry of a trial that ran out of memory while packed."""
    return bool(config.get(keys.ALONE, False))


def trial_resources(
    workload: Workload,
    space: SearchSpace,
    gpus_per_trial: str | float = "auto",
    cpus_per_trial: float = 1.0,
    memory_budget: str | int | None = None,
    estimator: MemoryEstimator | None = None,
    gpu_model: str | None = None,
    context_bytes: int = CUDA_CONTEXT_OVERHEAD_BYTES,
) -> Callable[[dict[str, Any]], dict[str, float]]:
    """The callable for ``tune.with_resources``: config -> ``{"cpu": ..., "gpu": ...}``.

    Args:
        workload: For the memory estimate (``gpus_per_trial="auto"``).
        space: To derive each trial's recipe.
        gpus_per_trial: ``"auto"`` (fraction from the estimate), or a fixed number/fraction
            (0 for CPU-only trials).
        cpus_per_trial: CPUs each trial holds; the trial sets torch's thread count to it.
        memory_budget: One GPU's budget for ``"auto"``; default: read through NVML on the
            cluster's GPU nodes when connected to Ray (the smallest GPU), else here.
        estimator: The estimator to predict with (the search shares its own, which the
            trials' probes calibrate); default: one for the space.
        gpu_model: Pin every GPU trial to GPUs of this model (Ray's ``accelerator_type``).
        context_bytes: One trial's CUDA context (the search measures it): each packed trial
            pays its own.

    Raises:
        OptionError: ``gpus_per_trial`` is neither ``"auto"`` nor a non-negative number; or,
            ``"auto"`` on a cluster of mixed GPU models, none is pinned (``gpu_model``).
        BudgetUnavailableError: ``"auto"`` without a budget and without NVML.
    """
    if not gpus_per_trial_ok(gpus_per_trial):
        message = f"must be {GPUS_PER_TRIAL_ALLOWED}, got {gpus_per_trial!r}"
        raise OptionError([Issue("gpus_per_trial", message)])
    pin = model_resource(gpu_model)  # data-parallel workers are pinned by their trial
    if gpus_per_trial != "auto":
        fixed = float(gpus_per_trial)

        def fixed_resources(config: dict[str, Any]) -> dict[str, float]:
            if _recipe(space, config).world_size > 1:
                return {"cpu": DRIVER_CPUS, "gpu": 0.0}
            if fixed > 0 and runs_alone(config):
                return {"cpu": cpus_per_trial, "gpu": max(fixed, 1.0), **pin}
            return {"cpu": cpus_per_trial, "gpu": fixed, **(pin if fixed > 0 else {})}

        return fixed_resources

    budget = _budget(memory_budget, gpu_model, context_bytes)
    estimator = estimator or MemoryEstimator.for_space(workload, space)

    def auto_resources(config: dict[str, Any]) -> dict[str, float]:
        recipe = _recipe(space, config)
        if recipe.world_size > 1:
            return {"cpu": DRIVER_CPUS, "gpu": 0.0}
        if runs_alone(config):
            return {"cpu": cpus_per_trial, "gpu": 1.0, **pin}
        if keys.GPU_SHARE in config:  # decided by the searcher, with a calibrated estimate
            return {"cpu": cpus_per_trial, "gpu": float(config[keys.GPU_SHARE]), **pin}
        share = gpu_fraction(estimator.predict(recipe), budget, context_bytes=context_bytes)
        return {"cpu": cpus_per_trial, "gpu": share, **pin}

    return auto_resources


def _budget(memory_budget: str | int | None, gpu_model: str | None, context_bytes: int) -> int:
    """One trial's GPU budget in bytes: the explicit one; else, connected to Ray, the
    cluster's smallest GPU (of ``gpu_model``, where trials are pinned to one) as the GPU
    nodes' own NVML reads it (the driver may be a CPU-only head); else this machine's NVML.
    Either NVML budget leaves room for one CUDA context of ``context_bytes``, the figure the
    trials' shares are computed with."""
    import ray

    if memory_budget is None and ray.is_initialized():
        view = read_cluster()
        pinned = one_gpu_model(view, gpu_model, [], pin=PIN) if view.gpus > 0 else view
        found = pinned.budget(context_bytes=context_bytes)
        if found is not None:
            return found.bytes
    return resolve_budget(memory_budget, context_overhead_bytes=context_bytes).bytes


def _recipe(space: SearchSpace, config: dict[str, Any]) -> TrialConfig:
    """The recipe a trial's config carries (the searcher's, derived once where its knobs were
    chosen), read rather than derived again; a hand-written config's, from its knobs. The
    trial checks at its door that a carried recipe agrees with its knobs."""
    if all(k in config for k in RECIPE_KEYS if k != keys.OPTIMIZER_KWARGS):
        return carried_recipe(config)
    return space.recipe_of(config)
