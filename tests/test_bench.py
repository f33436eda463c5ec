"""Benchmarks are not timed tests: these only prove the benchmark code runs and writes results."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the scripts import their sibling models.py
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_space_overhead_benchmark_writes_a_ratio_per_storage(tmp_path: Path) -> None:
    out = tmp_path / "space_overhead.json"
    rows = _load("space_overhead").main(trials=3, repeats=1, out=out)
    data = json.loads(out.read_text())
    assert data["rows"] == rows
    assert [r["storage"] for r in rows] == ["memory", "sqlite"]
    for r in rows:
        assert r["ratio"] == r["raybatch_space_s_per_trial"] / r["plain_optuna_s_per_trial"]
        assert r["plain_optuna_s_per_trial"] > 0


def test_trace_cost_benchmark_times_every_micro_batch(tmp_path: Path) -> None:
    module = _load("trace_cost")
    cases = [("digits_cnn", module.DigitsWorkload, "digits_cnn_sgd")]
    results = module.main(repeats=1, out=tmp_path / "t.json", cases=cases)
    digits = results["workloads"]["digits_cnn"]
    assert [r["micro_batch_size"] for r in digits["rows"]] == [
        16,
        16,
        32,
        32,
        64,
        64,
        128,
        128,
        256,
        256,
    ]
    assert digits["configs_in_space"] == 15
    assert all(r["median_s"] > 0 for r in digits["rows"])


def test_gpu_benchmark_predictions_run_without_a_gpu() -> None:
    module = _load("gpu_memory_accuracy")
    rows = module.predictions({"mlp": [2, 4], "transformer": [1, 2]}, dtypes=(None,))
    assert [(r["workload"], r["micro_batch_size"]) for r in rows] == [
        ("mlp", 2), ("mlp", 4), ("transformer", 1), ("transformer", 2),
    ]  # fmt: skip
    assert all(r["predicted_bytes"] > 0 for r in rows)
    assert "| mlp | fp32 | 2 |" in module.markdown(
        {"device": "cpu", "torch": "x", "date": "d", "context_overhead_bytes": None,
         "peaks": rows, "boundaries": []}
    )  # fmt: skip


def test_committed_results_exist_for_every_cpu_benchmark() -> None:
    for script in BENCH.glob("*.py"):
        if script.stem == "models" or getattr(_load(script.stem), "REQUIRES_GPU", False):
            continue
        result = BENCH / "results" / f"{script.stem}.json"
        assert result.is_file(), f"run `make bench`: {result} is missing"
        assert json.loads(result.read_text())["benchmark"] == script.stem


def test_gpu_trial_benchmark_data_is_learnable_and_batches_build_on_cpu() -> None:
    module = _load("gpu_trial_timing")
    workload = module.LearnableResNet()
    images, labels = workload.example_batch(3)
    assert images.shape == (3, 3, 64, 64) and labels.shape == (3,)
    assert len(set(workload.train_dataset().tensors[1].tolist())) == 10  # every class occurs


def test_digits_sweep_records_a_status_per_seed(tmp_path: Path) -> None:
    rows = _load("digits_batch_sweep").main(
        grid=[(256, 1)], seeds=(0,), max_time_s=0.5, out=tmp_path / "s.json"
    )
    assert rows[0]["runs"][0]["status"] in ("reached", "censored")
    assert rows[0]["effective_batch_size"] == 256
