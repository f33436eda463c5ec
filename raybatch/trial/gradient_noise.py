"""Measuring the search's prior on the trial's own device: gradient noise scale and step times.

What :class:`raybatch.run.prior.TimeModel` needs, measured the way a trial trains (the
workload's model, optimizer, data and autocast, on the device Ray assigned):

- **the gradient noise scale**: the model trains for ``batches`` optimizer steps at a big
  batch ``b = k x s`` made of ``k`` small batches ``s``; each small batch's gradient is taken
  apart (one backward each), so ``|G_s|^2`` (their mean squared norm) and ``|G_b|^2`` (the
  squared norm of their mean) come from the same samples at no extra forward pass. The model
  keeps training meanwhile, at the reference recipe's LR for ``b``, since the noise scale grows
  as training proceeds (McCandlish et al. 2018, section 3); the first quarter of the batches,
  from the untrained model, is left out of the estimate;
- **step times**: a few timed forward-and-backward passes per micro batch of the space (those
  that fit), and a few optimizer steps; on CUDA the clock is read after a synchronize.

Every second spent is returned as ``cost_s`` and charged to the search.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from raybatch.errors import RaybatchError
from raybatch.memory.trace import autocast_context
from raybatch.run.prior import TimeModel, noise_scale
from raybatch.shipping import ship_by_value
from raybatch.space.search_space import SearchSpace
from raybatch.trial.batches import train_batches
from raybatch.trial.loop import seed_everything
from raybatch.trial.placement import trial_device
from raybatch.trial.process_age import charged_to_task
from raybatch.workload import Workload

if TYPE_CHECKING:
    import torch

SMALL_BATCHES_PER_BIG = 8
"""``k``: small batches in one big batch (``b = 8 s``): far enough apart for the two norms to
differ clearly, cheap enough to repeat a few dozen times."""


def _squared_norm(tensors: Sequence[torch.Tensor]) -> float:
    import torch

    return float(sum(torch.sum(t.float() ** 2) for t in tensors))


def _noise_batches(
    workload: Workload, space: SearchSpace, device: torch.device, small: int, batches: int
) -> tuple[list[float], list[float]]:
    """Squared gradient norms at ``small`` and ``k x small``, one pair per optimizer step."""
    import torch

    k = SMALL_BATCHES_PER_BIG
    model = workload.build_model().to(device)
    recipe = space.derive(small * k, 1, 1) if _within(space, small * k) else space.derive(small)
    optimizer = workload.build_optimizer(model, recipe)
    params = [p for p in model.parameters() if p.requires_grad]
    it = train_batches(workload.train_dataset(), small, device, seed=0)
    small_sq, big_sq = [], []
    model.train()
    for _ in range(batches):
        total = [torch.zeros_like(p) for p in params]
        norms = 0.0
        for _ in range(k):
            optimizer.zero_grad(set_to_none=True)
            with autocast_context(workload, device.type):
                loss = workload.loss(model, next(it))
            loss.backward()
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            norms += _squared_norm(grads)
            for acc, g in zip(total, grads, strict=True):
                acc.add_(g)
        mean = [t / k for t in total]
        small_sq.append(norms / k)
        big_sq.append(_squared_norm(mean))
        for p, g in zip(params, mean, strict=True):
            p.grad = g
        optimizer.step()
    return small_sq, big_sq


def _within(space: SearchSpace, batch: int) -> bool:
    try:
        space.derive(batch)
    except RaybatchError:
        return False
    return True


def _step_times(
    workload: Workload,
    device: torch.device,
    micros: Sequence[int],
    sync: Callable[[], None],
    timed: int,
) -> dict[int, float]:
    """Seconds per forward-and-backward pass, by micro batch."""
    model = workload.build_model().to(device)
    dataset = workload.train_dataset()
    out: dict[int, float] = {}
    for micro in micros:
        it = train_batches(dataset, micro, device, seed=0)
        batches = [next(it) for _ in range(timed + 1)]
        start = time.perf_counter()
        for i, batch in enumerate(batches):
            if i == 1:  # the first pass warms up (allocations, kernel selection)
                sync()
                start = time.perf_counter()
            with autocast_context(workload, device.type):
                loss = workload.loss(model, batch)
            loss.backward()
        sync()
        out[micro] = (time.perf_counter() - start) / timed
        model.zero_grad(set_to_none=True)
    return out


def _optimizer_time(
    workload: Workload, space: SearchSpace, device: torch.device, sync: Callable[[], None]
) -> float:
    import torch

    model = workload.build_model().to(device)
    optimizer = workload.build_optimizer(model, space.reference_config())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    sync()
    start = time.perf_counter()
    for _ in range(5):
        optimizer.step()
    sync()
    return (time.perf_counter() - start) / 5


def measure_time_model(
    workload: Workload,
    space: SearchSpace,
    device: torch.device,
    micros: Sequence[int],
    batches: int = 32,
    timed: int = 3,
) -> TimeModel:
    """The prior for ``workload`` on ``device``: its noise scale and step times.

    Args:
        workload: The user's workload.
        space: The space (its smallest micro batch is ``s``; its reference recipe trains).
        device: Where to measure (the trial's device).
        micros: The micro batches to time (those that fit).
        batches: Big batches measured for the noise scale (optimizer steps taken).
        timed: Timed passes per micro batch.
    """
    import torch

    start = time.perf_counter()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    seed_everything(0)
    small = min(space.search.micro_batch_size)
    small_sq, big_sq = _noise_batches(workload, space, device, small, batches)
    skip = batches // 4
    if not all(math.isfinite(v) for v in small_sq + big_sq):
        raise ValueError("the gradient norms were not finite (the measurement steps diverged)")
    noise = noise_scale(small_sq[skip:], big_sq[skip:], small, small * SMALL_BATCHES_PER_BIG)
    if math.isnan(noise.b_simple):
        raise ValueError("the noise scale came out NaN")
    micro_s = _step_times(workload, device, sorted(micros), sync, timed)
    opt_s = _optimizer_time(workload, space, device, sync)
    return TimeModel(noise, micro_s, opt_s, cost_s=time.perf_counter() - start)


def measure_here(
    workload: Workload, space: SearchSpace, micros: Sequence[int], cpus: float, batches: int = 32
) -> TimeModel:
    """:func:`measure_time_model` in this process on its CPU, with the threads one trial has
    (a local CPU search: no Ray worker to start)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(cpus)))
    try:
        return measure_time_model(workload, space, torch.device("cpu"), micros, batches)
    finally:
        torch.set_num_threads(threads)


def measure_remotely(
    workload: Workload,
    space: SearchSpace,
    micros: Sequence[int],
    resources: dict[str, Any],
    timeout_s: float,
    batches: int = 32,
) -> TimeModel:
    """:func:`measure_time_model` in a Ray task holding one trial's resources (the driver of a
    cluster often has no GPU), on the device Ray assigns it, with the workload shipped as the
    trials' is (:mod:`raybatch.shipping`).

    Raises:
        TimeoutError: Not measured within ``timeout_s`` (the task is cancelled): a workload
            that hangs must not hang the search.
    """
    import ray

    ship_by_value(workload)

    def run() -> TimeModel:
        import torch

        torch.set_num_threads(max(1, int(resources.get("num_cpus", 1))))
        return measure_time_model(workload, space, trial_device("auto"), micros, batches)

    task = ray.remote(max_retries=0, **resources)(charged_to_task(run))  # a crash: a note
    ref = task.remote()
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        raise TimeoutError(f"not measured within {timeout_s:g} s (one trial's time cap)") from None
