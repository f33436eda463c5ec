"""Predict a training step's peak GPU memory without a GPU, and screen configs against a budget.

Layers, cheapest first (``DESIGN.md``, "Memory pre-screen"):

1. **Trace** (:func:`trace_step`): one steady-state training step of the workload — forward,
   loss, backward, optimizer step, under the workload's autocast dtype — runs under
   ``FakeTensorMode``, so no tensor holds real memory and no GPU is needed. A dispatch-mode
   tracker records every storage the step allocates and frees, and the peak of the live total,
   split into parameters, gradients, optimizer state, activations, temporaries and inputs.
   We use our own tracker rather than ``torch.distributed._tools.mem_tracker.MemTracker``
   because MemTracker refuses a module called twice in one context (two accumulation micro
   steps) and files optimizer temporaries under optimizer state.
2. **Linear model** (:class:`LinearMemoryModel`): traces at two micro-batch sizes give
   ``peak(b) = fixed + per_sample x b``; a third trace checks the assumption (the residual is
   reported). Predicting any size and the largest size under a budget are then arithmetic.
3. **Real probe** (:mod:`raybatch.probe`): on the trial's GPU, one real step before the clock
   starts; its measured peak calibrates the model (ratio measured / predicted).

What the trace accounts for, so the prediction matches what CUDA allocates:

- a *steady-state* step: one warm-up step first materialises the optimizer state, so the
  measured step carries parameters + optimizer state through forward and backward, as every
  step after the first does;
- accumulation: activations per micro step do not grow with accumulation, but gradients are
  alive during the forward pass of every micro step after the first; the trace runs two micro
  steps when ``accumulation_steps > 1``;
- CUDA projection: sizes are rounded up to the caching allocator's 512-byte granularity,
  optimizers use the multi-tensor (``foreach``) path PyTorch picks on CUDA (its temporaries
  are larger than the CPU loop's), and :data:`CUDA_KERNEL_WORKSPACE_BYTES` is added for the
  cuBLAS workspace, which no dispatch-level trace can see;
- data parallelism (``world_size > 1``): per-GPU memory is that of one worker plus DDP's
  gradient buckets, one more copy of the gradients (DDP's default
  ``gradient_as_bucket_view=False``); the model is not sharded;
- input prefetch: ``Workload.gpu_prefetch_batches`` extra batches on the GPU (seed 000).

Not accounted for: the CUDA context (outside the allocator; :mod:`raybatch.budget` subtracts
it from the budget), cuDNN's algorithm-search workspaces under ``cudnn.benchmark``, and
fragmentation of the caching allocator (``reserved > allocated``), which the headroom and the
probe's calibration cover.
"""

from __future__ import annotations

import math
import time
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from raybatch.budget import format_bytes
from raybatch.config import TrialConfig
from raybatch.errors import TraceError, WorkloadError
from raybatch.workload import Workload

if TYPE_CHECKING:
    import torch

CUDA_ALLOCATION_GRANULARITY = 512
"""PyTorch's CUDA caching allocator rounds every block up to a multiple of 512 bytes."""

CUDA_KERNEL_WORKSPACE_BYTES = 32 * 2**20
"""cuBLAS workspace PyTorch allocates through its allocator on first matmul (Hopper: 32 MiB,
``CUBLAS_WORKSPACE_CONFIG=:4096:8``); invisible to a dispatch trace, so added to CUDA
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


class EstimateSource(str, Enum):
    """Where a memory figure came from."""

    TRACE = "trace"
    PROBE = "probe"
    CALIBRATED = "calibrated"


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


def autocast_context(workload: Workload, device_type: str) -> Any:
    """The workload's autocast (``amp_dtype``) on ``device_type``, or a no-op context.

    The trace runs on CPU fake tensors and uses CPU autocast, which lowers the same matmul and
    convolution ops to the reduced dtype as CUDA autocast does.
    """
    import torch

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    if workload.amp_dtype is None:
        return nullcontext()
    if workload.amp_dtype not in dtypes:
        raise WorkloadError(
            f"{workload.name}: amp_dtype must be None, 'bf16' or 'fp16', got {workload.amp_dtype!r}"
        )
    return torch.autocast(device_type, dtype=dtypes[workload.amp_dtype])


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

    def micro_steps(count: int) -> None:
        for _ in range(count):
            tracker.enter("forward", Category.ACTIVATIONS)
            with autocast_context(workload, "cpu"):
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


Line = tuple[dict[str, float], dict[str, float]]
"""One segment's fit: (intercept per category, slope per category), in bytes."""


@dataclass(frozen=True)
class LinearMemoryModel:
    """``peak(b) = fixed + per_sample x b``, fitted on two traced points, one line per segment.

    Each segment of the step (forward, backward, optimizer) has its own exactly linear peak;
    the step's peak is the maximum of the lines. A single line through two points would
    over-predict between them and under-predict beyond them once the peak moves from the
    optimizer step (small batches, parameter-bound) to backward (large batches,
    activation-bound). :attr:`fixed_bytes` and :attr:`per_sample_bytes` give the line that
    governs large batches, the usual reading of "fixed + per sample".

    Attributes:
        lines: Per segment, intercept and slope per :class:`Category`.
        anchors: The two traced micro-batch sizes.
        check_batch: The third traced size used to test linearity (``None`` if not checked).
        residual_bytes: Traced minus predicted at ``check_batch``.
        calibration: Measured / predicted ratio from a real probe (1.0 = uncalibrated).
        source: ``trace``, or ``calibrated`` once a probe has been applied.
    """

    lines: dict[str, Line]
    anchors: tuple[int, int]
    check_batch: int | None = None
    residual_bytes: int | None = None
    calibration: float = 1.0
    source: EstimateSource = EstimateSource.TRACE

    @classmethod
    def fit(cls, low: TraceResult, high: TraceResult) -> LinearMemoryModel:
        """The lines through two traces (``low.micro_batch_size < high.micro_batch_size``).

        Op by op when both traces ran the same ops (the usual case), keeping only the lines
        that are the maximum somewhere (the upper envelope); segment by segment otherwise.
        """
        db = high.micro_batch_size - low.micro_batch_size
        if db <= 0:
            raise ValueError("fit needs two distinct micro-batch sizes, smaller first")
        if len(low.timeline) == len(high.timeline) and low.timeline:
            pairs = [
                (f"{seg}#{i}", lo, hi)
                for i, ((seg, lo), (_, hi)) in enumerate(
                    zip(low.timeline, high.timeline, strict=True)
                )
            ]
        else:
            pairs = [(seg, lo, high.phases.get(seg, lo)) for seg, lo in low.phases.items()]
        lines: dict[str, Line] = {}
        for name, lo, hi in pairs:
            # Memory cannot shrink as the batch grows; a negative slope is rounding noise.
            slope = {k: max((hi[k] - lo[k]) / db, 0.0) for k in lo}
            fixed = {k: lo[k] - slope[k] * low.micro_batch_size for k in lo}
            lines[name] = (fixed, slope)
        return cls(_upper_envelope(lines), (low.micro_batch_size, high.micro_batch_size))

    @staticmethod
    def _total(line: Line, b: float) -> float:
        return sum(line[0].values()) + sum(line[1].values()) * b

    def _governing(self, b: float) -> str:
        return max(self.lines, key=lambda k: self._total(self.lines[k], b))

    @property
    def _asymptotic(self) -> Line:
        return self.lines[
            max(
                self.lines,
                key=lambda k: (sum(self.lines[k][1].values()), sum(self.lines[k][0].values())),
            )
        ]

    @property
    def fixed_bytes(self) -> float:
        """Intercept of the line that governs large batches."""
        return sum(self._asymptotic[0].values())

    @property
    def per_sample_bytes(self) -> float:
        """Slope of the line that governs large batches (bytes per sample)."""
        return sum(self._asymptotic[1].values())

    @property
    def per_sample(self) -> dict[str, float]:
        """Per-category slope of the line that governs large batches."""
        return dict(self._asymptotic[1])

    @property
    def fixed(self) -> dict[str, float]:
        """Per-category intercept of the line that governs large batches."""
        return dict(self._asymptotic[0])

    def raw(self, micro_batch_size: int) -> int:
        """Uncalibrated predicted peak bytes."""
        return math.ceil(max(self._total(line, micro_batch_size) for line in self.lines.values()))

    def breakdown(self, micro_batch_size: int) -> dict[str, int]:
        """Uncalibrated predicted bytes per category, at the governing segment's peak."""
        fixed, slope = self.lines[self._governing(micro_batch_size)]
        return {k: math.ceil(fixed[k] + slope[k] * micro_batch_size) for k in fixed}

    def predict(self, micro_batch_size: int) -> int:
        """Predicted peak bytes (calibrated when a probe has been applied)."""
        return math.ceil(self.raw(micro_batch_size) * self.calibration)

    def max_micro_batch_size(self, budget_bytes: int) -> int | None:
        """The largest micro batch whose prediction fits ``budget_bytes``.

        0 when not even the model fits; ``None`` when the peak does not grow with the batch
        (memory sets no limit).
        """
        usable = budget_bytes / self.calibration
        limits = []
        for line in self.lines.values():
            fixed, slope = sum(line[0].values()), sum(line[1].values())
            if usable < fixed:
                return 0
            if slope > 0:
                limits.append(int((usable - fixed) // slope))
        if not limits:
            return None
        b = min(limits)
        # Guard the float boundary: the answer must itself fit, and b + 1 must not.
        while b > 0 and self.predict(b) > budget_bytes:
            b -= 1
        while self.predict(b + 1) <= budget_bytes:
            b += 1
        return b

    def with_extra(self, fixed_bytes: float, per_sample_bytes: float) -> LinearMemoryModel:
        """This model with bytes outside the trace added to every segment as ``extra``."""
        key = Category.EXTRA.value
        lines = {
            seg: ({**f, key: fixed_bytes}, {**sl, key: per_sample_bytes})
            for seg, (f, sl) in self.lines.items()
        }
        return _replace(self, lines=lines)

    def checked(self, trace: TraceResult) -> LinearMemoryModel:
        """This model with its residual at a third traced point recorded."""
        residual = trace.peak_bytes - self.raw(trace.micro_batch_size)
        return _replace(self, check_batch=trace.micro_batch_size, residual_bytes=residual)

    def calibrated(self, ratio: float) -> LinearMemoryModel:
        """This model scaled by a probe's measured / predicted ratio."""
        if not math.isfinite(ratio) or ratio <= 0:
            raise ValueError(f"calibration ratio must be a positive number, got {ratio}")
        return _replace(self, calibration=ratio, source=EstimateSource.CALIBRATED)

    def describe(self) -> str:
        text = (
            f"peak(b) = {format_bytes(self.fixed_bytes)} + {format_bytes(self.per_sample_bytes)}"
            f" x b for large b (the upper envelope of {len(self.lines)} per-op lines), fitted on"
            f" b = {self.anchors[0]} and {self.anchors[1]}"
        )
        if self.check_batch is not None and self.residual_bytes is not None:
            predicted = self.raw(self.check_batch)
            share = self.residual_bytes / predicted if predicted else 0.0
            text += (
                f"; traced at b = {self.check_batch}: residual"
                f" {self.residual_bytes:+d} B ({share:+.2%})"
            )
        if self.calibration != 1.0:
            text += f"; calibrated x{self.calibration:.3f} by a real probe"
        return text


def _upper_envelope(lines: dict[str, Line]) -> dict[str, Line]:
    """The lines that are the maximum for some micro batch b >= 1 (the others never matter)."""

    def total(name: str) -> tuple[float, float]:
        fixed, slope = lines[name]
        return sum(fixed.values()), sum(slope.values())

    def at(name: str, b: float) -> float:
        f, sl = total(name)
        return f + sl * b

    b = 1.0
    current = max(lines, key=lambda k: (at(k, b), total(k)[1]))
    kept = [current]
    while True:
        f0, s0 = total(current)
        crossings = []
        for name in lines:
            f, sl = total(name)
            if sl > s0:
                crossings.append((max((f0 - f) / (sl - s0), b), -sl, name))
        if not crossings:
            break
        b, _, current = min(crossings)
        kept.append(current)
    return {name: lines[name] for name in kept}


def _replace(model: LinearMemoryModel, **changes: Any) -> LinearMemoryModel:
    import dataclasses

    return dataclasses.replace(model, **changes)


@dataclass(frozen=True)
class PrescreenResult:
    """Whether one configuration fits, before it spends GPU time.

    Attributes:
        micro_batch_size: The configuration's micro batch.
        fits: ``True`` / ``False``; ``None`` when nothing could be predicted (trace failed and
            no probe could run): the trial's own probe must decide. Never a silent ``True``.
        predicted_bytes: Predicted (or measured, for a probe) peak bytes.
        breakdown: ``predicted_bytes`` by :class:`Category`, when known.
        budget_bytes: The budget compared against.
        source: ``trace``, ``probe`` or ``calibrated``.
        reason: One line for a person.
    """

    micro_batch_size: int
    fits: bool | None
    predicted_bytes: int | None
    breakdown: dict[str, int] | None
    budget_bytes: int | None
    source: EstimateSource
    reason: str


@dataclass
class MemoryEstimator:
    """Trace-based predictions for one workload and space, with cached linear models.

    Args:
        workload: The workload to trace.
        config: Any recipe of the search space (the optimizer family and kwargs are used).
        cuda: Project for a CUDA device (see :func:`trace_step`).
        anchors: Micro-batch sizes the linear model is fitted on (default: 1 and 64).
        check_batch: A third size traced to check linearity (``None``: do not check).

    Example:
        >>> import raybatch
        >>> from raybatch.examples.digits import workload
        >>> from raybatch.memory import MemoryEstimator
        >>> space = raybatch.load_space("digits_cnn_sgd")
        >>> est = MemoryEstimator(workload, space.reference_config(), anchors=(8, 256))
        >>> est.prescreen(space.derive(64), budget_bytes=2**30).fits
        True
    """

    workload: Workload
    config: TrialConfig
    cuda: bool = True
    anchors: tuple[int, int] = (1, 64)
    check_batch: int | None = None
    _models: dict[bool, LinearMemoryModel] = field(default_factory=dict, repr=False)
    _calibration: float = field(default=1.0, repr=False)

    def trace(self, micro_batch_size: int, accumulating: bool = False) -> TraceResult:
        return trace_step(self.workload, self.config, micro_batch_size, accumulating, self.cuda)

    def traced_model(self, accumulating: bool = False) -> LinearMemoryModel:
        """The (cached) linear model of the traced step alone; fitted on first use.

        Raises:
            TraceError: The workload's step cannot be traced.
        """
        if accumulating not in self._models:
            low, high = sorted(set(self.anchors))
            fitted = LinearMemoryModel.fit(
                self.trace(low, accumulating), self.trace(high, accumulating)
            )
            if self.check_batch is not None:
                fitted = fitted.checked(self.trace(self.check_batch, accumulating))
            self._models[accumulating] = fitted
        return self._models[accumulating]

    def model_for(self, accumulation_steps: int = 1, world_size: int = 1) -> LinearMemoryModel:
        """The linear model of one GPU of a recipe: the trace plus what it cannot see.

        The :attr:`Category.EXTRA` category holds the kernel workspace (CUDA), DDP's gradient
        buckets (``world_size > 1``) and prefetched batches; the probe's calibration, if any,
        scales the whole.
        """
        base = self.traced_model(accumulation_steps > 1)
        extra_fixed = float(CUDA_KERNEL_WORKSPACE_BYTES if self.cuda else 0)
        if world_size > 1:
            extra_fixed += base.fixed[Category.PARAMETERS.value]
        extra_slope = self.workload.gpu_prefetch_batches * base.per_sample[Category.INPUTS.value]
        model = base.with_extra(extra_fixed, extra_slope)
        return model.calibrated(self._calibration) if self._calibration != 1.0 else model

    def _model_of(self, config: TrialConfig) -> LinearMemoryModel:
        return self.model_for(config.accumulation_steps, config.world_size)

    def predict(self, config: TrialConfig) -> int:
        """Predicted peak bytes on one GPU for ``config``."""
        return self._model_of(config).predict(config.micro_batch_size)

    def max_micro_batch_size(self, config: TrialConfig, budget_bytes: int) -> int | None:
        """The largest micro batch that fits ``budget_bytes`` with ``config``'s other knobs."""
        return self._model_of(config).max_micro_batch_size(budget_bytes)

    def calibrate(self, config: TrialConfig, measured_bytes: int) -> float:
        """Scale later predictions by a real probe's measured / predicted peak; return the ratio."""
        self._calibration = 1.0
        ratio = measured_bytes / self.predict(config)
        self._calibration = ratio
        return ratio

    def prescreen(
        self, config: TrialConfig, budget_bytes: int, probe_device: str | None = None
    ) -> PrescreenResult:
        """Does ``config`` fit ``budget_bytes``? Trace first; probe only if the trace fails.

        Args:
            config: The recipe to screen.
            budget_bytes: Bytes the trial may use on its GPU.
            probe_device: Where to run the real probe if the trace fails (``"cuda:0"``, or
                ``"cpu"`` to exercise the path without a GPU); ``None``: report ``fits=None``.
        """
        b = config.micro_batch_size
        try:
            model = self._model_of(config)
        except TraceError as exc:
            warnings.warn(
                f"{self.workload.name}: {exc}; falling back to the real probe",
                MemoryTraceWarning,
                stacklevel=2,
            )
            if probe_device is None:
                return PrescreenResult(
                    b, None, None, None, budget_bytes, EstimateSource.PROBE,
                    f"{exc}; no prediction, the trial's real probe decides",
                )  # fmt: skip
            from raybatch.probe import probe

            return probe(self.workload, config, probe_device).as_prescreen(budget_bytes, f"{exc}; ")
        predicted, breakdown = model.predict(b), model.breakdown(b)
        fits = predicted <= budget_bytes
        verdict = "fits" if fits else "does not fit"
        reason = (
            f"micro batch {b}: predicted {format_bytes(predicted)} {verdict} the budget of"
            f" {format_bytes(budget_bytes)} ({model.source.value})"
        )
        return PrescreenResult(b, fits, predicted, breakdown, budget_bytes, model.source, reason)


@dataclass(frozen=True)
class MemoryReport:
    """Predictions for a list of micro batches: what ``raybatch estimate`` prints."""

    workload: str
    device: str
    optimizer: str
    accumulation_steps: int
    world_size: int
    rows: list[dict[str, Any]]
    model: LinearMemoryModel
    budget_bytes: int | None
    budget_source: str | None
    max_micro_batch_size: int | None
    trace_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "device": self.device,
            "optimizer": self.optimizer,
            "accumulation_steps": self.accumulation_steps,
            "world_size": self.world_size,
            "rows": self.rows,
            "fixed_bytes": math.ceil(self.model.fixed_bytes),
            "per_sample_bytes": self.model.per_sample_bytes,
            "anchors": list(self.model.anchors),
            "check_micro_batch_size": self.model.check_batch,
            "residual_bytes": self.model.residual_bytes,
            "budget_bytes": self.budget_bytes,
            "budget_source": self.budget_source,
            "max_micro_batch_size": self.max_micro_batch_size,
            "trace_seconds": self.trace_seconds,
        }


def _anchor_points(sizes: list[int]) -> tuple[tuple[int, int], int | None]:
    """Fit on the smallest and largest size; check linearity on one in between."""
    low, high = min(sizes), max(sizes)
    if low == high:
        high = 2 * low
    inner = sorted(b for b in set(sizes) if low < b < high)
    if inner:
        check: int | None = inner[len(inner) // 2]
    else:
        middle = round(math.sqrt(low * high))
        check = middle if low < middle < high else None
    return (low, high), check


def estimate(
    workload: Workload,
    config: TrialConfig,
    micro_batch_sizes: list[int],
    budget_bytes: int | None = None,
    budget_source: str | None = None,
    cuda: bool = True,
    accumulation_steps: int = 1,
    world_size: int = 1,
) -> MemoryReport:
    """Predict the peak of each micro batch, the linear model, and the largest that fits.

    Raises:
        TraceError: The workload's step cannot be traced (the trial's probe must decide).
    """
    anchors, check = _anchor_points(micro_batch_sizes)
    start = time.perf_counter()
    estimator = MemoryEstimator(workload, config, cuda=cuda, anchors=anchors, check_batch=check)
    model = estimator.model_for(accumulation_steps, world_size)
    seconds = time.perf_counter() - start
    rows = []
    for b in micro_batch_sizes:
        predicted = model.predict(b)
        fits = None if budget_bytes is None else predicted <= budget_bytes
        rows.append(
            {
                "micro_batch_size": b,
                "predicted_bytes": predicted,
                "fits": fits,
                "breakdown": model.breakdown(b),
            }
        )
    largest = None if budget_bytes is None else model.max_micro_batch_size(budget_bytes)
    return MemoryReport(
        workload=workload.name,
        device="cuda" if cuda else "cpu",
        optimizer=config.optimizer.value,
        accumulation_steps=accumulation_steps,
        world_size=world_size,
        rows=rows,
        model=model,
        budget_bytes=budget_bytes,
        budget_source=budget_source,
        max_micro_batch_size=largest,
        trace_seconds=seconds,
    )
