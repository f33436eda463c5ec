"""A Ray Tune trainable made from a workload, a space and a target.

``raybatch.trainable(workload, space, target)`` returns a plain Tune function trainable; use
it in ``tune.Tuner`` like any other (wrap it in :func:`raybatch.with_resources` for per-trial
GPUs/CPUs). For each trial it:

1. derives the recipe from the trial's raw knobs with the space's rules;
2. gates memory before the clock starts (on CUDA a real probe step; on CPU with a
   ``memory_budget`` the trace): too big ends it ``infeasible_memory``, at no training time;
3. trains with raybatch's loop (:mod:`raybatch.trial.loop`) to the target, its caps or a
   divergence, reporting at every evaluation, and ends with one terminal status
   (:mod:`raybatch.status`): a failure inside it ends *the trial* with a reason, never the search.

``world_size > 1`` runs the trial data-parallel through Ray Train's ``TorchTrainer`` (gloo on
CPU, NCCL on GPU), launched from inside the Tune trial (Ray Train V2's pattern); rank 0's
reports reach Tune.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from raybatch import keys
from raybatch.cluster import process_age
from raybatch.cluster.placement import (
    assigned_gpu_share,
    limit_packed_memory,
    model_resource,
    placement_problem,
    running_ray,
    trial_device,
)
from raybatch.errors import WorkerLostError, WorkerMemoryError
from raybatch.memory.probe import is_out_of_memory, model_bytes, probe, release_memory
from raybatch.memory.sizes import format_bytes, parse_size
from raybatch.metric import Target, resolve_target
from raybatch.shipping import ship_by_value
from raybatch.space.config import TrialConfig
from raybatch.status import TrialStatus
from raybatch.timemodel.measure import at_target_measure
from raybatch.trial.cadence import (
    BACKSTOP_EVALS_PER_EPOCH,
    EVALS_PER_EPOCH,
    default_eval_every,
    rung_grid,
    time_marks,
)
from raybatch.trial.channel import ReportFn
from raybatch.trial.clock import TrialClock
from raybatch.trial.failures import lost_worker, memory_failure
from raybatch.trial.gpu_monitor import DeviceFigures
from raybatch.trial.loop import LoopOptions, agreed_clock, train
from raybatch.trial.pause import checkpointing
from raybatch.trial.reporting import ReporterOptions, TrialReporter
from raybatch.trial.settings import PARTS_ATTRIBUTE, TrialParts, TrialSettings, settings_of
from raybatch.workload import Workload

# Typing only: a trial's import path holds no pydantic (the offline GPU check runs trials
# on a machine without it); trainable() imports the space where it loads one.
if TYPE_CHECKING:
    from raybatch.space.search_space import SearchSpace

REPORT_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
REPORT_POLL_S = 0.2
"""How often Ray Train's controller takes the ranks' reports in a data-parallel trial (a
setting of the user's own stays)."""

_broken: list[str] = []
"""Why this process can no longer run a trial (a CUDA context broken by a sticky error): Tune
reuses processes, so the next trial refuses it (:class:`WorkerLostError`) for a fresh one."""


def _set_threads_to_assigned_cpus() -> None:
    """Packed CPU trials must not fight over cores: one torch thread per CPU the trial holds."""
    import torch

    ray = running_ray()
    if ray is None:  # a direct call outside Ray: leave torch's default
        return
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except AssertionError:  # Ray's answer in a driver process: nothing was assigned to it
        return
    if cpus:
        torch.set_num_threads(max(1, int(cpus)))


def _met(settings: TrialSettings, config: dict[str, Any]) -> TrialSettings:
    """The trial's settings, its target's value the level a confirmation run trains to where
    its config carries one (:data:`~raybatch.keys.MEET_LEVEL`): the race's two meet there."""
    level = config.get(keys.MEET_LEVEL)
    if level is None:
        return settings
    return replace(settings, target=replace(settings.target, value=float(level)))


def _options(settings: TrialSettings, config: dict[str, Any]) -> LoopOptions:
    """The loop options, with the trial's own seed when its config carries one."""
    return replace(settings.loop, seed=int(config.get(keys.SEED, settings.loop.seed)))


def _reporter(
    workload: Workload,
    space: SearchSpace,
    settings: TrialSettings,
    device: Any,
    report_fn: ReportFn | None,
    clock: Callable[[], float] | None = None,
    rung_marks: Sequence[float] = (),
) -> TrialReporter:
    """The trial's reporter: its target, marks, budgets, device clock and extras.

    With an agreed ``clock`` (data-parallel workers), the caps are checked at marks only: each
    reading of that clock is a collective every worker must join. ``rung_marks``: the rungs'
    training times when the trial was launched, evaluated at beside the geometric marks.
    """
    import torch

    # The rungs' training-time marks, sample marks a backstop beside them; a cadence the user
    # chose (an evaluation may be dear) is kept as given.
    timed = clock is None and settings.eval_every_samples is None
    eval_every = settings.eval_every_samples or default_eval_every(
        len(workload.train_dataset()),  # type: ignore[arg-type]
        space,
        BACKSTOP_EVALS_PER_EPOCH if timed else EVALS_PER_EPOCH,
    )
    return TrialReporter(
        settings.target,
        eval_every_samples=eval_every,
        max_time_s=settings.max_time_s,
        max_samples=settings.max_samples,
        report_fn=report_fn,
        clock=TrialClock(
            synchronize=(lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None,
            clock=clock if clock is not None else time.perf_counter,
        ),
        options=ReporterOptions(
            divergence_factor=settings.divergence_factor,
            extra=DeviceFigures(device),
            check_budgets_between_marks=clock is None,
            eval_at_s=[*time_marks(settings.max_time_s), *rung_marks] if timed else (),
            pause_at_s=[*rung_grid(settings.max_time_s), *rung_marks] if timed else (),
        ),
    )


def run_trial(
    workload: Workload,
    space: SearchSpace,
    settings: TrialSettings,
    config: dict[str, Any],
    report_fn: ReportFn | None = None,
) -> TrialReporter:
    """One trial, start to terminal status. Returns the reporter (its final state).

    Whatever the workload raises — building the model, loading its data, training — ends the
    trial as ``error`` with the exception's type and first line as the reason and its traceback
    in the final report; it never raises into Ray, so the search goes on (or, when every trial
    fails the same way, stops early: :mod:`raybatch.run.failfast`). The one exception is a
    data-parallel trial that lost a worker's process or node (:class:`WorkerLostError`): the
    machine's fault, not the recipe's, raised into Ray Tune so that it runs the trial again, as
    it does a single trial whose worker died.
    """

    # What the trial costs starts here, not at its clock (its process's start-up, if first).
    held_since, startup_s = process_age.start_trial()
    settings = _met(settings, config)
    if _broken:
        raise WorkerLostError(f"this trial's process is unusable: {_broken[0]}")
    during = "reading the trial's recipe"
    try:
        recipe = space.recipe_of(config)  # knobs the space refuses end the trial, not Ray's
        options = _options(settings, config)
        if recipe.world_size > 1:  # its workers choose their own devices
            return _run_distributed(workload, space, settings, config, report_fn)
        during = "choosing the trial's device"
        device = trial_device(settings.device)
        during = "loading the training data"
        reporter = _reporter(workload, space, settings, device, report_fn,
                             rung_marks=config.get(keys.RUNG_MARKS) or ())  # fmt: skip
    except WorkerLostError:
        raise  # into Ray Tune, which retries the trial (FailureConfig.max_failures)
    except Exception as exc:  # no recipe, no device or no data: no reporter to use yet
        reporter = _bare_reporter(settings, report_fn)
        reporter.clock.held_since, reporter.clock.startup_s = held_since, startup_s
        reporter.fail(exc, during)
        return reporter
    reporter.clock.held_since, reporter.clock.startup_s = held_since, startup_s
    _set_threads_to_assigned_cpus()
    share = assigned_gpu_share()
    if share:  # the searcher retries a trial that ran out of memory while sharing its GPU
        reporter.note(keys.GPU_SHARE, share)
    told_to_stop = False
    try:
        if device.type == "cuda":  # what a previous trial in this process left cached
            release_memory(device)
        limit_packed_memory(device, settings.gpu_budget_bytes, settings.cuda_context_bytes)
        if _memory_gate(workload, recipe, settings, device, reporter):
            measure = at_target_measure(workload, space, recipe, device, config, reporter.step_s,
                                        packed=0 < (share or 0) < 1)  # fmt: skip
            train(workload, recipe, reporter, device, options, at_target=measure,
                  **checkpointing(to_tune=report_fn is None))  # fmt: skip
    except Exception as exc:  # a failure ends this trial with a reason, never the search
        reporter.fail(exc, "while training" if reporter.started else "before training")
    except BaseException:  # Tune stopping the trial (a SystemExit out of its report call)
        told_to_stop = True  # no report may follow: it would wait on Tune for ever
        raise
    finally:
        try:  # a sticky CUDA error (an illegal access) raises again here: not into Ray
            release_memory(device)
        except Exception as exc:
            _broken.append(f"{type(exc).__name__} releasing an earlier trial's GPU memory")
            if not (reporter.stopped or told_to_stop):
                reporter.fail(exc, "releasing the trial's GPU memory")
        reporter.close()
    if not reporter.stopped:
        reporter.finish(TrialStatus.CENSORED, "training stopped before the target")
    return reporter


def _bare_reporter(settings: TrialSettings, report_fn: ReportFn | None) -> TrialReporter:
    """A reporter for a trial that failed before its own could be built."""
    return TrialReporter(
        settings.target, eval_every_samples=1, max_time_s=settings.max_time_s,
        report_fn=report_fn,
    )  # fmt: skip


def _memory_gate(
    workload: Workload,
    recipe: TrialConfig,
    settings: TrialSettings,
    device: Any,
    reporter: TrialReporter,
) -> bool:
    """Probe on CUDA, pre-screen on CPU with a budget; False (and reported) when it won't fit."""

    ema = settings.loop.ema_decay is not None  # the EMA holds one more copy of the model
    if device.type == "cuda":
        result = probe(workload, recipe, str(device), model_copies=2 if ema else 1)
        if not result.fits:  # its peak is where it ran out, not the step's: never calibrates
            reporter.finish(TrialStatus.INFEASIBLE_MEMORY, result.as_prescreen(None).reason)
            return False
        reserved = result.max_reserved_bytes
        if ema and reserved is not None:  # the estimate is of a plain step: calibrate on that
            reserved -= result.model_bytes or 0  # the copy the probe built, counted there
        reporter.note(keys.PROBE_RESERVED_BYTES, reserved)
        over = _ddp_overrun(workload, recipe, settings, result.max_reserved_bytes)
        if over is not None:
            reporter.finish(TrialStatus.INFEASIBLE_MEMORY, over)
            return False
        import torch

        torch.cuda.reset_peak_memory_stats(device)
        return True
    if settings.memory_budget is None:
        return True
    # Here, not at the top: only a CPU trial with a budget traces its step (fake tensors);
    # a GPU trial's worker never imports the estimator.
    from raybatch.memory.estimator import MemoryEstimator

    budget = parse_size(settings.memory_budget)
    if ema:  # the trace estimates a plain step; the EMA's copy comes on top of it
        budget -= model_bytes(workload.build_model())
    verdict = MemoryEstimator(workload, recipe, cuda=False).prescreen(recipe, budget)
    if verdict.fits is False:
        reporter.finish(TrialStatus.INFEASIBLE_MEMORY, verdict.reason)
        return False
    return True


def _ddp_overrun(
    workload: Workload, recipe: TrialConfig, settings: TrialSettings, reserved: int | None
) -> str | None:
    """Why a data-parallel worker's probed step will not fit once DDP wraps it, or ``None``.

    The probe runs one plain step; under DDP each worker also holds its gradient buckets, one
    more copy of the trainable parameters (``gradient_as_bucket_view=False``, the default).
    """
    if recipe.world_size <= 1 or settings.gpu_budget_bytes is None or reserved is None:
        return None

    buckets = sum(
        p.numel() * p.element_size() for p in workload.build_model().parameters() if p.requires_grad
    )
    if reserved + buckets <= settings.gpu_budget_bytes:
        return None
    return (
        f"micro batch {recipe.micro_batch_size}: the real step reserved {format_bytes(reserved)},"
        f" and DDP's gradient buckets add {format_bytes(buckets)}: over the budget of"
        f" {format_bytes(settings.gpu_budget_bytes)}"
    )


def _worker(loop_config: dict[str, Any]) -> None:
    """Ray Train worker: one rank of a data-parallel trial, memory-gated like a single one."""
    import ray.train
    import ray.train.torch

    workload: Workload = loop_config["workload"]
    space: SearchSpace = loop_config["space"]
    settings: TrialSettings = loop_config["settings"]
    config: dict[str, Any] = loop_config["config"]
    recipe = space.recipe_of(config)
    device = ray.train.torch.get_device()
    reporter = _reporter(
        workload, space, settings, device, ray.train.report, clock=agreed_clock(device)
    )
    _set_threads_to_assigned_cpus()
    try:
        gate = _Silent(settings)
        if not _memory_gate(workload, recipe, settings, device, gate):
            rank = ray.train.get_context().get_world_rank()
            raise WorkerMemoryError(f"rank {rank}: {gate.reason}")
        # Placed and gated: report once now (every rank, as Ray Train wants), so that the
        # trial's hang clock runs from here and not from its wait for the workers' GPUs.
        ray.train.report({**reporter.metrics(), keys.WORKERS_PLACED: True})
        train(workload, recipe, reporter, device, _options(settings, config), distributed=True)
    except Exception as exc:
        if is_out_of_memory(exc):
            raise WorkerMemoryError(f"out of memory while training: {exc}") from None
        raise
    finally:
        reporter.close()
    if not reporter.stopped:
        reporter.finish(TrialStatus.CENSORED, "training stopped before the target")


class _Silent(TrialReporter):
    """A reporter that records a worker's gate verdict without reporting it: the verdict
    travels back as :class:`WorkerMemoryError`, and only a rank that trains reports."""

    def __init__(self, settings: TrialSettings) -> None:
        super().__init__(
            settings.target,
            eval_every_samples=1,
            max_time_s=settings.max_time_s,
            report_fn=lambda _: None,
        )


def _run_distributed(
    workload: Workload,
    space: SearchSpace,
    settings: TrialSettings,
    config: dict[str, Any],
    report_fn: ReportFn | None,
) -> TrialReporter:
    """Launch ``world_size`` Ray Train workers from inside this Tune trial.

    Whether the workers take GPUs comes from the search (``data_parallel_gpus``), never from
    the devices this 0-GPU trial happens to see. A recipe the cluster cannot place ends at
    once (``error``, with the count) instead of waiting for a placement group; one that does
    not fit the GPUs ends ``infeasible_memory`` (the workers' gate or OOM).
    """
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    reporter = _bare_reporter(settings, report_fn)
    recipe = space.recipe_of(config)
    use_gpu = settings.data_parallel_gpus
    if use_gpu is None:
        use_gpu = ray.is_initialized() and ray.cluster_resources().get("GPU", 0.0) >= 1
    problem = placement_problem(recipe.world_size, use_gpu, settings.gpu_model)
    if problem is not None:
        reporter.finish(TrialStatus.ERROR, f"cannot be placed: {problem}")
        return reporter
    if not use_gpu and settings.memory_budget is not None:
        # On CPUs each rank's gate is this same trace: here, before Ray Train starts a worker.
        import torch

        gate = _Silent(settings)
        if not _memory_gate(workload, recipe, settings, torch.device("cpu"), gate):
            reporter.finish(TrialStatus.INFEASIBLE_MEMORY, f"data-parallel run: {gate.reason}")
            return reporter
    storage = tempfile.mkdtemp(prefix="raybatch-train-")  # Ray Train's own files, this run's
    trainer = TorchTrainer(
        _worker,
        train_loop_config={
            "workload": workload,
            "space": space,
            "settings": settings,
            "config": dict(config),
        },
        scaling_config=ScalingConfig(
            num_workers=recipe.world_size,
            use_gpu=use_gpu,
            resources_per_worker={
                "CPU": 1,
                **({"GPU": 1, **model_resource(settings.gpu_model)} if use_gpu else {}),
            },
        ),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=RunConfig(
            name=f"raybatch_dp_{os.getpid()}",
            storage_path=storage,
            callbacks=[TuneReportCallback()],  # type: ignore[list-item]
        ),
    )
    # Ray Train's controller takes a rank's report once a poll (its queue holds one), every 2 s
    # by default: each report blocked the ranks up to 2 s (a six-step trial held 22 s of wall
    # clock, and 1 s of it entered its training time). Ray Train passes the setting on to it.
    os.environ.setdefault(REPORT_POLL_ENV, str(REPORT_POLL_S))
    try:
        trainer.fit()
    except Exception as exc:
        memory = memory_failure(exc)
        lost = None if memory is not None else lost_worker(exc)
        if memory is not None:
            reporter.finish(TrialStatus.INFEASIBLE_MEMORY, f"data-parallel run: {memory}")
        elif lost is not None:  # the node, not the recipe: Tune's retry, as for one trial
            raise WorkerLostError(f"a data-parallel worker was lost: {lost}") from exc
        else:
            reporter.fail(exc, "in the data-parallel run")
    finally:  # one folder per data-parallel trial would pile up in /tmp over a search
        shutil.rmtree(storage, ignore_errors=True)
    return reporter


def trainable(
    workload: Workload,
    space: SearchSpace | str,
    target: Target | float | str,
    **settings: Any,
) -> Callable[[dict[str, Any]], None]:
    """A Ray Tune function trainable for ``workload`` over ``space``, aiming at ``target``.

    Args:
        workload: The workload (model, data, loss, metric).
        space: A :class:`SearchSpace` or a preset name / path.
        target: The validation metric to reach: a :class:`Target`, text (``loss<=0.35``) or a
            number (the workload's first metric, in its direction). Checked against the
            workload's metrics now, so an unreachable target fails before any trial.
        **settings: Fields of :class:`~raybatch.trial.settings.TrialSettings` (``max_time_s``,
            ``memory_budget``, ...) and of :class:`~raybatch.trial.loop.LoopOptions`
            (``grad_clip_norm``, ``ema_decay``...); an unknown name raises ``TypeError``.

    The returned function carries its workload, space and settings
    (:func:`raybatch.trial.settings.parts_of`): :meth:`RaybatchSearcher.for_trainable`,
    :meth:`CappingScheduler.for_trainable` and :func:`raybatch.with_resources` read them, so
    the penalty, the time cap and the resources follow from this one call.

    Example:
        >>> import raybatch
        >>> from raybatch.examples.digits import workload
        >>> fn = raybatch.trainable(workload, "digits_cnn_sgd", target=0.97, max_time_s=30)
        >>> # tune.Tuner(raybatch.with_resources(fn, ...), param_space=..., ...)
    """

    # pydantic and YAML stay out of a trial's worker, which imports this module to run it.
    from raybatch.space.presets import load_space
    from raybatch.space.search_space import SearchSpace

    resolved = space if isinstance(space, SearchSpace) else load_space(space)
    ship_by_value(workload)  # a workload from a file, script or notebook reaches every node
    target = resolve_target(target, workload.metrics)
    parts = TrialParts(workload, resolved, settings_of(target, resolved.sync_batchnorm, **settings))

    def raybatch_trial(config: dict[str, Any]) -> None:
        # The parts it carries when called: with_resources sets the budget and the context
        # measured on a cluster on the function itself.
        now: TrialParts = getattr(raybatch_trial, PARTS_ATTRIBUTE)
        run_trial(now.workload, now.space, now.settings, config)

    raybatch_trial.__name__ = f"raybatch_{workload.name}"
    raybatch_trial.__qualname__ = raybatch_trial.__name__
    setattr(raybatch_trial, PARTS_ATTRIBUTE, parts)
    return raybatch_trial


__all__ = ["run_trial", "trainable"]
