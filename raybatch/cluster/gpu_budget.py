"""What the search's GPUs show at its start: one trial's CUDA context, and the top of the range.

Each is one Ray task holding one GPU of the model the search runs on (``--gpu-model``, or the
cluster's one model), in a fresh worker process, as a trial would start:
:func:`raybatch.cluster.context.measure_context_bytes` (the figure goes into the budget, the
packing and every packed trial's allocator cap), then :func:`raybatch.memory.boundary.
find_boundary` under the budget (real steps that decide over the trace). Where a figure cannot
be measured (no GPU alive yet on an autoscaling cluster, NVML silent, the task not placed in
time) the search goes on with the assumed context or the trace alone, and the notes say so: a
search never waits or fails for these figures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from raybatch.cluster.budget import CUDA_CONTEXT_OVERHEAD_BYTES
from raybatch.cluster.context import measure_context_bytes
from raybatch.cluster.hardware import ClusterView
from raybatch.cluster.placement import model_resource, trial_device
from raybatch.cluster.process_age import charged_to_task
from raybatch.errors import (
    BudgetUnavailableError,
    Issue,
    OptionError,
    TrialDeviceError,
    first_line,
)
from raybatch.memory.boundary import MeasuredBoundary, find_boundary
from raybatch.memory.estimator import MemoryEstimator
from raybatch.memory.sizes import format_bytes
from raybatch.shipping import ship_by_value

if TYPE_CHECKING:
    from raybatch.space.search_space import SearchSpace
    from raybatch.workload import Workload


class BudgetAsked(Protocol):
    """What the search was asked about its GPUs' memory (the search's options are one)."""

    @property
    def memory_budget(self) -> str | int | None: ...  # given, or read from the GPUs

    @property
    def gpu_model(self) -> str | None: ...  # the GPU model the trials are pinned to

    @property
    def prescreen(self) -> bool: ...  # whether suggestions are pre-screened at all


CONTEXT_TIMEOUT_S = 60.0
"""How long the search waits for the measuring task (its worker starts and imports torch)."""
T = TypeVar("T")

BOUNDARY_TIMEOUT_S = 120.0
"""How long the search waits for the real steps at the top of the range (the workload's model
and data built, a few steps each)."""


def _assigned_cuda() -> Any:
    """The GPU Ray assigned this task, as CUDA names it: device 0 where Ray narrows the task's
    ``CUDA_VISIBLE_DEVICES`` to it, its own index where Ray is told not to
    (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``) -- the trials' own rule
    (:func:`~raybatch.cluster.placement.trial_device`); ``None`` where CUDA is not usable."""
    try:
        device = trial_device("auto")
    except TrialDeviceError:  # a GPU assigned where CUDA is not usable: nothing to measure
        return None
    return device if device.type == "cuda" else None


def _measure_on_gpu() -> int | None:
    """One trial's CUDA context, on the GPU Ray assigned this task."""
    device = _assigned_cuda()
    return None if device is None else measure_context_bytes(device.index or 0)


def _on_one_gpu(
    measure: Callable[..., T | None], gpu_model: str | None, timeout_s: float, *args: Any
) -> tuple[T | None, str | None]:
    """``measure(*args)`` in a Ray task holding one GPU of ``gpu_model``, in a fresh worker as a
    trial starts: its answer, or ``None`` and why (none free in time, the task's own error)."""
    import ray  # deferred: Ray is started by the driver before this runs

    task = ray.remote(num_gpus=1, num_cpus=0, resources=model_resource(gpu_model))(
        charged_to_task(measure)
    )
    ref = task.remote(*args)
    ready, _ = ray.wait([ref], timeout=timeout_s)
    if not ready:
        ray.cancel(ref, force=True)
        return None, f"no GPU free to measure it on within {timeout_s:g} s"
    try:
        return ray.get(ref), None
    except Exception as exc:  # the task's own failure, as Ray wraps it
        return None, f"{type(exc).__name__}: {first_line(exc)}"


def _boundary_on_gpu(
    workload: Workload, space: SearchSpace, budget_bytes: int
) -> MeasuredBoundary | None:
    """The real steps' boundary, on the GPU Ray assigned this task."""
    device = _assigned_cuda()
    return None if device is None else find_boundary(workload, space, str(device), budget_bytes)


def cluster_boundary(
    view: ClusterView,
    gpu_model: str | None,
    workload: Workload,
    space: SearchSpace,
    budget_bytes: int,
    notes: list[str],
    timeout_s: float = BOUNDARY_TIMEOUT_S,
) -> MeasuredBoundary | None:
    """The top of the batch range measured by real steps on one of the search's GPUs under
    ``budget_bytes`` (``None``: not measured, the trace decides; ``notes`` says why)."""
    if view.gpus <= 0:
        notes.append("the top of the batch range was not measured: no GPU node is alive")
        return None
    ship_by_value(workload)  # a workload of the user's own file travels by value, as to trials
    measured, why = _on_one_gpu(
        _boundary_on_gpu, gpu_model, timeout_s, workload, space, budget_bytes
    )
    if measured is None:
        notes.append(f"the top of the batch range was not measured ({why or 'no CUDA there'}):"
                     " the memory estimate alone decides what is refused")  # fmt: skip
        return None
    edges = ", ".join(
        f"{'accumulating' if acc else 'plain'}: {e.ran or 'none'} ran"
        + (f", {e.ran_out} ran out" if e.ran_out else "")
        for (acc, _), e in measured.edges.items()
    )
    notes.append(f"the top of the batch range measured by {measured.steps} real step(s) in"
                 f" {measured.seconds:.1f} s under {format_bytes(budget_bytes)}: {edges}; these"
                 " decide over the memory estimate")  # fmt: skip
    return measured


def search_estimator(
    view: ClusterView,
    options: BudgetAsked,
    cuda: bool,
    workload: Workload,
    space: SearchSpace,
    budget: int | None,
    notes: list[str],
) -> MemoryEstimator | None:
    """The search's memory estimator (``None`` without a budget: nothing is pre-screened),
    with the top of the range measured by real steps where the trials run on GPUs."""
    if budget is None:
        notes.append("no GPU memory budget on this machine: suggestions were not pre-screened")
        return None
    estimator = MemoryEstimator.for_space(workload, space, cuda)
    if cuda and options.prescreen:  # real steps on a GPU decide over the trace
        estimator.boundary = cluster_boundary(
            view, options.gpu_model, workload, space, budget, notes
        )
    return estimator


def cluster_context_bytes(
    view: ClusterView, gpu_model: str | None, notes: list[str], timeout_s: float = CONTEXT_TIMEOUT_S
) -> int:
    """One trial's CUDA context on the search's GPUs, in bytes: measured, else assumed.

    ``notes`` gets one line saying which, and why when assumed.
    """
    assumed = f"CUDA context assumed {format_bytes(CUDA_CONTEXT_OVERHEAD_BYTES)}"
    if view.gpus <= 0:
        notes.append(f"{assumed}: no GPU node is alive to measure it on")
        return CUDA_CONTEXT_OVERHEAD_BYTES
    measured, why = _on_one_gpu(_measure_on_gpu, gpu_model, timeout_s)
    if measured is None:
        notes.append(f"{assumed}: {why or 'NVML or CUDA did not answer on the GPU node'}")
        return CUDA_CONTEXT_OVERHEAD_BYTES
    where = f" on {gpu_model}" if gpu_model else ""
    notes.append(f"CUDA context measured{where}: {format_bytes(measured)} per trial")
    return int(measured)


def search_budget(
    view: ClusterView, options: BudgetAsked, cuda: bool, notes: list[str]
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


__all__ = [
    "BOUNDARY_TIMEOUT_S",
    "CONTEXT_TIMEOUT_S",
    "BudgetAsked",
    "cluster_boundary",
    "cluster_context_bytes",
    "search_budget",
    "search_estimator",
]
