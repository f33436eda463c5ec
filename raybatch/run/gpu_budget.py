"""The CUDA context of the search's GPU model, measured at the search's start.

One Ray task holding one GPU of the model the search runs on (``--gpu-model``, or the
cluster's one model) runs :func:`raybatch.memory.context.measure_context_bytes` in a fresh
worker process, as a trial would start. The figure goes into the budget (one context per
trial), the searcher's packing and every packed trial's allocator cap. Where it cannot be
measured (no GPU alive yet on an autoscaling cluster, NVML silent, the task not placed in
time) the assumed :data:`~raybatch.memory.budget.CUDA_CONTEXT_OVERHEAD_BYTES` is used, and the
notes say so: a search never waits or fails for this figure.
"""

from __future__ import annotations

from raybatch.errors import (
    BudgetUnavailableError,
    Issue,
    OptionError,
    TrialDeviceError,
    first_line,
)
from raybatch.memory.budget import CUDA_CONTEXT_OVERHEAD_BYTES
from raybatch.memory.context import measure_context_bytes
from raybatch.memory.sizes import format_bytes
from raybatch.run.hardware import ClusterView
from raybatch.run.options import SearchOptions
from raybatch.trial.placement import model_resource, trial_device
from raybatch.trial.process_age import charged_to_task

CONTEXT_TIMEOUT_S = 60.0
"""How long the search waits for the measuring task (its worker starts and imports torch)."""


def _measure_on_gpu() -> int | None:
    """On the GPU Ray assigned this task: CUDA's device 0 where Ray narrows the task's
    ``CUDA_VISIBLE_DEVICES`` to it, its own index where Ray is told not to
    (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``) -- the trials' own rule
    (:func:`~raybatch.trial.placement.trial_device`)."""
    try:
        device = trial_device("auto")
    except TrialDeviceError:  # a GPU assigned where CUDA is not usable: nothing to measure
        return None
    if device.type != "cuda":
        return None
    return measure_context_bytes(device.index or 0)


def cluster_context_bytes(
    view: ClusterView, gpu_model: str | None, notes: list[str], timeout_s: float = CONTEXT_TIMEOUT_S
) -> int:
    """One trial's CUDA context on the search's GPUs, in bytes: measured, else assumed.

    ``notes`` gets one line saying which, and why when assumed.
    """
    import ray

    assumed = f"CUDA context assumed {format_bytes(CUDA_CONTEXT_OVERHEAD_BYTES)}"
    if view.gpus <= 0:
        notes.append(f"{assumed}: no GPU node is alive to measure it on")
        return CUDA_CONTEXT_OVERHEAD_BYTES
    measure = charged_to_task(_measure_on_gpu)
    task = ray.remote(num_gpus=1, num_cpus=0, resources=model_resource(gpu_model))(measure)
    ref = task.remote()
    ready, _ = ray.wait([ref], timeout=timeout_s)
    why = None
    measured = None
    if not ready:
        ray.cancel(ref, force=True)
        why = f"no GPU free to measure it on within {timeout_s:g} s"
    else:
        try:
            measured = ray.get(ref)
        except Exception as exc:  # the task's own failure, as Ray wraps it
            why = f"{type(exc).__name__}: {first_line(exc)}"
    if measured is None:
        notes.append(f"{assumed}: {why or 'NVML or CUDA did not answer on the GPU node'}")
        return CUDA_CONTEXT_OVERHEAD_BYTES
    where = f" on {gpu_model}" if gpu_model else ""
    notes.append(f"CUDA context measured{where}: {format_bytes(measured)} per trial")
    return int(measured)


def search_budget(
    view: ClusterView, options: SearchOptions, cuda: bool, notes: list[str]
) -> tuple[int | None, int]:
    """One trial's memory budget on one GPU of the cluster the search runs on (``None``: a
    CPU search without ``--memory-budget``), and one trial's CUDA context (measured on GPUs).

    Raises:
        OptionError: GPU trials, no GPU of the search's model alive yet (its nodes at zero
            under an autoscaler), and no ``--memory-budget``.
        BudgetUnavailableError: GPUs, and NVML answered on none of their nodes.
    """

    if cuda and options.memory_budget is None and view.gpus <= 0:
        model = f"{options.gpu_model} " if options.gpu_model else ""
        message = (
            f"no {model}GPU node is alive yet (the autoscaler may start up to"
            f" {view.autoscale_gpus}), and no GPU's memory can be read before one exists: give"
            " --memory-budget"
        )
        raise OptionError([Issue("memory_budget", message)])
    context = CUDA_CONTEXT_OVERHEAD_BYTES
    if cuda:
        context = cluster_context_bytes(view, options.gpu_model, notes)
    if options.memory_budget is None and not cuda:
        return None, context
    resolved = view.budget(options.memory_budget, context_bytes=context)
    if resolved is None:
        raise BudgetUnavailableError(
            "no GPU memory budget: NVML answered on none of the cluster's GPU nodes, so"
            " give one explicitly, e.g. --memory-budget 8GiB"
        )
    notes.append(f"memory budget per GPU: {format_bytes(resolved.bytes)} ({resolved.source})")
    return int(resolved.bytes), context


__all__ = ["CONTEXT_TIMEOUT_S", "cluster_context_bytes", "search_budget"]
