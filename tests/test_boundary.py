"""The top of the batch range measured by real steps, on CPU with an emulated device cap: the
bisection, and its verdict deciding over the trace wherever the search asks whether a recipe
fits (the gate, the largest batch that fits, nothing fits)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from raybatch import load_space
from raybatch.memory.boundary import Edge, MeasuredBoundary, find_boundary
from raybatch.memory.estimator import MemoryEstimator
from raybatch.memory.model import EstimateSource
from raybatch.memory.probe import ProbeResult, probe
from raybatch.space.config import TrialConfig
from raybatch.tuning.gates import MemoryFits
from raybatch.tuning.seeding import budget_check, max_batch_point, nothing_fits
from raybatch.workload import Workload

from .workloads import MLPWorkload

SPACE = load_space("generic_adamw")  # micro batches 16..256, accumulation 1..8


class CappedMLP(MLPWorkload):
    """Runs out of memory, with CUDA's own exception, above ``cap`` samples in a forward pass:
    a device of a known capacity, emulated."""

    name = "capped_mlp"

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def build_model(self) -> nn.Module:
        model = super().build_model()
        cap = self.cap

        def out_of_memory(_: nn.Module, inputs: Any) -> None:
            if inputs[0].shape[0] > cap:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")

        model.register_forward_pre_hook(out_of_memory)
        return model


def test_real_steps_bisect_the_micro_batches_to_the_largest_that_ran() -> None:
    steps: list[tuple[int, int]] = []

    def counted(w: Workload, c: TrialConfig, device: str, copies: int) -> ProbeResult:
        steps.append((c.micro_batch_size, c.accumulation_steps))
        return probe(w, c, device, copies)

    found = find_boundary(CappedMLP(100), SPACE, "cpu", run_step=counted)
    assert found.edges == {(False, 1): Edge(64, 128), (True, 1): Edge(64, 128)}
    assert len(steps) <= 2 * 3  # a bisection of five sizes for each kind, not a sweep
    assert {a for _, a in steps} == {1, 2}  # plain, and the space's smallest accumulation
    assert found.budget_bytes is None  # on CPU no allocator is capped
    everything = find_boundary(CappedMLP(10_000), SPACE, "cpu")
    assert everything.edges[(False, 1)] == Edge(256, None)
    nothing = find_boundary(CappedMLP(8), SPACE, "cpu")
    assert nothing.edges[(False, 1)] == Edge(None, 16)


def _estimator_between(low: int, high: int) -> tuple[MemoryEstimator, int]:
    """An estimator and a budget by which the trace admits ``low`` and refuses ``high``."""
    estimator = MemoryEstimator.for_space(MLPWorkload(), SPACE)
    below, above = (estimator.predict(SPACE.derive(m)) for m in (low, high))
    return estimator, (below + above) // 2


def test_the_measured_boundary_decides_over_the_trace_where_it_speaks() -> None:
    estimator, budget = _estimator_between(32, 64)
    assert estimator.prescreen(SPACE.derive(64), budget).fits is False  # the trace alone
    estimator.boundary = MeasuredBoundary("cuda:0", budget, {(False, 1): Edge(128, 256)})
    admitted = estimator.prescreen(SPACE.derive(128), budget)
    assert admitted.fits is True and admitted.source is EstimateSource.PROBE
    assert "largest that ran a real step was 128" in admitted.reason
    refused = estimator.prescreen(SPACE.derive(256), budget)
    assert refused.fits is False and "256 ran out of memory" in refused.reason
    # Where the steps do not speak (an accumulating recipe, not measured here), the trace does.
    assert estimator.prescreen(SPACE.derive(128, 2), budget).fits is False
    # Measured under another budget, the steps say nothing about this one.
    assert estimator.prescreen(SPACE.derive(128), budget // 2).source is not EstimateSource.PROBE


def test_the_gate_the_largest_batch_and_nothing_fits_read_the_measured_boundary() -> None:
    estimator, budget = _estimator_between(32, 64)
    assert max_batch_point(SPACE, budget_check(estimator, budget))["micro_batch_size"] == 32
    estimator.boundary = MeasuredBoundary("cuda:0", budget, {(False, 1): Edge(128, 256)})
    assert max_batch_point(SPACE, budget_check(estimator, budget))["micro_batch_size"] == 128
    gate = MemoryFits(estimator, budget)
    assert gate.check(SPACE.derive(128)) is None
    rejection = gate.check(SPACE.derive(256))
    assert rejection is not None and "ran out of memory" in rejection.reason
    assert rejection.violation > 0  # taught infeasible: TPE steers away
    assert nothing_fits(SPACE, estimator, budget) is None
    # Run out on the whole device (no cap), a recipe runs out under any budget.
    estimator.boundary = MeasuredBoundary("cuda:0", None, {(False, 1): Edge(None, 16)})
    why = nothing_fits(SPACE, estimator, budget * 100)  # the trace would admit everything
    assert why is not None and "16 ran out of memory" in why


@pytest.mark.usefixtures("ray_session")
def test_without_a_gpu_to_step_on_the_trace_decides_and_the_notes_say_so() -> None:
    from raybatch.cluster.gpu_budget import cluster_boundary
    from raybatch.cluster.hardware import ClusterView, NodeView

    notes: list[str] = []
    cpus = ClusterView((NodeView("head", "10.0.0.1", 3, 0),))
    assert cluster_boundary(cpus, None, MLPWorkload(), SPACE, 2**30, notes) is None
    assert notes == ["the top of the batch range was not measured: no GPU node is alive"]
    gpus = ClusterView((NodeView("w", "10.0.0.2", 3, 1),))  # counted, but this Ray has none
    assert cluster_boundary(gpus, None, MLPWorkload(), SPACE, 2**30, notes, timeout_s=1) is None
    assert "not measured (no GPU free to measure it on within 1 s)" in notes[-1]
