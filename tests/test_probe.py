"""The real probe on CPU: the OOM path through the real exception type, and memory release."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

from raybatch import load_space
from raybatch.memory.model import EstimateSource
from raybatch.memory.probe import is_out_of_memory, probe

from .workloads import MLPWorkload, OOMWorkload

CONFIG = load_space("generic_adamw").derive(32)


def test_probe_on_cpu_runs_one_step_and_measures_nothing_it_cannot() -> None:
    result = probe(MLPWorkload(), CONFIG, "cpu")
    assert result.fits is True
    assert result.error is None
    assert (result.max_allocated_bytes, result.max_reserved_bytes) == (None, None)
    # With an EMA's copy held through the step, the model's own bytes, read from the model the
    # step built (the trial subtracts them from its calibration without building it again).
    assert result.model_bytes is None  # one copy: nothing asked
    held = probe(MLPWorkload(), CONFIG, "cpu", model_copies=2)
    params = MLPWorkload().build_model()
    assert held.model_bytes == sum(p.numel() * p.element_size() for p in params.parameters())


def test_injected_cuda_oom_is_caught_reported_and_memory_released() -> None:
    workload = OOMWorkload()
    result = probe(workload, CONFIG, "cpu")
    assert result.fits is False
    assert result.error is not None and result.error.startswith("CUDA out of memory")
    # Everything the failed step built is gone once probe returns: no reference survives
    # in a traceback, a frame or a cycle.
    gc.collect()
    assert workload.models and all(ref() is None for ref in workload.models)
    verdict = result.as_prescreen(2**30)
    assert verdict.fits is False and verdict.source is EstimateSource.PROBE
    assert "ran out of memory: CUDA out of memory" in verdict.reason


def test_probe_lets_errors_that_are_not_oom_propagate() -> None:
    class Broken(MLPWorkload):
        def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
            raise ValueError("bug in the user's loss")

    with pytest.raises(ValueError, match="bug in the user's loss"):
        probe(Broken(), CONFIG, "cpu")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), True),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
        (ValueError("CUDA out of memory"), False),
        # A failed cudaMalloc outside the caching allocator (torch >= 2.8's AcceleratorError).
        (torch.AcceleratorError("CUDA error: out of memory"), True),
        (torch.AcceleratorError("CUDA error: an illegal memory access was encountered"), False),
    ],
)
def test_oom_is_recognised_by_type_and_only_legacy_messages(
    exc: BaseException, expected: bool
) -> None:
    assert is_out_of_memory(exc) is expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_cuda_probe_measures_peak_and_survives_a_real_oom() -> None:
    ok = probe(MLPWorkload(), CONFIG, "cuda:0")
    assert ok.fits and ok.max_allocated_bytes and ok.max_reserved_bytes
    total = torch.cuda.get_device_properties(0).total_memory
    huge = load_space("generic_adamw").derive(int(total // (32 * 4)) * 4)
    failed = probe(MLPWorkload(), huge, "cuda:0")
    assert failed.fits is False
    assert torch.cuda.memory_allocated(0) == 0


def test_a_cpu_trials_cleanup_skips_the_full_collection_the_unknown_device_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CPU trial has no cached device memory to hand back, and its slot would sit idle for
    a full collection (0.2 s with torch loaded) between two trials; a cleanup that does not
    know its device (after an out-of-memory error) still collects."""
    import raybatch.memory.probe as probe_module

    collected: list[int] = []
    monkeypatch.setattr(probe_module.gc, "collect", lambda *a: collected.append(1) or 0)
    probe_module.release_memory("cpu")
    assert collected == []
    probe_module.release_memory()
    assert collected == [1]
