"""The search's time model, measured inside a trial the moment it reaches the target.

What :class:`raybatch.timemodel.model.TimeModel` needs, measured where it matters and where it is
cheap: on the trial's own model as it reaches the target, on its device, with its data and
autocast, in the process that already holds them (no start-up, no data loading of its own):

- **the gradient noise scale near the target**: ``batches`` big batches ``b = k x s`` made of
  ``k`` small batches ``s`` (the space's smallest micro batch); each small batch's gradient is
  taken apart (one backward each), so ``|G_s|^2`` (their mean squared norm) and ``|G_b|^2``
  (the squared norm of their mean) come from the same samples, at the trained weights. The
  noise scale grows as training proceeds (McCandlish et al. 2018, section 3): measured from
  initialisation it was 71 on digits, near the target 200-1000, and the early figure pointed
  the plan at the slowest batches. So it is measured here, where the time to target is decided;
- **step times**: the trial's own micro batch from its own training (its training seconds over
  its optimizer steps: the throughput its row reports), each smaller micro batch of the space
  with a few timed passes that fetch their batches as the loop does (they fit: the trial's
  larger one did), and the optimizer step with a few timed steps.

Its seconds count as the trial's evaluation time: held on the device (charged to the search in
``held_s``), never in the objective.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from raybatch import keys
from raybatch.batches import train_batches
from raybatch.space.config import TrialConfig
from raybatch.timemodel.model import TimeModel, noise_scale
from raybatch.workload import Workload, autocast_context

if TYPE_CHECKING:
    import torch
    from torch import nn

    from raybatch.space.search_space import SearchSpace  # pydantic: not on the GPU machine

SMALL_BATCHES_PER_BIG = 8
"""``k``: small batches in one big batch (``b = 8 s``): far enough apart for the two norms to
differ clearly, cheap enough to repeat a dozen times."""
NOISE_BATCHES = 16
"""Big batches measured (``16 x 8`` passes at the smallest micro batch)."""
TIMED_PASSES = 2
"""Timed forward-and-backward passes per other micro batch (after one to warm up)."""


def _squared_norm(tensors: Sequence[torch.Tensor]) -> float:
    import torch

    return float(sum(torch.sum(t.float() ** 2) for t in tensors))


def _noise_batches(
    workload: Workload,
    model: nn.Module,
    device: torch.device,
    small: int,
    batches: int,
    scale: float = 1.0,
) -> tuple[list[float], list[float]]:
    """Squared gradient norms at ``small`` and ``k x small``, one pair per big batch, at the
    model's current weights (no step is taken). Under fp16 the loss is scaled by ``scale``
    (the trial's loss scale) as in training, so that small gradients near the target do not
    underflow, and the squared norms are divided by ``scale ** 2``: those of the unscaled
    gradients, with no copy of them."""
    import torch

    k = SMALL_BATCHES_PER_BIG
    params = [p for p in model.parameters() if p.requires_grad]
    it = train_batches(workload.train_dataset(), small, device, seed=1, collate=workload.collate())
    small_sq, big_sq = [], []
    model.train()
    for _ in range(batches):
        total = [torch.zeros_like(p) for p in params]
        norms = 0.0
        for _ in range(k):
            model.zero_grad(set_to_none=True)
            with autocast_context(workload, device.type):
                loss = workload.loss(model, next(it))
            (loss * scale if scale != 1.0 else loss).backward()
            grads = [p.grad for p in params if p.grad is not None]
            norms += _squared_norm(grads)
            for acc, p in zip(total, params, strict=True):
                if p.grad is not None:
                    acc.add_(p.grad)
        small_sq.append(norms / k / scale**2)
        big_sq.append(_squared_norm([t / k for t in total]) / scale**2)
    model.zero_grad(set_to_none=True)
    return small_sq, big_sq


def _pass_times(
    workload: Workload,
    model: nn.Module,
    device: torch.device,
    micros: Sequence[int],
    sync: Callable[[], None],
) -> dict[int, float]:
    """Seconds per forward-and-backward pass by micro batch, its batch's fetch included (as the
    loop's training seconds include it)."""
    dataset = workload.train_dataset()
    out: dict[int, float] = {}
    for micro in micros:
        it = train_batches(dataset, micro, device, seed=2, collate=workload.collate())
        start = time.perf_counter()
        for i in range(TIMED_PASSES + 1):
            if i == 1:  # the first pass warms up (allocations, kernel selection)
                sync()
                start = time.perf_counter()
            with autocast_context(workload, device.type):
                loss = workload.loss(model, next(it))
            loss.backward()
        sync()
        out[micro] = (time.perf_counter() - start) / TIMED_PASSES
        model.zero_grad(set_to_none=True)
    return out


def _optimizer_time(optimizer: torch.optim.Optimizer, sync: Callable[[], None]) -> float:
    """Seconds per optimizer step, on zero gradients of the parameters it steps (only those:
    a frozen backbone's gradients would double the memory the trial holds)."""
    import torch

    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    sync()
    start = time.perf_counter()
    for _ in range(3):
        optimizer.step()
    sync()
    optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / 3


def measure_at_target(
    workload: Workload,
    space: SearchSpace,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    recipe: TrialConfig,
    step_s: float,
    scaler: Any = None,
) -> TimeModel:
    """The time model from a trial that has just reached the target (its weights are changed).

    Args:
        workload: The trial's workload.
        space: The space (its smallest micro batch is ``s``; its micro batches are timed).
        model: The trial's trained model (not the EMA copy: the gradients are the training's).
        optimizer: The trial's optimizer (its step is timed).
        device: The trial's device.
        recipe: The trial's recipe (its micro batch's time comes from ``step_s``).
        step_s: The trial's training seconds per optimizer step.
        scaler: The trial's fp16 ``GradScaler`` (its scale is used on the measured losses).

    Raises:
        ValueError: The gradient norms were not finite, or the noise scale came out NaN.
    """
    import torch

    start = time.perf_counter()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    small = min(space.search.micro_batch_size)
    scale = float(scaler.get_scale()) if scaler is not None else 1.0
    small_sq, big_sq = _noise_batches(workload, model, device, small, NOISE_BATCHES, scale)
    if not all(math.isfinite(v) for v in small_sq + big_sq):
        raise ValueError("the gradient norms at the target were not finite")
    noise = noise_scale(small_sq, big_sq, small, small * SMALL_BATCHES_PER_BIG)
    if math.isnan(noise.b_simple):
        raise ValueError("the noise scale came out NaN")
    own = recipe.micro_batch_size
    others = sorted(m for m in space.search.micro_batch_size if m < own)
    micro_s = _pass_times(workload, model, device, others, sync)
    opt_s = _optimizer_time(optimizer, sync)
    if step_s > opt_s:
        micro_s[own] = (step_s - opt_s) / recipe.accumulation_steps
    else:  # no step timed (or too fast to tell): its passes, as the others'
        micro_s.update(_pass_times(workload, model, device, [own], sync))
    return TimeModel(noise, micro_s, opt_s, cost_s=time.perf_counter() - start)


PACKED = "not measured: the trial shared its GPU, and its step times would be its neighbours' too"


def at_target_measure(
    workload: Workload,
    space: SearchSpace,
    recipe: TrialConfig,
    device: torch.device,
    config: dict[str, Any],
    step_s: Callable[[], float],
    packed: bool = False,
) -> Callable[[nn.Module, torch.optim.Optimizer, Any], dict[str, Any]] | None:
    """What :func:`raybatch.trial.loop.train` runs once the trial reaches the target, when the
    searcher asked this trial for it (``config``'s :data:`~raybatch.keys.MEASURE_TIME_MODEL`):
    the time model, as the JSON text its final report carries (:data:`raybatch.keys.TIME_MODEL`).
    ``step_s`` reads the trial's training seconds per optimizer step at that moment. A
    ``packed`` trial (sharing its GPU) says why it measures nothing: its step times would be
    its neighbours' too."""
    if not config.get(keys.MEASURE_TIME_MODEL):
        return None
    if packed:
        return lambda *_: {keys.TIME_MODEL_ERROR: PACKED}

    def measure(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any) -> dict[str, Any]:
        found = measure_at_target(
            workload, space, model, optimizer, device, recipe, step_s(), scaler
        )
        return {keys.TIME_MODEL: json.dumps(found.to_dict())}

    return measure
