"""Benchmarks are not timed tests: these only prove the benchmark code runs and writes results."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

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
        if script.stem in ("models", "simulator", "render_docs"):
            continue
        if getattr(_load(script.stem), "REQUIRES_GPU", False):
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


def test_search_efficiency_benchmark_rows_have_the_required_fields(tmp_path: Path) -> None:
    module = _load("search_efficiency")
    simulator = _load("simulator")
    rows = module.main(seeds=2, budgets=(5, 10), members=simulator.MEMBERS[1:2],
                       out=tmp_path / "s.json")  # fmt: skip
    assert {r["strategy"] for r in rows} == set(module.STRATEGIES)
    required = {"workload", "strategy", "trials", "median_regret", "p90_regret", "gpu_seconds",
                "oom_crashes"}  # fmt: skip
    assert all(required <= set(r) for r in rows)
    assert all(r["median_regret"] >= 1.0 - 1e-9 for r in rows)  # nothing beats the optimum
    ours = [r for r in rows if r["strategy"] == "raybatch"]
    assert all(r["oom_crashes"] == 0 for r in ours)  # pre-screened: heavy batches never run


def test_simulator_members_cover_the_cases_the_benchmark_needs() -> None:
    simulator = _load("simulator")
    cases = {}
    for member in simulator.MEMBERS:
        optimum, (_micro, accumulation, _) = member.optimum()
        largest = member.max_fitting_micro()
        cases[member.name] = (accumulation > 1, member.true_time(largest, 1, 1.0) / optimum)
    assert cases["needs_accumulation"][0]  # the best effective batch needs accumulation
    assert cases["max_batch_optimal"][1] == 1.0  # the heuristic is right there
    assert cases["small_noise_scale"][1] > 1.5  # and badly wrong here


def test_docs_are_rendered_from_the_committed_results(tmp_path: Path) -> None:
    text = _load("render_docs").main(out=tmp_path / "benchmarks.md")
    assert "## Search efficiency on the simulated workload family" in text
    assert "median regret <= 1.10 within 20 trials" in text
    committed = (BENCH.parent / "docs" / "benchmarks.md").read_text()
    assert committed == text, "run `make bench` (or bench/render_docs.py) and commit docs/"


@pytest.mark.slow
def test_plugin_overhead_benchmark_times_both_sides(ray_session: None, tmp_path: Path) -> None:
    data = _load("plugin_overhead").main(trials=3, repeats=1, out=tmp_path / "o.json")
    assert len(data["plain_s"]) == len(data["raybatch_s"]) == 1
    assert data["ratio"] == data["raybatch_median_s"] / data["plain_median_s"]
