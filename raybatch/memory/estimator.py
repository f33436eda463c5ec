"""The estimator: traces a workload, fits and caches its linear models, and screens configs."""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from raybatch.errors import TraceError
from raybatch.memory.boundary import MeasuredBoundary, kind_of
from raybatch.memory.model import EstimateSource, LinearMemoryModel
from raybatch.memory.prescreen import PrescreenResult
from raybatch.memory.probe import probe
from raybatch.memory.sizes import format_bytes
from raybatch.memory.trace import (
    CUDA_KERNEL_WORKSPACE_BYTES,
    Category,
    MemoryTraceWarning,
    TraceResult,
    trace_step,
)
from raybatch.space.config import TrialConfig
from raybatch.workload import Workload

if TYPE_CHECKING:
    from raybatch.space.search_space import SearchSpace


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
        >>> from raybatch import MemoryEstimator
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
    probed: dict[tuple[bool, int, int], int] = field(default_factory=dict, repr=False)
    """What real probes reserved above the trace's prediction (bytes, never below 0), by
    (accumulating, world size, micro batch): see :meth:`observe`. Kept in the searcher's
    checkpoint, so a resumed search predicts as it did."""
    boundary: MeasuredBoundary | None = field(default=None, repr=False)
    """The top of the range measured by real steps on the device (:mod:`raybatch.memory.
    boundary`): where it says a recipe ran or ran out, that decides over the trace."""

    @classmethod
    def for_space(
        cls, workload: Workload, space: SearchSpace, cuda: bool = True
    ) -> MemoryEstimator:
        """The estimator a search uses: the space's reference recipe (its optimizer), projected
        for the trials' device (``cuda``; CPU trials' memory is the host's, as the CPU runs
        the step), the linear model anchored at the space's smallest and largest micro batch,
        so every searched size is interpolated, never extrapolated."""
        micro = space.search.micro_batch_size
        return cls(workload, space.reference_config(), cuda=cuda, anchors=(min(micro), max(micro)))

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
        """Predicted peak bytes on one GPU for ``config``: the trace's, plus what the probes
        measured above it nearby (:meth:`observe`)."""
        return self._model_of(config).predict(config.micro_batch_size) + self.excess(config)

    def max_micro_batch_size(self, config: TrialConfig, budget_bytes: int) -> int | None:
        """The largest micro batch that fits ``budget_bytes`` with ``config``'s other knobs
        (less what the probes of its kind measured above the trace at its largest probed
        batch)."""
        excess = self._excess_near(kind_of(config), 1 << 30)
        return self._model_of(config).max_micro_batch_size(budget_bytes - excess)

    def excess(self, config: TrialConfig) -> int:
        """What the probes measured above the trace for recipes like ``config`` (the same
        accumulation and world size): the most at any probed micro batch no larger than its
        own; 0 below every probe. Non-decreasing in the batch, and a new probe never lowers
        it (a lower prediction would over-pack later trials)."""
        return self._excess_near(kind_of(config), config.micro_batch_size)

    def _excess_near(self, kind: tuple[bool, int], micro: int) -> int:
        below = [e for (a, w, m), e in self.probed.items() if (a, w) == kind and m <= micro]
        return max(below, default=0)

    def calibrate(self, config: TrialConfig, measured_bytes: int) -> float:
        """Scale later predictions by a real probe's measured / predicted peak; return the ratio."""
        self._calibration = 1.0
        ratio = measured_bytes / self._model_of(config).predict(config.micro_batch_size)
        self._calibration = ratio
        return ratio

    def observe(self, config: TrialConfig, measured_bytes: int) -> int:
        """Learn from one more probe: the bytes it reserved above the trace's prediction, at
        its own micro batch and kind (accumulation, world size); the largest seen there is kept.

        A search sees many probes (the trials' reserved peaks: what an OOM is about, above the
        allocated memory the trace predicts). What they add is mostly fixed -- the
        allocator's rounding, cuBLAS's workspace -- so it is kept in bytes, per batch, and a
        recipe is predicted with the excess measured at the probed batch nearest to its own:
        a small batch's rounding (its *ratio* can be large) no longer scales, and vetoes, every
        large batch that was never probed. A probe below the trace's figure (another
        allocator, a step that freed early) never lowers it: that would over-pack later
        trials. Only probes that fit are observed (:func:`raybatch.trial.wrapper` reports no
        peak for one that ran out of memory: its peak is truncated). Returns the excess now in
        force at that batch.
        """
        key = (*kind_of(config), config.micro_batch_size)
        traced = self._model_of(config).predict(config.micro_batch_size)
        self.probed[key] = max(self.probed.get(key, 0), int(measured_bytes) - traced, 0)
        return self.probed[key]

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
        measured = self.measured(config, budget_bytes)
        if measured is not None:
            return measured
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

            return probe(self.workload, config, probe_device).as_prescreen(budget_bytes, f"{exc}; ")
        excess = self.excess(config)
        predicted, breakdown = model.predict(b) + excess, model.breakdown(b)
        fits = predicted <= budget_bytes
        verdict = "fits" if fits else "does not fit"
        source = EstimateSource.CALIBRATED if excess else model.source
        probed = f", {format_bytes(excess)} more as probes measured" if excess else ""
        reason = (
            f"micro batch {b}: predicted {format_bytes(predicted)} {verdict} the budget of"
            f" {format_bytes(budget_bytes)} ({model.source.value}{probed})"
        )
        return PrescreenResult(b, fits, predicted, breakdown, budget_bytes, source, reason)

    def measured(self, config: TrialConfig, budget_bytes: int) -> PrescreenResult | None:
        """The verdict of the real steps on the device for ``config`` (``None``: they do not
        say, or they ran under another budget than ``budget_bytes``; run uncapped, only that
        a recipe ran out holds under any budget)."""
        edge = self.boundary
        fits = None if edge is None else edge.verdict(config)
        if edge is None or fits is None or edge.budget_bytes not in (None, budget_bytes):
            return None
        if edge.budget_bytes is None and fits:
            return None
        return PrescreenResult(
            config.micro_batch_size, fits, None, None, budget_bytes, EstimateSource.PROBE,
            edge.reason(config),
        )  # fmt: skip

    def fits(self, config: TrialConfig, budget_bytes: int, margin: float = 0.0) -> bool:
        """Whether ``config`` may run under ``budget_bytes``: the real steps' verdict where they
        give one, else the prediction within ``margin`` (a fraction over the budget, for the
        trial's own probe to decide)."""
        measured = self.measured(config, budget_bytes)
        if measured is not None:
            return bool(measured.fits)
        return self.predict(config) <= budget_bytes * (1 + margin)


@dataclass(frozen=True)
class EstimateRow:
    """One micro batch's prediction in ``raybatch estimate``: its peak, whether it fits the
    budget (``None``: no budget), and the peak's parts (:meth:`LinearMemoryModel.breakdown`)."""

    micro_batch_size: int
    predicted_bytes: int
    fits: bool | None
    breakdown: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MemoryReport:
    """Predictions for a list of micro batches: what ``raybatch estimate`` prints."""

    workload: str
    device: str
    optimizer: str
    accumulation_steps: int
    world_size: int
    rows: list[EstimateRow]
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
            "rows": [r.to_dict() for r in self.rows],
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
        rows.append(EstimateRow(b, predicted, fits, model.breakdown(b)))
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
