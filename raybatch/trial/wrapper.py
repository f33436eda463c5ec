"""A Ray Tune trainable made from a workload, a space and a target.

``raybatch.trainable(workload, space, target)`` returns a plain Tune function trainable; use
it in ``tune.Tuner`` like any other (wrap it in :func:`raybatch.with_resources` for per-trial
GPUs/CPUs). For each trial it:

1. derives the recipe from the trial's raw knobs with the space's rules;
2. gates memory before the clock starts: on CUDA one real probe step; on a CPU-only machine
   with a ``memory_budget``, the trace pre-screen. Too big ends the trial as
   ``infeasible_memory`` with the numbers, costing no training time;
3. trains with raybatch's loop (:mod:`raybatch.trial.loop`), evaluating at fixed sample marks, and
   stops at the target, the time/sample cap, or divergence;
4. reports at every evaluation and ends with exactly one terminal status (see
   :mod:`raybatch.trial.status`). Failures inside the trial — out of memory mid-training, a crash —
   end *the trial* with a reason; they never raise into Ray, so the search goes on.

``world_size > 1`` runs the trial data-parallel through Ray Train's ``TorchTrainer`` (gloo on
CPU, NCCL on GPU), launched from inside the Tune trial (Ray Train V2's pattern); rank 0's
reports reach Tune.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from raybatch import keys
from raybatch.metric import Target, resolve_target
from raybatch.space.config import TrialConfig
from raybatch.space.presets import load_space
from raybatch.space.search_space import SearchSpace
from raybatch.trial.loop import LoopOptions, agreed_clock, train
from raybatch.trial.reporting import ReportFn, TrialReporter
from raybatch.trial.status import TrialStatus
from raybatch.workload import Workload

EVALS_PER_EPOCH = 4


@dataclass(frozen=True)
class TrialSettings:
    """Everything a trial needs besides its config (picklable, sent to every trial).

    Attributes:
        target: The metric value to reach.
        max_time_s: Cap on a trial's training time (evaluation excluded); a censored trial's
            objective is 10x this (PAR-10).
        max_samples: Optional sample budget per trial.
        eval_every_samples: Sample mark spacing; ``None`` picks about a quarter epoch,
            rounded up to a multiple of the space's largest effective batch so that, for
            power-of-two batch choices, every trial evaluates exactly on the marks.
        divergence_factor: Loss above this multiple of the initial loss is divergence.
        memory_budget: Bytes (or "8GiB") for the CPU-side pre-screen when no GPU is present.
        device: ``auto`` (the trial's GPU if it holds one, else CPU), ``cpu`` or ``cuda``.
        loop: Options of the training loop.
    """

    target: Target
    max_time_s: float = 600.0
    max_samples: int | None = None
    eval_every_samples: int | None = None
    divergence_factor: float = 10.0
    memory_budget: str | int | None = None
    device: str = "auto"
    loop: LoopOptions = field(default_factory=LoopOptions)


def default_eval_every(train_size: int, space: SearchSpace) -> int:
    """About a quarter epoch, rounded up to a multiple of the largest effective batch."""
    quarter = max(train_size // EVALS_PER_EPOCH, 1)
    largest = space.max_effective_batch_size()
    return math.ceil(quarter / largest) * largest


def _device(settings: TrialSettings) -> Any:
    import torch

    if settings.device == "cpu":
        return torch.device("cpu")
    if settings.device.startswith("cuda") or (
        settings.device == "auto" and torch.cuda.is_available()
    ):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _set_threads_to_assigned_cpus() -> None:
    """Packed CPU trials must not fight over cores: one torch thread per CPU the trial holds."""
    import ray
    import torch

    if not ray.is_initialized():  # a direct call outside Ray: leave torch's default
        return
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except AssertionError:  # Ray's answer in a driver process: nothing was assigned to it
        return
    if cpus:
        torch.set_num_threads(max(1, int(cpus)))


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
) -> TrialReporter:
    """The trial's reporter: its target, marks, budgets, device clock and extras.

    With an agreed ``clock`` (data-parallel workers), the caps are checked at marks only: each
    reading of that clock is a collective every worker must join.
    """
    import torch

    from raybatch.trial.gpu_monitor import DeviceFigures

    eval_every = settings.eval_every_samples or default_eval_every(
        len(workload.train_dataset()),  # type: ignore[arg-type]
        space,
    )
    return TrialReporter(
        settings.target,
        eval_every_samples=eval_every,
        max_time_s=settings.max_time_s,
        max_samples=settings.max_samples,
        divergence_factor=settings.divergence_factor,
        report_fn=report_fn,
        synchronize=(lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None,
        extra=DeviceFigures(device),
        clock=clock if clock is not None else time.perf_counter,
        check_budgets_between_marks=clock is None,
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
    fails the same way, stops early: :mod:`raybatch.run.failfast`).
    """
    from raybatch.memory.probe import release_memory

    recipe = space.derive_from(config)
    options = _options(settings, config)
    device = _device(settings)
    try:
        reporter = _reporter(workload, space, settings, device, report_fn)
    except Exception as exc:  # the workload's data cannot be loaded: no reporter to use yet
        reporter = TrialReporter(
            settings.target, eval_every_samples=1, max_time_s=settings.max_time_s,
            report_fn=report_fn,
        )  # fmt: skip
        reporter.fail(exc, "loading the training data")
        return reporter
    if recipe.world_size > 1:
        return _run_distributed(workload, space, settings, config, reporter, device)
    _set_threads_to_assigned_cpus()
    try:
        if _memory_gate(workload, recipe, settings, device, reporter):
            train(workload, recipe, reporter, device, options)
    except Exception as exc:  # a failure ends this trial with a reason, never the search
        reporter.fail(exc, "while training" if reporter.started else "before training")
    finally:
        release_memory(device)
        reporter.close()
    if not reporter.stopped:
        reporter.finish(TrialStatus.CENSORED, "training stopped before the target")
    return reporter


def _memory_gate(
    workload: Workload,
    recipe: TrialConfig,
    settings: TrialSettings,
    device: Any,
    reporter: TrialReporter,
) -> bool:
    """Probe on CUDA, pre-screen on CPU with a budget; False (and reported) when it won't fit."""
    from raybatch.memory.probe import probe

    if device.type == "cuda":
        result = probe(workload, recipe, str(device))
        if not result.fits:
            reporter.finish(TrialStatus.INFEASIBLE_MEMORY, result.as_prescreen(None).reason)
            return False
        import torch

        torch.cuda.reset_peak_memory_stats(device)
        return True
    if settings.memory_budget is None:
        return True
    from raybatch.memory import MemoryEstimator
    from raybatch.memory.budget import parse_size

    budget = parse_size(settings.memory_budget)
    verdict = MemoryEstimator(workload, recipe).prescreen(recipe, budget)
    if verdict.fits is False:
        reporter.finish(TrialStatus.INFEASIBLE_MEMORY, verdict.reason)
        return False
    return True


def _worker(loop_config: dict[str, Any]) -> None:
    """Ray Train worker: one rank of a data-parallel trial."""
    import ray.train
    import ray.train.torch

    workload: Workload = loop_config["workload"]
    space: SearchSpace = loop_config["space"]
    settings: TrialSettings = loop_config["settings"]
    config: dict[str, Any] = loop_config["config"]
    recipe = space.derive_from(config)
    device = ray.train.torch.get_device()
    reporter = _reporter(
        workload, space, settings, device, ray.train.report, clock=agreed_clock(device)
    )
    _set_threads_to_assigned_cpus()
    try:
        train(workload, recipe, reporter, device, _options(settings, config), distributed=True)
    finally:
        reporter.close()
    if not reporter.stopped:
        reporter.finish(TrialStatus.CENSORED, "training stopped before the target")


def _run_distributed(
    workload: Workload,
    space: SearchSpace,
    settings: TrialSettings,
    config: dict[str, Any],
    reporter: TrialReporter,
    device: Any,
) -> TrialReporter:
    """Launch ``world_size`` Ray Train workers from inside this Tune trial."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    recipe = space.derive_from(config)
    use_gpu = device.type == "cuda"
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
            resources_per_worker={"CPU": 1, **({"GPU": 1} if use_gpu else {})},
        ),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=RunConfig(
            name=f"raybatch_dp_{os.getpid()}",
            storage_path=tempfile.mkdtemp(prefix="raybatch-train-"),
            callbacks=[TuneReportCallback()],  # type: ignore[list-item]
        ),
    )
    try:
        trainer.fit()
    except Exception as exc:
        reporter.fail(exc, "in the data-parallel run")
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
        **settings: Fields of :class:`TrialSettings` (``max_time_s``, ``memory_budget``, ...)
            and of :class:`~raybatch.trial.loop.LoopOptions` (``grad_clip_norm``, ``ema_decay``...).

    Example:
        >>> import raybatch
        >>> from raybatch.examples.digits import workload
        >>> fn = raybatch.trainable(workload, "digits_cnn_sgd", target=0.97, max_time_s=30)
        >>> # tune.Tuner(raybatch.with_resources(fn, ...), param_space=..., ...)
    """
    from raybatch.shipping import ship_by_value

    resolved = space if isinstance(space, SearchSpace) else load_space(space)
    # The closure below carries the workload to Ray's workers: send its code by value, so a
    # workload from a file, a script or a notebook works on every node (raybatch.shipping).
    ship_by_value(workload)
    loop_fields = {f for f in LoopOptions.__dataclass_fields__}
    loop_settings = {k: v for k, v in settings.items() if k in loop_fields}
    loop_settings.setdefault("sync_batchnorm", resolved.sync_batchnorm)
    loop = LoopOptions(**loop_settings)
    trial_settings = TrialSettings(
        target=resolve_target(target, workload.metrics),
        loop=loop,
        **{k: v for k, v in settings.items() if k not in loop_fields},
    )

    def raybatch_trial(config: dict[str, Any]) -> None:
        run_trial(workload, resolved, trial_settings, config)

    raybatch_trial.__name__ = f"raybatch_{workload.name}"
    raybatch_trial.__qualname__ = raybatch_trial.__name__
    return raybatch_trial


__all__ = ["TrialSettings", "default_eval_every", "run_trial", "trainable"]
