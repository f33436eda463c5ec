"""Benchmarks are not timed tests: these only prove the benchmark code runs and writes results."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load(name: str) -> ModuleType:
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


def test_committed_results_exist_for_every_benchmark() -> None:
    for script in BENCH.glob("*.py"):
        result = BENCH / "results" / f"{script.stem}.json"
        assert result.is_file(), f"run `make bench`: {result} is missing"
        assert json.loads(result.read_text())["benchmark"] == script.stem
