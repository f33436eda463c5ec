"""raybatch's own training loop: one trial of a recipe, done the way the rules require.

- the loss is divided by the accumulation steps, and the optimizer step, the LR scheduler
  step, gradient clipping and the EMA update happen only on the accumulation boundary (seed
  003, Pitfalls 4 and 8), so k micro batches of b update the model exactly as one batch of
  k x b would;
- linear LR warmup over the recipe's ``warmup_steps`` optimizer steps, then constant;
- optional autocast (bf16, or fp16 with a ``GradScaler`` on CUDA);
- ``drop_last`` on the training loader (and on the ``DistributedSampler`` when data-parallel)
  so no worker ever gets an empty or short batch (seed 004);
- deterministic seeding per trial (model init, data order);
- evaluation at fixed *sample* marks through a :class:`~raybatch.reporting.TrialReporter`,
  which owns the clock, the target check and the statuses;
- data-parallel: the model is wrapped in ``DistributedDataParallel`` (gradient sync skipped
  with ``no_sync`` inside an accumulation window), BatchNorm optionally converted to
  ``SyncBatchNorm`` (seed 003, Pitfall 6), and every decision that stops the loop (loss, clock,
  metric) is agreed across workers by an all-reduce so no worker is left waiting in a
  collective.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raybatch.config import TrialConfig
from raybatch.memory import autocast_context
from raybatch.memory.probe import move_to
from raybatch.metric import metric_values, target_value
from raybatch.reporting import TrialReporter
from raybatch.workload import Workload

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class LoopOptions:
    """How a trial trains, beyond the recipe itself.

    Attributes:
        grad_clip_norm: Clip the gradient norm to this on each optimizer step (``None``: off).
        ema_decay: Keep an exponential moving average of the weights (updated on optimizer
            steps) and evaluate it instead of the raw weights (``None``: off).
        eval_batch_size: Batch size for validation (the same for every trial).
        num_workers: ``DataLoader`` worker processes for the training data.
        seed: Seed of model initialisation and data order.
        sync_batchnorm: Convert BatchNorm layers to SyncBatchNorm when data-parallel.
    """

    grad_clip_norm: float | None = None
    ema_decay: float | None = None
    eval_batch_size: int = 256
    num_workers: int = 0
    seed: int = 0
    sync_batchnorm: bool = False


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and PyTorch (CPU and CUDA) generators."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def warmup_factor(step: int, warmup_steps: int) -> float:
    """LR multiplier after ``step`` optimizer steps: linear ramp to 1 over ``warmup_steps``."""
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, (step + 1) / warmup_steps)


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


def train(
    workload: Workload,
    config: TrialConfig,
    reporter: TrialReporter,
    device: torch.device,
    options: LoopOptions,
    distributed: bool = False,
) -> None:
    """Train ``config`` until the reporter says stop (target, budget, divergence)."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    seed_everything(options.seed)
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
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_factor(step, config.warmup_steps)
    )
    ema = None
    if options.ema_decay is not None:
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(options.ema_decay))
    scaler = None
    if workload.amp_dtype == "fp16" and device.type == "cuda":
        scaler = torch.amp.GradScaler("cuda")

    train_data = workload.train_dataset()
    generator = torch.Generator().manual_seed(options.seed)
    sampler: DistributedSampler[Any] | None = (
        DistributedSampler(train_data, shuffle=True, seed=options.seed, drop_last=True)
        if dist is not None
        else None
    )
    loader = DataLoader(
        train_data,
        batch_size=config.micro_batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        drop_last=True,
        generator=generator,
        num_workers=options.num_workers,
        pin_memory=device.type == "cuda",
    )
    if len(loader) == 0:
        raise ValueError(
            f"micro batch {config.micro_batch_size} x world size {config.world_size} is larger"
            f" than the training set ({len(train_data)} samples)"  # type: ignore[arg-type]
        )
    val_loader = DataLoader(workload.val_dataset(), batch_size=options.eval_batch_size)

    def batches(epoch: int) -> Iterator[Any]:
        if sampler is not None:
            sampler.set_epoch(epoch)
        return iter(loader)

    accumulation = config.accumulation_steps
    samples_per_step = config.micro_batch_size * accumulation * config.world_size
    epoch, micro_steps = 0, 0
    window_loss = torch.zeros((), device=device)
    it = batches(epoch)
    trained.train()
    reporter.start()
    while not reporter.stopped:
        wait_start = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            epoch += 1
            it = batches(epoch)
            batch = next(it)
        reporter.add_data_wait(time.perf_counter() - wait_start)
        batch = move_to(batch, device)
        micro_steps += 1
        boundary = micro_steps % accumulation == 0
        # Inside an accumulation window DDP need not all-reduce: only the boundary syncs.
        no_sync: Any = nullcontext()
        if dist is not None and not boundary:
            no_sync = trained.no_sync()  # type: ignore[operator]
        with no_sync:
            with autocast_context(workload, device.type):
                loss = workload.loss(trained, batch)
            scaled = loss / accumulation
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        window_loss += loss.detach().float()
        del loss, scaled, batch
        if not boundary:
            continue
        if options.grad_clip_norm is not None:
            if scaler is not None:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), options.grad_clip_norm)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if ema is not None:
            ema.update_parameters(model)
        step_loss = float(window_loss) / accumulation
        window_loss.zero_()
        if dist is not None:
            step_loss = dist.mean([step_loss], device)[0]
        if reporter.add(samples=samples_per_step, steps=1, loss=step_loss):
            break
        if reporter.eval_due:
            evaluated = ema.module if ema is not None else model
            with reporter.evaluating():
                evaluated.eval()
                result = workload.evaluate(evaluated, (move_to(b, device) for b in val_loader))
                trained.train()
                values = metric_values(result, workload.metrics)
                if dist is not None:
                    values = dict(
                        zip(values, dist.mean(list(values.values()), device), strict=True)
                    )
            reporter.report(target_value(values, reporter.target.metric), values=values)
