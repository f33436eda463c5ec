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

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from raybatch import keys
from raybatch.errors import Issue, OptionError
from raybatch.memory.budget import CUDA_CONTEXT_OVERHEAD_BYTES, resolve_budget
from raybatch.memory.estimator import MemoryEstimator
from raybatch.run.gpu_budget import cluster_context_bytes
from raybatch.run.hardware import one_gpu_model, read_cluster
from raybatch.run.options import GPUS_PER_TRIAL_ALLOWED, gpus_per_trial_ok
from raybatch.space.config import RECIPE_KEYS, TrialConfig, carried_recipe
from raybatch.space.search_space import SearchSpace
from raybatch.trial.placement import MAX_TRIALS_PER_GPU, model_resource
from raybatch.trial.settings import PARTS_ATTRIBUTE, TrialSettings, parts_of
from raybatch.workload import Workload

REUSE_ACTORS = True
"""Tune's ``reuse_actors`` for the search's and the race's trials. Ray Tune defaults to a new
actor per trial: a fresh process that imports torch, builds the workload's data and warms
torch up again, about 2 s a trial on a CPU (a CUDA context on a GPU), which in a search of
short trials was a third of every device second. A trial of the same resources reuses the
last one's process instead (Ray resets the function trainable), so the workload's cached data
and the warm process carry over; each trial still frees its GPU memory when it ends
(:func:`raybatch.memory.probe.release_memory`), and a trial whose CUDA context broke ends its
process (:func:`raybatch.trial.wrapper.run_trial`), so the next one starts clean."""

log = logging.getLogger(__name__)

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
    (:func:`raybatch.trial.placement.packed_memory_fraction` caps each one to its slot).
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


def with_resources(
    trainable: Callable[[dict[str, Any]], Any],
    gpus_per_trial: str | float = "auto",
    cpus_per_trial: float = 1.0,
    *,
    estimator: MemoryEstimator | None = None,
) -> Any:
    """``tune.with_resources`` for a :func:`raybatch.trainable`: each trial's CPUs and GPU
    (share) from :func:`trial_resources`, with everything else read from the settings the
    trainable carries, whole: its workload and space, memory budget, GPU model and CUDA
    context (:func:`raybatch.trial.settings.parts_of`). Nothing is given twice, so the
    resources cannot disagree with the trials. ``estimator``: one already built for the
    workload (default: built here where ``gpus_per_trial="auto"`` needs one).

    With ``"auto"`` and no budget in the settings, connected to a Ray cluster with GPUs, the
    cluster is read as ``raybatch search`` reads it (:func:`measured_on_cluster`): one GPU
    model, one trial's CUDA context measured on it, the budget from the GPUs' NVML. The
    trainable carries them from then on: each packed trial caps its allocator with them, and a
    searcher built from it (:meth:`RaybatchSearcher.for_trainable`) pre-screens with them.

    For a trainable of your own, ``tune.with_resources(fn, trial_resources(workload, space,
    ...))`` takes the same parts one by one.

    Raises:
        NotATrainableError: ``trainable`` was not made by :func:`raybatch.trainable`.
        OptionError: The cluster mixes GPU models and the trainable pins none.
    """
    from ray import tune

    parts = parts_of(trainable, "give Tune tune.with_resources(fn, trial_resources(workload,"
                     " space, ...)) instead")  # fmt: skip
    s = parts.settings
    if gpus_per_trial == "auto" and s.gpu_budget_bytes is None:
        measured = measured_on_cluster(s)
        if measured != s:  # what the trials run with, and a searcher built from fn reads
            setattr(trainable, PARTS_ATTRIBUTE, replace(parts, settings=measured))
            s = measured
    elif (
        gpus_per_trial != "auto"
        and gpus_per_trial_ok(gpus_per_trial)
        and 0 < float(gpus_per_trial) < 1
    ):
        log.warning(FIXED_SHARE.format(share=float(gpus_per_trial)))
    resources = trial_resources(
        parts.workload, parts.space, gpus_per_trial, cpus_per_trial, s.budget_bytes, estimator,
        s.gpu_model, s.cuda_context_bytes,
    )  # fmt: skip
    return tune.with_resources(trainable, resources)  # type: ignore[arg-type]


FIXED_SHARE = (
    "gpus_per_trial={share:g}: every trial shares its GPU, so its clock runs at its"
    " neighbours' pace; the capping scheduler neither caps such trials nor takes them as the"
    " incumbent, no time model is measured in one, and their times are compared only with"
    " runs shared alike. Give 'auto' (trials alone where they do not fit side by side) or 1"
    " for times measured alone."
)
"""What a fixed fractional share turns off, said once when the resources are built."""

PIN = "gpu_model (e.g. raybatch.trainable(..., gpu_model={!r}))"
"""How a plugin user pins the trials to one GPU model (the CLI's ``--gpu-model``)."""


def measured_on_cluster(settings: TrialSettings) -> TrialSettings:
    """``settings`` with one trial's GPU budget and CUDA context measured on the Ray cluster's
    GPUs, as ``raybatch search`` measures them (:mod:`raybatch.run.gpu_budget`), each figure
    said in a log line; unchanged where Ray is not running or has no GPU.

    Raises:
        OptionError: The cluster mixes GPU models and ``settings`` pins none.
    """
    import ray

    if not ray.is_initialized():
        return settings
    view = read_cluster()
    if view.gpus <= 0:
        return settings
    notes: list[str] = []
    view = one_gpu_model(view, settings.gpu_model, notes, pin=PIN)
    context = settings.cuda_context_bytes
    if context == CUDA_CONTEXT_OVERHEAD_BYTES:  # the assumed figure: measure it
        context = cluster_context_bytes(view, settings.gpu_model, notes)
    budget = view.budget(settings.memory_budget, context_bytes=context)
    for note in notes:
        log.info(note)
    return replace(settings, cuda_context_bytes=context,
                   gpu_budget_bytes=budget.bytes if budget is not None else None)  # fmt: skip


def _recipe(space: SearchSpace, config: dict[str, Any]) -> TrialConfig:
    """The recipe a trial's config carries (the searcher's, derived once where its knobs were
    chosen), read rather than derived again; a hand-written config's, from its knobs. The
    trial checks at its door that a carried recipe agrees with its knobs."""
    if all(k in config for k in RECIPE_KEYS if k != keys.OPTIMIZER_KWARGS):
        return carried_recipe(config)
    return space.recipe_of(config)


@contextlib.contextmanager
def pending_trials(pausing: bool, in_flight: int) -> Iterator[None]:
    """Where the scheduler pauses trials, Tune's ``max_concurrent_trials`` is off (it counts
    paused trials), and with it the pending trials it allows: one, for a searcher of its own,
    and a search of two slots ran one trial at a time. Tune's ``TUNE_MAX_PENDING_TRIALS_PG``
    gives back one per slot (the user's own setting stands)."""
    name = "TUNE_MAX_PENDING_TRIALS_PG"
    if not pausing or name in os.environ:
        yield
        return
    os.environ[name] = str(in_flight)
    try:
        yield
    finally:
        os.environ.pop(name, None)
