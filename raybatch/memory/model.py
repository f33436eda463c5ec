"""The linear memory model fitted on traced points: ``peak(b) = fixed + per_sample x b``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

from raybatch.memory.sizes import format_bytes
from raybatch.memory.trace import Category, TraceResult


class EstimateSource(str, Enum):
    """Where a memory figure came from."""

    TRACE = "trace"
    PROBE = "probe"
    CALIBRATED = "calibrated"


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
    return dataclasses.replace(model, **changes)
