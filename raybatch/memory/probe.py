"""The real probe: one real training step on the trial's device, before its clock starts.

The trace predicts; the probe confirms, at the cost of one step per distinct micro batch (not
the dozens of steps a trial-and-error finder spends). It runs the same steady-state step the
trace models — a zero-gradient optimizer step first materialises the optimizer state, then one
real step (two micro steps when accumulating) — and reads PyTorch's own peak counters.

An out-of-memory error ends the probe, not the process: the model, optimizer and batch are
dropped (they live only in the failed step's frame, which the caught exception's traceback
holds until the ``except`` block ends), ``gc.collect()`` breaks any cycles and
``torch.cuda.empty_cache()`` returns the cached blocks to the driver, so the next trial
starts from a clean device. The result says infeasible, with the numbers measured up to the
failure.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raybatch.batches import move_to
from raybatch.errors import first_line
from raybatch.memory.model import EstimateSource
from raybatch.memory.prescreen import PrescreenResult
from raybatch.memory.sizes import format_bytes
from raybatch.space.config import TrialConfig
from raybatch.workload import Workload, autocast_context

if TYPE_CHECKING:
    import torch
    from torch import nn

# Library allocation failures that PyTorch surfaces as a plain RuntimeError rather than
# torch.cuda.OutOfMemoryError (cuBLAS/cuDNN handles and workspaces, and PyTorch releases
# before the dedicated type existed).
_LEGACY_OOM_MARKERS = (
    "CUDA out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a GPU out-of-memory error.

    The type ``torch.cuda.OutOfMemoryError`` decides; the message is consulted only for the
    plain ``RuntimeError`` that cuBLAS/cuDNN allocation failures still raise, and for
    ``torch.AcceleratorError`` ("CUDA error: out of memory"), which a failed allocation outside
    the caching allocator (a kernel's or a library's own ``cudaMalloc``) raises since torch 2.8.
    """
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return "out of memory" in str(exc)
    return type(exc) is RuntimeError and any(m in str(exc) for m in _LEGACY_OOM_MARKERS)


@dataclass(frozen=True)
class ProbeResult:
    """What one real step showed.

    Attributes:
        fits: The step ran without running out of memory.
        device: Where it ran.
        micro_batch_size: The probed micro batch.
        max_allocated_bytes: ``torch.cuda.max_memory_allocated`` over the step (CUDA only).
        max_reserved_bytes: ``torch.cuda.max_memory_reserved`` over the step (CUDA only).
        seconds: Wall-clock time of the probe.
        error: The first line of the out-of-memory error, when there was one.
    """

    fits: bool
    device: str
    micro_batch_size: int
    max_allocated_bytes: int | None
    max_reserved_bytes: int | None
    seconds: float
    error: str | None = None
    model_bytes: int | None = None
    """One copy of the model's parameters and buffers (:func:`model_bytes`), as built for a
    step that holds more than one (``model_copies``): what a trial's EMA adds, read here so
    that nothing builds the model again for it (``None``: one copy, or lazy modules)."""

    def as_prescreen(self, budget_bytes: int | None, prefix: str = "") -> PrescreenResult:
        """The probe's verdict in the pre-screen's terms.

        Its ``predicted_bytes`` is the *reserved* peak — what the caching allocator held, and
        what an out-of-memory error is about — named so in the reason, beside the allocated
        peak (the quantity the trace predicts, and trials report as ``peak_memory_bytes``).
        """
        measured = self.max_reserved_bytes
        if self.fits:
            where = ""
            if measured is not None:
                where = f" reserving {format_bytes(measured)}"
                if self.max_allocated_bytes is not None:
                    where += f" (allocated {format_bytes(self.max_allocated_bytes)})"
            reason = (
                f"{prefix}real step at micro batch {self.micro_batch_size} on {self.device}"
                f" ran{where}"
            )
        else:
            reason = (
                f"{prefix}real step at micro batch {self.micro_batch_size} on {self.device} ran out"
                f" of memory: {self.error}"
            )
        return PrescreenResult(
            micro_batch_size=self.micro_batch_size,
            fits=self.fits,
            predicted_bytes=measured,
            breakdown=None,
            budget_bytes=budget_bytes,
            source=EstimateSource.PROBE,
            reason=reason,
        )


def probe(
    workload: Workload, config: TrialConfig, device: str, model_copies: int = 1
) -> ProbeResult:
    """Run one real steady-state step of ``config`` on ``device``; never raise for an OOM.

    ``model_copies`` > 1 keeps that many copies of the model alive through the step (the
    trial's EMA of the weights is one more), so the peak is the trial's and not a plain step's.

    Other exceptions (a bug in the workload, NaN checks...) propagate: they are not a memory
    verdict and the trial reports them as errors.
    """
    import torch

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    start = time.perf_counter()
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    error = None
    built: list[int] = []  # the model's bytes, once it is built (an OOM may come before)
    try:
        steady_step(workload, config, dev, model_copies, built)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        error = first_line(exc)
    # Outside the except block: the traceback, and the step's frame with it, is gone.
    allocated = reserved = None
    if cuda:
        allocated = int(torch.cuda.max_memory_allocated(dev))
        reserved = int(torch.cuda.max_memory_reserved(dev))
    release_memory(dev)
    return ProbeResult(
        fits=error is None,
        device=str(dev),
        micro_batch_size=config.micro_batch_size,
        max_allocated_bytes=allocated,
        max_reserved_bytes=reserved,
        seconds=time.perf_counter() - start,
        error=error,
        model_bytes=built[0] if built else None,
    )


def model_bytes(model: nn.Module) -> int:
    """What one more copy of ``model`` holds (parameters and buffers): the EMA's cost in
    memory, which the probe's step and the trace's estimate of a plain step do not include."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def release_memory(device: torch.device | str | None = None) -> None:
    """Collect garbage and hand the CUDA allocator's cached blocks back to the driver.

    On a CPU device there is nothing cached to hand back, and a CPU trial's tensors are freed
    with their references: a full collection there (0.2 s with torch loaded) would only keep
    the slot idle between two trials. ``device=None`` (the device unknown) collects."""
    import torch

    if device is not None and torch.device(device).type != "cuda":
        return
    gc.collect()
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        # On the trial's own device: a bare synchronize() initialises CUDA's current device,
        # device 0, which under Ray's NOSET switch is another trial's GPU (a context there).
        target = torch.device(device) if device is not None else None
        if target is not None and target.index is not None:
            torch.cuda.synchronize(target)
        elif torch.cuda.is_initialized():
            torch.cuda.synchronize()
        torch.cuda.empty_cache()


def steady_step(
    workload: Workload,
    config: TrialConfig,
    device: torch.device,
    model_copies: int = 1,
    built: list[int] | None = None,
) -> None:
    """One real step after the optimizer state exists; everything it builds dies with it.
    With more than one model copy held, the model's bytes go into ``built`` as soon as it
    exists."""
    import torch

    model = workload.build_model()
    if built is not None and model_copies > 1:  # only the copies' cost is asked for
        with contextlib.suppress(ValueError):  # lazy modules: no size before a forward pass
            built.append(model_bytes(model))
    model = model.to(device)
    copies = [copy.deepcopy(model) for _ in range(model_copies - 1)]  # noqa: F841 (held)
    model.train()
    optimizer = workload.build_optimizer(model, config)
    batch = move_to(workload.example_batch(config.micro_batch_size), device)
    # Materialise the optimizer state (momentum, Adam moments) without a forward pass.
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    micro_steps = 2 if config.accumulation_steps > 1 else 1
    for _ in range(micro_steps):
        with autocast_context(workload, device.type):
            loss = workload.loss(model, batch) / config.accumulation_steps
        loss.backward()
        del loss
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
