"""The trace estimate and the linear model, against bytes counted by hand."""

from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raybatch import load_space
from raybatch.errors import TraceError
from raybatch.examples.digits import workload as digits
from raybatch.memory.estimator import MemoryEstimator, estimate
from raybatch.memory.model import EstimateSource, LinearMemoryModel
from raybatch.memory.trace import (
    CUDA_ALLOCATION_GRANULARITY,
    CUDA_KERNEL_WORKSPACE_BYTES,
    Category,
    MemoryTraceWarning,
    trace_step,
)

from .workloads import C, DataDependentWorkload, H, MLPWorkload, mlp_parameter_bytes

ADAMW = load_space("generic_adamw").reference_config()
SGD_MOMENTUM = load_space("digits_cnn_sgd").reference_config()


@pytest.mark.parametrize("b", [1, 16, 64])
def test_trace_counts_parameters_gradients_and_adam_state_exactly(b: int) -> None:
    t = trace_step(MLPWorkload(), ADAMW, b, cuda=False)
    p = mlp_parameter_bytes()
    assert t.parameter_bytes == p
    assert t.gradient_bytes == p
    # AdamW: exp_avg and exp_avg_sq per parameter, plus one float32 step count per tensor.
    assert t.optimizer_state_bytes == 2 * p + 4 * 4


def test_trace_counts_sgd_momentum_buffers_exactly() -> None:
    t = trace_step(MLPWorkload(), SGD_MOMENTUM, 8, cuda=False)
    assert t.optimizer_state_bytes == mlp_parameter_bytes()


@pytest.mark.parametrize("b", [1, 16, 64, 200])
def test_forward_activations_match_the_hand_count_for_an_mlp(b: int) -> None:
    t = trace_step(MLPWorkload(), ADAMW, b, cuda=False)
    by_hand = b * H * 4 + b * C * 4 + 2 * 4  # ReLU out + log-softmax out + loss, total weight
    assert t.forward_activation_bytes == by_hand  # tolerance: exact on the CPU


def test_breakdown_sums_to_the_peak_and_includes_the_batch() -> None:
    t = trace_step(MLPWorkload(), ADAMW, 32, cuda=False)
    assert sum(t.breakdown.values()) == t.peak_bytes
    assert t.breakdown[Category.INPUTS.value] == 32 * (32 * 4 + 8)  # float inputs + int64 labels
    assert t.peak_bytes > t.parameter_bytes + t.gradient_bytes


def test_bf16_autocast_halves_the_saved_linear_activations() -> None:
    fp32 = trace_step(MLPWorkload(), ADAMW, 64, cuda=False)
    bf16 = trace_step(MLPWorkload(amp_dtype="bf16"), ADAMW, 64, cuda=False)
    assert bf16.forward_activation_bytes < fp32.forward_activation_bytes
    assert bf16.parameter_bytes == fp32.parameter_bytes  # autocast keeps fp32 master weights


def test_accumulation_keeps_gradients_alive_through_the_next_forward() -> None:
    single = trace_step(MLPWorkload(), ADAMW, 64, accumulating=False, cuda=False)
    accumulating = trace_step(MLPWorkload(), ADAMW, 64, accumulating=True, cuda=False)
    assert accumulating.forward_activation_bytes == single.forward_activation_bytes
    assert accumulating.peak_bytes >= single.peak_bytes


def test_cuda_projection_rounds_every_block_to_512_bytes() -> None:
    t = trace_step(MLPWorkload(), ADAMW, 3, cuda=True)
    shapes = [(H, 32), (H,), (C, H), (C,)]
    rounded = sum(
        math.ceil(math.prod(s) * 4 / CUDA_ALLOCATION_GRANULARITY) * CUDA_ALLOCATION_GRANULARITY
        for s in shapes
    )
    assert t.parameter_bytes == rounded
    assert all(v % CUDA_ALLOCATION_GRANULARITY == 0 for v in t.breakdown.values())


def test_linear_model_predicts_a_third_traced_point_of_an_mlp() -> None:
    estimator = MemoryEstimator(MLPWorkload(), ADAMW, cuda=False, anchors=(4, 256), check_batch=48)
    model = estimator.traced_model()
    assert model.check_batch == 48
    assert model.residual_bytes is not None
    assert abs(model.residual_bytes) <= 0.01 * model.predict(48)
    traced = estimator.trace(100)
    assert model.predict(100) == pytest.approx(traced.peak_bytes, rel=0.01)


def test_digits_linear_model_checks_out_within_one_percent() -> None:
    report = estimate(digits, SGD_MOMENTUM, [8, 32, 256], cuda=True)
    residual = report.model.residual_bytes
    assert report.model.check_batch == 32 and residual is not None
    assert abs(residual) <= 0.01 * report.rows[1].predicted_bytes


def _model(fixed: float, slope: float, kink: float = 0.0) -> LinearMemoryModel:
    """One line, or two crossing ones when ``kink`` > 0 (an optimizer-bound segment)."""
    lines = {"backward": ({"activations": fixed}, {"activations": slope})}
    if kink:
        lines["optimizer"] = ({"optimizer_state": fixed + kink}, {"optimizer_state": slope / 4})
    return LinearMemoryModel(lines, (1, 2))


@settings(max_examples=200)
@given(
    fixed=st.integers(min_value=0, max_value=10**9),
    slope=st.integers(min_value=1, max_value=10**7),
    budget=st.integers(min_value=1, max_value=10**11),
    calibration=st.floats(min_value=0.5, max_value=2.0),
    kink=st.sampled_from([0, 10**6]),
)
def test_max_micro_batch_is_the_exact_boundary(
    fixed: int, slope: int, budget: int, calibration: float, kink: int
) -> None:
    model = _model(fixed, slope, kink).calibrated(calibration)
    b = model.max_micro_batch_size(budget)
    assert b is not None
    assert model.predict(b + 1) > budget
    if b > 0:
        assert model.predict(b) <= budget


@given(
    fixed=st.integers(min_value=0, max_value=10**8),
    slope=st.integers(min_value=0, max_value=10**6),
    budget=st.integers(min_value=1, max_value=10**9),
    sizes=st.lists(st.integers(min_value=1, max_value=4096), min_size=2, max_size=20),
    kink=st.sampled_from([0, 10**6]),
)
def test_feasibility_is_monotone_in_the_micro_batch(
    fixed: int, slope: int, budget: int, sizes: list[int], kink: int
) -> None:
    model = _model(fixed, slope, kink)
    for small, large in zip(sorted(sizes), sorted(sizes)[1:], strict=False):
        if model.predict(large) <= budget:
            assert model.predict(small) <= budget


def test_a_batch_independent_peak_sets_no_limit_and_an_oversized_model_allows_nothing() -> None:
    assert _model(100, 0).max_micro_batch_size(1000) is None
    assert _model(5000, 10).max_micro_batch_size(1000) == 0


def test_tight_budget_flags_configs_infeasible_and_reports_numbers() -> None:
    space = load_space("digits_cnn_sgd")
    estimator = MemoryEstimator(digits, space.reference_config(), anchors=(16, 256))
    budget = estimator.predict(space.derive(64))
    fits = estimator.prescreen(space.derive(64), budget)
    too_big = estimator.prescreen(space.derive(128), budget)
    assert fits.fits is True and too_big.fits is False
    assert too_big.predicted_bytes is not None and too_big.predicted_bytes > budget
    assert too_big.source is EstimateSource.TRACE
    assert "micro batch 128: predicted" in too_big.reason and "does not fit" in too_big.reason
    assert sum(too_big.breakdown.values()) == pytest.approx(too_big.predicted_bytes, abs=8)  # type: ignore[union-attr]


def test_cuda_prediction_adds_workspace_ddp_buckets_and_prefetch() -> None:
    space = load_space("digits_cnn_sgd")
    plain = MemoryEstimator(MLPWorkload(), space.reference_config(), anchors=(8, 64))
    one = plain.model_for(1, 1)
    ddp = plain.model_for(1, 4)
    assert one.fixed[Category.EXTRA.value] == CUDA_KERNEL_WORKSPACE_BYTES
    assert ddp.fixed[Category.EXTRA.value] - one.fixed[Category.EXTRA.value] == pytest.approx(
        one.fixed[Category.PARAMETERS.value]
    )
    prefetching = MemoryEstimator(
        MLPWorkload(gpu_prefetch_batches=2), space.reference_config(), anchors=(8, 64)
    ).model_for(1, 1)
    per_sample_batch = one.per_sample[Category.INPUTS.value]
    assert prefetching.per_sample[Category.EXTRA.value] == pytest.approx(2 * per_sample_batch)


def test_calibration_makes_the_probed_point_exact_and_is_reported() -> None:
    space = load_space("digits_cnn_sgd")
    estimator = MemoryEstimator(digits, space.reference_config(), anchors=(8, 256))
    config = space.derive(64)
    measured = int(estimator.predict(config) * 1.07)
    ratio = estimator.calibrate(config, measured)
    assert ratio == pytest.approx(1.07, rel=1e-6)
    assert estimator.predict(config) == pytest.approx(measured, abs=2)
    result = estimator.prescreen(config, 2**30)
    assert result.source is EstimateSource.CALIBRATED
    assert "calibrated x1.070" in estimator.model_for().describe()


def test_trace_failure_names_the_op() -> None:
    with pytest.raises(TraceError) as err:
        trace_step(DataDependentWorkload(), ADAMW, 8, cuda=False)
    assert "aten._local_scalar_dense" in str(err.value)
    assert err.value.op is not None


def test_trace_failure_warns_and_falls_back_to_the_real_probe() -> None:
    space = load_space("generic_adamw")
    estimator = MemoryEstimator(DataDependentWorkload(), space.reference_config())
    with pytest.warns(MemoryTraceWarning, match="aten._local_scalar_dense.*falling back"):
        result = estimator.prescreen(space.derive(16), 2**30, probe_device="cpu")
    assert result.source is EstimateSource.PROBE
    assert result.fits is True
    assert "real step at micro batch 16 on cpu ran" in result.reason


def test_trace_failure_without_a_probe_never_says_fits() -> None:
    space = load_space("generic_adamw")
    estimator = MemoryEstimator(DataDependentWorkload(), space.reference_config())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemoryTraceWarning)
        result = estimator.prescreen(space.derive(16), 2**30)
    assert result.fits is None
    assert "the trial's real probe decides" in result.reason


def test_tracing_leaves_the_workloads_data_real() -> None:
    """A dataset first built inside the trace must not be cached as fake tensors."""
    trace_step(digits, SGD_MOMENTUM, 8)
    images, _labels = digits.train_dataset()[0]
    assert type(images).__name__ == "Tensor"
    assert float(images.sum()) >= 0.0  # a fake tensor cannot be read


def test_bf16_trace_follows_cuda_autocast_float32_list_by_hand_count() -> None:
    """CUDA autocast runs layer_norm and softmax in float32; CPU autocast (which the trace
    runs under) keeps them in bf16. The trace applies CUDA's rule: counted by hand for a
    64 x 128 batch, every block rounded to 512 bytes, the activations alive after forward are

    - the Linear's input cast to bf16, saved for the weight's gradient: 64 x 128 x 2 = 16384
    - LayerNorm's input, saved: float32 on CUDA 64 x 128 x 4 = 32768 (bf16 on CPU: 16384)
    - LayerNorm's mean and rstd, float32, 64 x 4 bytes each, rounded: 2 x 512 = 1024
    - softmax's output, saved: float32 on CUDA 32768 (bf16 on CPU: 16384)
    - the loss, a scalar: 512
    """
    from contextlib import nullcontext

    from raybatch.memory import trace as trace_module

    from .workloads import NormSoftmaxWorkload

    workload = NormSoftmaxWorkload(amp_dtype="bf16")
    cuda = trace_step(workload, ADAMW, 64, cuda=True)
    assert cuda.forward_activation_bytes == 16384 + 32768 + 1024 + 32768 + 512
    original = trace_module.cuda_autocast_policy
    try:  # the same trace under CPU autocast's rule alone: what the trace predicted before
        trace_module.cuda_autocast_policy = lambda w: nullcontext()
        cpu_rule = trace_step(workload, ADAMW, 64, cuda=True)
    finally:
        trace_module.cuda_autocast_policy = original
    assert cpu_rule.forward_activation_bytes == 16384 + 16384 + 1024 + 16384 + 512
    # Without autocast the policy changes nothing: float32 throughout, as on CUDA (and the
    # Linear saves the batch itself, an input, not a cast copy).
    plain = NormSoftmaxWorkload()
    assert trace_step(plain, ADAMW, 64, cuda=True).forward_activation_bytes == (
        32768 + 1024 + 32768 + 512
    )


def test_a_small_batchs_probe_does_not_veto_a_large_batch_it_never_probed() -> None:
    """The probe at micro batch 16 reserved 50 % more than the trace (rounding, workspace):
    kept as bytes at that batch, it adds those bytes near it, and 256 -- never probed -- is
    predicted the trace's figure plus those bytes, not 1.5 x it."""
    space = load_space("digits_cnn_sgd")
    estimator = MemoryEstimator(digits, space.reference_config(), anchors=(8, 256))
    small, large = space.derive(16), space.derive(256)
    traced_small, traced_large = estimator.predict(small), estimator.predict(large)
    excess = estimator.observe(small, int(traced_small * 1.5))
    assert excess == pytest.approx(traced_small * 0.5, abs=2)
    assert estimator.predict(small) == pytest.approx(traced_small * 1.5, abs=2)
    assert estimator.predict(large) == traced_large + excess
    budget = traced_large + excess + 1  # fits with the bytes, not with the ratio
    assert budget < 1.5 * traced_large
    assert estimator.prescreen(large, budget).fits
    # A probe below the trace never lowers it; a second one at the same batch keeps the max.
    assert estimator.observe(small, traced_small // 2) == excess
    assert estimator.excess(space.derive(64, 2)) == 0  # accumulating: another kind of recipe


def test_a_new_probe_never_lowers_a_prediction() -> None:
    """Probed at 64 (a large excess), then at 16 (none): 32 and 256 keep the 64's excess
    where they are at least 64, and nothing below a probe gets less than before."""
    space = load_space("digits_cnn_sgd")
    estimator = MemoryEstimator(digits, space.reference_config(), anchors=(8, 256))
    at64 = space.derive(64)
    estimator.observe(at64, estimator.predict(at64) + 2**30)
    before = {b: estimator.predict(space.derive(b)) for b in (16, 32, 64, 128, 256)}
    estimator.observe(space.derive(16), estimator.predict(space.derive(16)))  # no excess there
    after = {b: estimator.predict(space.derive(b)) for b in (16, 32, 64, 128, 256)}
    assert all(after[b] >= before[b] for b in before)
    assert after[256] == before[256] and after[32] == before[32]


def test_what_ran_out_refuses_every_recipe_needing_no_less_memory_naming_the_trial() -> None:
    """A larger micro batch, more workers or accumulation (one more gradient buffer, the same
    for 2 steps as for 16) needs no less than the recipe that ran out: refused; a smaller
    micro batch or fewer workers may fit: let through."""
    from raybatch.memory.prescreen import RanOut, learned_oom, needs_at_least

    space = load_space("digits_cnn_sgd")
    ran_out = [RanOut("t7", space.derive(128, 2, 2))]
    assert learned_oom(space.derive(256, 2, 2), ran_out) == (
        "needs at least the memory of trial t7 (micro batch 128 x 2), which ran out of memory"
    )
    assert needs_at_least(space.derive(128, 4, 2), space.derive(128, 2, 2))  # 4 steps as 2
    for fits in (space.derive(64, 2, 2), space.derive(128, 1, 2), space.derive(128, 2, 1)):
        assert learned_oom(fits, ran_out) is None
    assert learned_oom(space.derive(256, 2, 2), []) is None
