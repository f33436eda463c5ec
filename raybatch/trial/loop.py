"""raybatch's own training loop: one trial of a recipe, done the way the rules require.

- the loss is divided by the accumulation steps, and the optimizer step, the LR scheduler
  step, gradient clipping and the EMA update happen only on the accumulation boundary, so k
  micro batches of b update the model exactly as one batch of k x b would;
- linear LR warmup over the recipe's ``warmup_steps``, then constant; optional autocast (bf16,
  or fp16 with a ``GradScaler`` on CUDA); deterministic seeding per trial;
- ``drop_last`` on the training loader (and the ``DistributedSampler``), so no worker ever gets
  an empty or short batch;
- a :class:`~raybatch.trial.reporting.TrialReporter` owns the clock, the marks, the target
  check and the statuses; evaluation is timed apart and kept out of the objective;
- no cost a hand-written loop would not pay, which would tax small batches (more steps) more:
  batches fetched in one call (:mod:`raybatch.batches`), evaluation in large batches, and on
  CUDA no host synchronisation between marks;
- data-parallel: ``DistributedDataParallel`` (``no_sync`` inside an accumulation window),
  optional ``SyncBatchNorm``, and every decision that stops the loop agreed by an all-reduce,
  so no worker is left waiting in a collective.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raybatch import keys
from raybatch.batches import eval_batch_size, eval_batches, train_batches
from raybatch.errors import first_line
from raybatch.metric import metric_values, target_value
from raybatch.space.config import TrialConfig, warmup_factor, warmup_scheduler
from raybatch.trial.ema import WeightAverage
from raybatch.trial.pause import Saver, capture, restore, set_rng_state
from raybatch.trial.reporting import TrialReporter
from raybatch.trial.validation import EARLY_FRACTION, Validation, subset_of
from raybatch.workload import Workload, autocast_context

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopOptions:
    """How a trial trains, beyond the recipe itself.

    Attributes:
        grad_clip_norm: Clip the gradient norm to this on each optimizer step (``None``: off).
        ema_decay: Keep an exponential moving average of the weights (updated on optimizer
            steps) and evaluate it instead of the raw weights (``None``: off).
        eval_batch_size: Batch size for validation (``None``: a large one for the device,
            see :func:`raybatch.batches.eval_batch_size`). Evaluation time is not in
            the objective, so this changes ``eval_s`` only, never a verdict.
        num_workers: ``DataLoader`` worker processes for the training data.
        early_eval: The share of the validation set read by evaluations far from the target
            (a fixed subset, the same in every trial; the whole set near the target and
            whenever the target is reached: :mod:`raybatch.trial.validation`); 0 or 1 reads
            the whole set at every evaluation.
        seed: Seed of model initialisation and data order.
        sync_batchnorm: Convert BatchNorm layers to SyncBatchNorm when data-parallel.
    """

    grad_clip_norm: float | None = None
    ema_decay: float | None = None
    eval_batch_size: int | None = None
    num_workers: int = 0
    early_eval: float = EARLY_FRACTION
    seed: int = 0
    sync_batchnorm: bool = False


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and PyTorch (CPU and CUDA) generators."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class _Distributed:
    """The pieces of ``torch.distributed`` the loop needs, in one place."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def mean(self, values: list[float], device: torch.device) -> list[float]:
        import torch

        t = torch.tensor(values, dtype=torch.float64, device=device)
        self.dist.all_reduce(t)
        return [v / self.world_size for v in t.tolist()]


def agreed_clock(device: torch.device) -> Any:
    """A clock whose readings are the same on every worker (the mean of their clocks)."""
    dist = _Distributed()
    base = time.perf_counter()

    def clock() -> float:
        return dist.mean([time.perf_counter() - base], device)[0]

    return clock


@dataclass
class LoopParts:
    """What one optimizer step touches: the model (bare and as trained), its optimizer,
    warmup scheduler, optional EMA copy and fp16 scaler, and the distributed helper."""

    model: nn.Module
    trained: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    ema: Any
    scaler: Any
    dist: _Distributed | None
    taken: int = 0
    """Micro batches taken so far: where the data goes on for a resumed trial."""

    def evaluated(self) -> nn.Module:
        return self.ema.module if self.ema is not None else self.model


def _build(
    workload: Workload,
    config: TrialConfig,
    device: torch.device,
    options: LoopOptions,
    distributed: bool,
) -> LoopParts:
    import torch

    dist = _Distributed() if distributed else None
    model: nn.Module = workload.build_model()
    if dist is not None and options.sync_batchnorm:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model.to(device)
    optimizer = workload.build_optimizer(model, config)
    trained: nn.Module = model
    if dist is not None:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        trained = DistributedDataParallel(model, device_ids=ids)
    scheduler = warmup_scheduler(optimizer, config.warmup_steps)
    ema = None
    if options.ema_decay is not None:
        ema = WeightAverage(model, options.ema_decay)
    scaler = None
    if workload.amp_dtype == "fp16" and device.type == "cuda":
        scaler = torch.amp.GradScaler("cuda")
    return LoopParts(model, trained, optimizer, scheduler, ema, scaler, dist)


def _train_batches(
    workload: Workload,
    config: TrialConfig,
    device: torch.device,
    options: LoopOptions,
    dist: _Distributed | None,
    start: int = 0,
) -> Iterator[Any]:
    """Training micro batches on ``device``, epoch after epoch, reshuffled each epoch, from the
    ``start``-th on (a resumed trial)."""
    return train_batches(
        workload.train_dataset(),
        config.micro_batch_size,
        device,
        seed=options.seed,
        num_workers=options.num_workers,
        rank=dist.rank if dist is not None else 0,
        world_size=dist.world_size if dist is not None else 1,
        collate=workload.collate(),
        start=start,
    )


def optimizer_step(parts: LoopParts, options: LoopOptions) -> None:
    """The accumulation boundary: clip, step (scaled under fp16), schedule, zero, EMA."""
    import torch

    if options.grad_clip_norm is not None:
        if parts.scaler is not None:
            parts.scaler.unscale_(parts.optimizer)
        torch.nn.utils.clip_grad_norm_(parts.model.parameters(), options.grad_clip_norm)
    stepped = True
    if parts.scaler is not None:
        # GradScaler skips the optimizer step when the scaled gradients overflowed, and then
        # lowers the scale; the LR schedule and the EMA must skip that step too, or warmup
        # ends early and the average takes in weights that were never updated. Reading the
        # scale is one more host sync, where the scaler's own found_inf check already waits.
        scale = parts.scaler.get_scale()
        parts.scaler.step(parts.optimizer)
        parts.scaler.update()
        stepped = parts.scaler.get_scale() >= scale
    else:
        parts.optimizer.step()
    if stepped:
        parts.scheduler.step()
    parts.optimizer.zero_grad(set_to_none=True)
    if parts.ema is not None and stepped:
        parts.ema.update(parts.model)


def _evaluate(
    parts: LoopParts,
    workload: Workload,
    validation: Validation,
    device: torch.device,
    reporter: TrialReporter,
) -> None:
    """Evaluate at a mark (the EMA weights when kept), agreed across workers, and report:
    on the early subset or the whole set (:class:`Validation`; the workers agree, as they
    decide on the same mean values)."""
    evaluated = parts.evaluated()

    def run(batches: Iterator[Any]) -> dict[str, float]:
        values = metric_values(workload.evaluate(evaluated, batches), workload.metrics)
        if parts.dist is not None:
            values = dict(zip(values, parts.dist.mean(list(values.values()), device), strict=True))
        return values

    with reporter.evaluating():
        evaluated.eval()
        values, whole = validation.evaluate(run)
        parts.trained.train()
    reporter.note(keys.EVAL_WHOLE, whole)
    if whole and validation.near:
        reporter.near_target()  # the time to target read within 15 %, not sqrt(3)
    reporter.report(target_value(values, reporter.target.metric), values=values)


def reads_loss_every_step(device: torch.device, distributed: bool) -> bool:
    """Whether the loop reads the loss at every optimizer step, or only at marks.

    Reading a CUDA tensor waits for the device: once per step, that sync makes small,
    launch-bound batches look slower than they are. There the loss is summed on the device
    and read at marks (a divergence is then caught at the next mark); data-parallel, every
    read is also an all-reduce. On one CPU process a read costs nothing, so a NaN stops the
    trial at once.
    """
    return device.type == "cpu" and not distributed


def read_loss(total: torch.Tensor, count: int) -> float:
    """The mean of ``count`` summed losses, read back to the host (a device sync on CUDA)."""
    return float(total) / count


class _LossWindow:
    """The losses since the last read: summed on the device, or on the host when read each
    step (a host float costs no kernel launch)."""

    def __init__(self, device: torch.device, on_device: bool) -> None:
        import torch

        self.total = torch.zeros((), device=device) if on_device else None
        self.host_total = 0.0
        self.count = 0

    def add(self, loss: torch.Tensor) -> None:
        if self.total is not None:
            self.total += loss.detach().float()
        else:
            self.host_total += float(loss.detach())
        self.count += 1

    def read(self) -> float:
        """The mean loss of the window, which starts afresh."""
        if self.total is not None:
            mean = read_loss(self.total, self.count)
            self.total.zero_()
        else:
            mean = self.host_total / self.count
            self.host_total = 0.0
        self.count = 0
        return mean


def train(
    workload: Workload,
    config: TrialConfig,
    reporter: TrialReporter,
    device: torch.device,
    options: LoopOptions,
    distributed: bool = False,
    at_target: Callable[[nn.Module, torch.optim.Optimizer, Any], dict[str, Any]] | None = None,
    resume: dict[str, Any] | None = None,
    save: bool = False,
) -> None:
    """Train ``config`` until the reporter says stop (target, budget, divergence).

    ``at_target`` runs on the trained model, its optimizer and its fp16 scaler (or ``None``)
    once the target is reached, before the final report, which carries what it returns
    (:attr:`TrialReporter.at_target`). ``resume`` is a paused trial's state, to go on from;
    ``save``: evaluations' reports carry the state (:mod:`raybatch.trial.pause`; one process).
    """
    parts, validation = _start(workload, config, device, options, distributed, reporter)
    rng = None
    if resume is not None:
        try:
            restore(parts, validation, reporter, resume)
            rng = resume["rng"]
        except Exception as exc:  # another format, another model: trained afresh, said
            log.warning(f"the trial's saved state does not fit it ({type(exc).__name__}:"
                        f" {first_line(exc)}): it trains again from its first step")  # fmt: skip
            parts, validation = _start(workload, config, device, options, distributed, reporter)
    if at_target is not None:
        reporter.at_target = functools.partial(at_target, parts.model, parts.optimizer,
                                               parts.scaler)  # fmt: skip
    saver = (Saver(functools.partial(capture, parts, validation, reporter),
                   rungs=reporter.options.pause_at_s) if save else None)  # fmt: skip
    reporter.channel.saver = saver
    try:
        _run(workload, config, reporter, device, options, parts, validation, rng)
    finally:
        reporter.channel.saver = None
        if saver is not None:
            saver.close()


def _start(
    workload: Workload,
    config: TrialConfig,
    device: torch.device,
    options: LoopOptions,
    distributed: bool,
    reporter: TrialReporter,
) -> tuple[LoopParts, Validation]:
    """The trial's parts, seeded, and its validation (the set and its collate read once:
    every evaluation iterates them afresh)."""
    seed_everything(options.seed)
    parts = _build(workload, config, device, options, distributed)
    eval_batch = eval_batch_size(options.eval_batch_size, device, config.micro_batch_size)
    val_set, collate = workload.val_dataset(), workload.eval_collate()
    early = subset_of(val_set, options.early_eval)
    validation = Validation(
        functools.partial(eval_batches, val_set, eval_batch, device, collate),
        None if early is None else functools.partial(eval_batches, early, eval_batch, device,
                                                     collate),
        reporter.target,
    )  # fmt: skip
    return parts, validation


def _run(
    workload: Workload,
    config: TrialConfig,
    reporter: TrialReporter,
    device: torch.device,
    options: LoopOptions,
    parts: LoopParts,
    validation: Validation,
    rng: dict[str, Any] | None,
) -> None:
    """The loop itself, from the micro batches ``parts`` has taken on; a resumed trial's
    generators (``rng``) put back last, right before its clock starts."""
    it = _train_batches(workload, config, device, options, parts.dist, start=parts.taken)
    every_step = reads_loss_every_step(device, parts.dist is not None)
    accumulation = config.accumulation_steps
    samples_per_step = config.micro_batch_size * accumulation * config.world_size
    window = _LossWindow(device, on_device=not every_step)
    parts.trained.train()
    if rng is not None:
        set_rng_state(rng)
    reporter.start()
    while not reporter.stopped:
        wait_start = time.perf_counter()
        batch = next(it)
        reporter.add_data_wait(time.perf_counter() - wait_start)
        parts.taken += 1
        boundary = parts.taken % accumulation == 0
        # Inside an accumulation window DDP need not all-reduce: only the boundary syncs.
        no_sync: Any = nullcontext()
        if parts.dist is not None and not boundary:
            no_sync = parts.trained.no_sync()  # type: ignore[operator]
        with no_sync:
            with autocast_context(workload, device.type):
                loss = workload.loss(parts.trained, batch)
            scaled = loss / accumulation if accumulation > 1 else loss
            (parts.scaler.scale(scaled) if parts.scaler is not None else scaled).backward()
        window.add(loss)
        del loss, scaled, batch
        if not boundary:
            continue
        optimizer_step(parts, options)
        stopped = reporter.add(samples=samples_per_step, steps=1)
        if every_step or stopped or reporter.eval_due:
            step_loss = window.read()
            if parts.dist is not None:
                step_loss = parts.dist.mean([step_loss], device)[0]
            stopped = reporter.check_loss(step_loss) or stopped
        if stopped:
            break
        if reporter.eval_due:
            # The schedule's own steps (an fp16 step the scaler skipped does not move it).
            ramp = warmup_factor(parts.scheduler.last_epoch, config.warmup_steps)
            reporter.note(keys.WARMING_UP, ramp < 1.0)
            _evaluate(parts, workload, validation, device, reporter)
