"""The trace: one training step on fake tensors, with every storage it allocates counted.

See :mod:`raybatch.memory` for what the trace accounts for and what it does not.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from raybatch.errors import TraceError
from raybatch.memory.kernels import cuda_kernels
from raybatch.space.config import TrialConfig
from raybatch.workload import Workload, autocast_context

if TYPE_CHECKING:
    import torch


CUDA_ALLOCATION_GRANULARITY = 512
"""PyTorch's CUDA caching allocator rounds every block up to a multiple of 512 bytes."""

CUBLAS_WORKSPACE_BYTES = 32 * 2**20
"""The cuBLAS workspace PyTorch allocates through its allocator for each cuBLAS handle and
stream, on the handle's first matmul (Hopper: 32 MiB, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``;
cuBLASLt shares it). Earlier cards take 8 MiB: the prediction is then above, never below."""

CUBLAS_HANDLES_PER_STEP = 2
"""A training step holds two: handles are per thread, and autograd runs a CUDA backward on its
own device thread, so the forward's matmuls and the backward's each have a workspace. The
committed GPU measurements show it: an MLP's allocated peak sat 33 MiB above a prediction
with one workspace at every micro batch from 64 to 1024, in fp32 and bf16 alike."""

CUDA_KERNEL_WORKSPACE_BYTES = CUBLAS_HANDLES_PER_STEP * CUBLAS_WORKSPACE_BYTES
"""The kernels' workspaces a step holds, invisible to a dispatch trace: added to CUDA
predictions."""


class Category(str, Enum):
    """What a byte of the peak is for."""

    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    INPUTS = "inputs"
    EXTRA = "extra"
    """Bytes added outside the trace: kernel workspace, DDP buckets, prefetched batches."""


class MemoryTraceWarning(UserWarning):
    """The trace failed and raybatch fell back to the real probe (or to 'unknown')."""


@dataclass(frozen=True)
class TraceResult:
    """One traced training step.

    Attributes:
        micro_batch_size: Batch size of the traced micro step.
        peak_bytes: Largest live total during the step.
        breakdown: ``peak_bytes`` split by :class:`Category` (values sum to it).
        phases: For each segment of the step (``forward``, ``backward``, ``optimizer``), the
            breakdown at that segment's own peak.
        timeline: The breakdown after every op of the measured step, labelled with its
            segment. At a fixed op, memory is linear in the batch; the step's peak is the
            maximum over ops, and *which* op peaks moves as the batch grows (from the optimizer
            step for small, parameter-bound batches to backward for large ones).
        accumulating: Whether two micro steps were traced (gradients alive during forward).
        seconds: Wall-clock time the trace took on the CPU.
        parameter_bytes: Parameters and buffers.
        gradient_bytes: Gradients once backward is complete.
        optimizer_state_bytes: Optimizer state after the step (momentum, Adam moments...).
        forward_activation_bytes: What the forward pass leaves alive for backward (saved
            activations and the loss), the usual meaning of "activation memory".
    """

    micro_batch_size: int
    peak_bytes: int
    breakdown: dict[str, int]
    phases: dict[str, dict[str, int]]
    timeline: tuple[tuple[str, dict[str, int]], ...]
    accumulating: bool
    seconds: float
    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    forward_activation_bytes: int


def _storages(t: torch.Tensor) -> list[Any]:
    from torch.distributed._tools.common_utils import get_untyped_storages

    return list(get_untyped_storages(t))


class _AllocationTracker:
    """Counts live tensor storages by category through a ``TorchDispatchMode``.

    A storage is registered the first time an op returns a tensor on it, under the category of
    the current phase, and unregistered by a weakref callback when PyTorch frees it. The peak
    of the live total is kept together with its per-category split.
    """

    def __init__(self, granularity: int) -> None:
        self.granularity = granularity
        self.phase = Category.PARAMETERS
        self.segment: str | None = None
        self.live: dict[int, tuple[int, Category, Any]] = {}
        self.totals = dict.fromkeys(Category, 0)
        self.current = 0
        self.segment_peaks: dict[str, tuple[int, dict[Category, int]]] = {}
        self.timeline: list[tuple[str, dict[Category, int]]] | None = None

    def after_op(self) -> None:
        """Record the live totals after an op's outputs exist: every local peak is one."""
        if self.timeline is not None and self.segment is not None:
            self.timeline.append((self.segment, dict(self.totals)))

    def enter(self, segment: str, phase: Category) -> None:
        """Start a segment of the step (forward, backward, optimizer) with its category."""
        self.segment, self.phase = segment, phase
        self._note_peak()

    def _note_peak(self) -> None:
        if self.segment is None:
            return
        best = self.segment_peaks.get(self.segment)
        if best is None or self.current > best[0]:
            self.segment_peaks[self.segment] = (self.current, dict(self.totals))

    def _round(self, nbytes: int) -> int:
        g = self.granularity
        return -(-nbytes // g) * g if nbytes else 0

    def register(self, t: torch.Tensor, category: Category, nbytes: int | None = None) -> None:
        for st in _storages(t):
            key = id(st)
            if key in self.live:
                continue
            size = self._round(st.nbytes() if nbytes is None else nbytes)
            self.live[key] = (size, category, weakref.ref(st, self._freed_callback(key)))
            self.totals[category] += size
            self.current += size
            self._note_peak()

    def _freed_callback(self, key: int) -> Any:
        def freed(_ref: Any) -> None:
            entry = self.live.pop(key, None)
            if entry is not None:
                self.totals[entry[1]] -= entry[0]
                self.current -= entry[0]

        return freed

    def reclassify(self, t: torch.Tensor, category: Category) -> None:
        for st in _storages(t):
            entry = self.live.get(id(st))
            if entry is not None and entry[1] is not category:
                size, old, ref = entry
                self.totals[old] -= size
                self.totals[category] += size
                self.live[id(st)] = (size, category, ref)

    def mode(self) -> Any:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                for leaf in tree_leaves(out):
                    if isinstance(leaf, torch.Tensor):
                        tracker.register(leaf, tracker.phase)
                tracker.after_op()
                return out

        return _Mode()


def _cuda_autocast_functions() -> tuple[frozenset[Any], frozenset[Any]]:
    """The functions CUDA autocast runs in float32 and CPU autocast does not: the first set
    casts its inputs to float32 (``layer_norm``, losses, ``exp``...), the second computes in
    float32 (``dtype=torch.float32``: ``softmax``, ``log_softmax``).

    From the CUDA casting lists of PyTorch's ``aten/src/ATen/autocast_mode.cpp`` (``fp32`` and
    ``fp32_set_opt_dtype``), the entries whose outputs hold activation memory in common models;
    CPU autocast leaves them in the reduced dtype. ``cross_entropy`` is listed because CUDA
    autocast sees it decomposed into ``log_softmax`` + ``nll_loss``, both float32 there.
    """
    import torch
    import torch.nn.functional as F

    cast = frozenset(
        {
            F.layer_norm, torch.layer_norm, F.group_norm, torch.group_norm,
            F.cross_entropy, F.nll_loss, F.mse_loss, F.l1_loss, F.smooth_l1_loss,
            F.huber_loss, F.kl_div, F.binary_cross_entropy_with_logits, F.cosine_similarity,
            F.softplus, F.interpolate, torch.exp, torch.Tensor.exp, torch.log, torch.Tensor.log,
            torch.log1p, torch.Tensor.log1p, torch.pow, torch.Tensor.pow, torch.Tensor.__pow__,
            torch.rsqrt, torch.Tensor.rsqrt, torch.reciprocal, torch.Tensor.reciprocal,
            torch.logsumexp, torch.Tensor.logsumexp, torch.cdist,
        }
    )  # fmt: skip
    in_float32 = frozenset(
        {F.softmax, F.log_softmax, torch.softmax, torch.log_softmax,
         torch.Tensor.softmax, torch.Tensor.log_softmax}
    )  # fmt: skip
    return cast, in_float32


def cuda_autocast_policy(workload: Workload) -> Any:
    """Make a CPU-autocast trace follow CUDA autocast's float32 list (a no-op without amp).

    The trace runs under CPU autocast (CUDA autocast needs a CUDA build: fake CUDA tensors do
    not survive autograd on a CPU-only torch). Both lower matmuls and convolutions alike, but
    CUDA autocast also runs ``softmax``, ``log_softmax``, ``layer_norm``, the losses and a few
    pointwise ops in float32, where CPU autocast keeps bf16/fp16 — so a transformer's
    activations would be under-predicted. This ``TorchFunctionMode`` applies the CUDA rule on
    top: those functions get float32 inputs (or ``dtype=torch.float32``).
    """
    import torch
    from torch.overrides import TorchFunctionMode

    if workload.amp_dtype is None:
        return nullcontext()
    cast, in_float32 = _cuda_autocast_functions()
    reduced = (torch.bfloat16, torch.float16)

    def widen(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dtype in reduced:
            return x.float()
        return x

    class _CudaPolicy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func in cast:
                args = tuple(widen(a) for a in args)
                kwargs = {k: widen(v) for k, v in kwargs.items()}
            elif func in in_float32 and kwargs.get("dtype") is None:
                first = args[0] if args else kwargs.get("input")
                if isinstance(first, torch.Tensor) and first.dtype in reduced:
                    kwargs = {**kwargs, "dtype": torch.float32}
            return func(*args, **kwargs)

    return _CudaPolicy()


@contextmanager
def _tracing(granularity: int) -> Iterator[_AllocationTracker]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    tracker = _AllocationTracker(granularity)
    with warnings.catch_warnings():
        # Modules that deep-copy layers (nn.TransformerEncoder) touch a fake tensor's data
        # pointer; harmless here, since nothing reads the (non-existent) data.
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        with FakeTensorMode(allow_non_fake_inputs=True), tracker.mode():
            yield tracker


def trace_step(
    workload: Workload,
    config: TrialConfig,
    micro_batch_size: int,
    accumulating: bool = False,
    cuda: bool = True,
) -> TraceResult:
    """Trace one steady-state training step at ``micro_batch_size`` and return its peak.

    Args:
        workload: The workload (its model, loss, example batch, optimizer and autocast dtype).
        config: A recipe of the space, for the optimizer family and its arguments.
        micro_batch_size: Samples per forward/backward pass.
        accumulating: Trace two micro steps (gradients alive during the second forward).
        cuda: Project for a CUDA device (512-byte blocks, ``foreach`` optimizers); else count
            exact bytes as on the CPU.

    Raises:
        TraceError: The step cannot run on fake tensors; ``op`` names the construct.
    """
    start = time.perf_counter()
    try:
        # A real one-item batch, built outside fake mode so no dataset is ever created (and
        # cached) as fake tensors; inside, it is widened to the micro batch for free.
        one = workload.example_batch(1)
        with _tracing(CUDA_ALLOCATION_GRANULARITY if cuda else 1) as tracker:
            marks = _run_traced_step(
                workload, config, one, micro_batch_size, accumulating, cuda, tracker
            )
    except TraceError:
        raise
    except Exception as exc:
        raise _trace_error(exc) from exc
    phases = {
        segment: {c.value: totals[c] for c in Category if c is not Category.EXTRA}
        for segment, (_, totals) in tracker.segment_peaks.items()
    }
    peak_segment = max(phases, key=lambda k: sum(phases[k].values()))
    return TraceResult(
        micro_batch_size=micro_batch_size,
        peak_bytes=sum(phases[peak_segment].values()),
        breakdown=phases[peak_segment],
        phases=phases,
        timeline=tuple(
            (segment, {c.value: totals[c] for c in Category if c is not Category.EXTRA})
            for segment, totals in tracker.timeline or ()
        ),
        accumulating=accumulating,
        seconds=time.perf_counter() - start,
        parameter_bytes=marks["forward"][Category.PARAMETERS],
        gradient_bytes=marks["backward"][Category.GRADIENTS],
        optimizer_state_bytes=marks["step"][Category.OPTIMIZER_STATE],
        forward_activation_bytes=marks["forward"][Category.ACTIVATIONS],
    )


def _run_traced_step(
    workload: Workload,
    config: TrialConfig,
    one: Any,
    micro_batch_size: int,
    accumulating: bool,
    cuda: bool,
    tracker: _AllocationTracker,
) -> dict[str, dict[Category, int]]:
    """Run warm-up and measured steps; return category totals at the measured step's marks."""
    import torch
    from torch.utils._pytree import tree_leaves, tree_map

    tracker.phase = Category.PARAMETERS
    model = workload.build_model()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    for t in [*model.parameters(), *model.buffers()]:
        tracker.register(t, Category.PARAMETERS)
    optimizer = workload.build_optimizer(model, config)
    if cuda:
        for group in optimizer.param_groups:
            if group.get("foreach") is None and "foreach" in optimizer.defaults:
                group["foreach"] = True
    for p in params:
        p.register_post_accumulate_grad_hook(
            lambda p: tracker.reclassify(p.grad, Category.GRADIENTS)
        )

    batch = tree_map(lambda t: torch.empty((micro_batch_size, *t.shape[1:]), dtype=t.dtype), one)
    for leaf in tree_leaves(batch):
        if isinstance(leaf, torch.Tensor):
            tracker.reclassify(leaf, Category.INPUTS)

    marks: dict[str, dict[Category, int]] = {}
    policy = cuda_autocast_policy(workload) if cuda else nullcontext()

    def micro_steps(count: int) -> None:
        for _ in range(count):
            tracker.enter("forward", Category.ACTIVATIONS)
            with autocast_context(workload, "cpu"), policy:
                loss = workload.loss(model, batch)
            marks.setdefault("forward", dict(tracker.totals))
            tracker.enter("backward", Category.TEMPORARIES)
            loss.backward()
            del loss
            marks.setdefault("backward", dict(tracker.totals))
        tracker.enter("optimizer", Category.TEMPORARIES)
        optimizer.step()
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    tracker.reclassify(value, Category.OPTIMIZER_STATE)
        marks["step"] = dict(tracker.totals)
        optimizer.zero_grad(set_to_none=True)
        tracker.segment = None

    with cuda_kernels(cuda):  # through backward too: a checkpointed forward runs again there
        micro_steps(1)  # warm-up: materialises the optimizer state
        marks.clear()
        tracker.segment_peaks.clear()  # the steady-state step is the one measured
        tracker.timeline = []
        micro_steps(2 if accumulating else 1)
    return marks


def _trace_error(exc: Exception) -> TraceError:
    """Name what could not be traced: the op of a fake-tensor error, else the exception."""
    from torch._subclasses import fake_tensor as ft

    op = getattr(exc, "func", None)
    name = str(op) if op is not None else None
    kinds = (
        ft.DataDependentOutputException,
        ft.DynamicOutputShapeException,
        ft.UnsupportedOperatorException,
    )
    if isinstance(exc, kinds) and name:
        what = f"{type(exc).__name__} in {name} (data-dependent or unsupported op)"
    else:
        what = f"{type(exc).__name__}: {exc}"
    return TraceError(f"memory trace failed: {what}", name, exc)
