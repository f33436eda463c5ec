"""``tune.with_resources`` for a :func:`raybatch.trainable`, from the settings it carries.

The plugin path's door to the cluster: each trial's CPUs and GPU share come from
:func:`raybatch.cluster.resources.trial_resources`, with the workload, space, budget, GPU model
and CUDA context read from the trainable itself, so the resources cannot disagree with the
trials; on a Ray cluster with GPUs and no budget given, the budget and the context are measured
as ``raybatch search`` measures them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from raybatch.cluster.budget import CUDA_CONTEXT_OVERHEAD_BYTES
from raybatch.cluster.gpu_budget import cluster_context_bytes
from raybatch.cluster.hardware import one_gpu_model, read_cluster
from raybatch.cluster.placement import gpus_per_trial_ok
from raybatch.cluster.resources import PIN, trial_resources
from raybatch.memory.estimator import MemoryEstimator
from raybatch.trial.settings import PARTS_ATTRIBUTE, TrialSettings, parts_of

log = logging.getLogger(__name__)


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


def measured_on_cluster(settings: TrialSettings) -> TrialSettings:
    """``settings`` with one trial's GPU budget and CUDA context measured on the Ray cluster's
    GPUs, as ``raybatch search`` measures them (:mod:`raybatch.cluster.gpu_budget`), each figure
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


__all__ = ["FIXED_SHARE", "measured_on_cluster", "with_resources"]
