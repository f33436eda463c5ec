"""The top of the batch range, measured by real steps on the device before the search starts.

The trace predicts memory from a CPU trace of the step, and where CUDA runs other kernels than
the CPU's (fused attention, which never holds the sequence-by-sequence matrices the CPU's math
path does) it over-predicts, and the pre-screen refused batches that fit. A few real steps
settle it where a device is at hand: for each kind of recipe (plain or accumulating), a
bisection over the space's micro batches, one steady-state step each (:func:`~raybatch.memory.
probe.probe`, the trial's own probe) under the search's budget, finds the largest that ran and
the smallest that ran out. Those two decide over the trace (:meth:`~raybatch.memory.estimator.
MemoryEstimator.prescreen`); between them, and for data-parallel recipes (their buckets live in
workers), the trace still decides and the trial's own probe confirms.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raybatch.memory.probe import ProbeResult, probe
from raybatch.memory.sizes import format_bytes

if TYPE_CHECKING:
    from raybatch.space.config import TrialConfig
    from raybatch.space.search_space import SearchSpace
    from raybatch.workload import Workload

Kind = tuple[bool, int]
"""(accumulating, world size): what a recipe's memory depends on besides its micro batch."""


def kind_of(config: TrialConfig) -> Kind:
    """A recipe's kind: accumulating or not (the gradient buffer), and its world size."""
    return config.accumulation_steps > 1, config.world_size


@dataclass(frozen=True)
class Edge:
    """One kind's measured edge: the largest micro batch that ran a step, the smallest that
    ran out (``None`` where every one probed ran, or none did)."""

    ran: int | None
    ran_out: int | None


@dataclass(frozen=True)
class MeasuredBoundary:
    """What real steps showed on ``device`` under ``budget_bytes``, per kind.

    Attributes:
        device: The device the steps ran on (``cuda:0``; ``cpu`` in tests).
        budget_bytes: The allocator's cap the steps ran under (``None``: the whole device).
        edges: The edge of each kind measured (data-parallel kinds are not).
        steps: Real steps taken, in all.
        seconds: What they took, start-up of each included.
    """

    device: str
    budget_bytes: int | None
    edges: dict[Kind, Edge] = field(default_factory=dict)
    steps: int = 0
    seconds: float = 0.0

    def verdict(self, config: TrialConfig) -> bool | None:
        """``True``: a micro batch no larger than one that ran; ``False``: no smaller than one
        that ran out; ``None``: not measured (another kind, or between the two)."""
        edge = self.edges.get(kind_of(config))
        micro = config.micro_batch_size
        if edge is None:
            return None
        if edge.ran is not None and micro <= edge.ran:
            return True
        if edge.ran_out is not None and micro >= edge.ran_out:
            return False
        return None

    def reason(self, config: TrialConfig) -> str:
        """One line for a person: what the steps showed for ``config``'s kind."""
        edge = self.edges.get(kind_of(config), Edge(None, None))
        under = "" if self.budget_bytes is None else f" under {format_bytes(self.budget_bytes)}"
        ran = "none" if edge.ran is None else str(edge.ran)
        out = "" if edge.ran_out is None else f", {edge.ran_out} ran out of memory"
        return (
            f"micro batch {config.micro_batch_size}: measured on {self.device}{under}: the"
            f" largest that ran a real step was {ran}{out}"
        )


Probe = Callable[["Workload", "TrialConfig", str, int], ProbeResult]


def find_boundary(
    workload: Workload,
    space: SearchSpace,
    device: str,
    budget_bytes: int | None = None,
    model_copies: int = 1,
    run_step: Probe = probe,
) -> MeasuredBoundary:
    """Bisect the space's micro batches with real steps on ``device``, for the plain recipe and
    (where the space accumulates) the accumulating one, at world size 1.

    ``budget_bytes`` caps the allocator on CUDA as the search's budget does (a card emulated
    smaller than it is); ``model_copies`` is the trial's (an EMA holds one more copy).
    """
    start = time.perf_counter()
    capped = _cap_allocator(device, budget_bytes)
    s = space.search
    micro = sorted(s.micro_batch_size)
    accumulating = [a for a in s.accumulation_steps if a > 1]
    accumulations = [1] * (1 in s.accumulation_steps) + [min(accumulating)] * bool(accumulating)
    edges: dict[Kind, Edge] = {}
    steps = 0
    for accumulation in accumulations:
        low, high = -1, len(micro)  # micro[low] ran, micro[high] ran out (outside: unknown)
        while high - low > 1:
            mid = (low + high) // 2
            config = space.derive(micro[mid], accumulation, 1)
            steps += 1
            if run_step(workload, config, device, model_copies).fits:
                low = mid
            else:
                high = mid
        edges[(accumulation > 1, 1)] = Edge(
            micro[low] if low >= 0 else None, micro[high] if high < len(micro) else None
        )
    return MeasuredBoundary(
        device, budget_bytes if capped else None, edges, steps, time.perf_counter() - start
    )


def _cap_allocator(device: str, budget_bytes: int | None) -> bool:
    """Cap the allocator of a CUDA ``device`` at ``budget_bytes``; whether it was capped."""
    import torch  # deferred: importing the memory room loads no torch (the CLI's start)

    dev = torch.device(device)
    if dev.type != "cuda" or budget_bytes is None:
        return False
    total = int(torch.cuda.get_device_properties(dev).total_memory)
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), dev)
    return True


__all__ = ["Edge", "Kind", "MeasuredBoundary", "find_boundary", "kind_of"]
