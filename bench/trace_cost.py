"""What the zero-GPU pre-screen costs: CPU seconds per traced configuration.

Times ``trace_step`` (one fake-tensor training step) for every distinct micro batch of a
space, for the bundled digits example and a ResNet-18 at ImageNet size, and the whole
pre-screen of every point of the space (fit the per-op linear models, then predict each
point). Target from issue 3: under 1 s per configuration for the example on this 2-core
machine.

Run: .venv/bin/python bench/trace_cost.py   (writes bench/results/trace_cost.json)
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from models import ResNet18
from provenance import measured_at, write_result

import raybatch
from raybatch.examples.digits import DigitsWorkload
from raybatch.memory.estimator import MemoryEstimator
from raybatch.memory.trace import trace_step
from raybatch.workload import Workload

RESULTS = Path(__file__).parent / "results" / "trace_cost.json"
CASES: list[tuple[str, Any, str]] = [
    ("digits_cnn", DigitsWorkload, "digits_cnn_sgd"),
    ("resnet18_224", ResNet18, "resnet50_imagenet_sgd"),
]


def time_case(workload: Workload, space: raybatch.SearchSpace, repeats: int) -> dict[str, Any]:
    config = space.reference_config()
    trace_step(workload, config, 2)  # first-call imports and dataset loading, not timed
    rows = []
    for b in sorted(space.search.micro_batch_size):
        for accumulating in (False, True):
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                trace_step(workload, config, b, accumulating)
                times.append(time.perf_counter() - start)
            rows.append(
                {
                    "micro_batch_size": b,
                    "accumulating": accumulating,
                    "median_s": statistics.median(times),
                }
            )
    grid = list(space.grid())
    start = time.perf_counter()
    estimator = MemoryEstimator(
        workload,
        config,
        anchors=(min(space.search.micro_batch_size), max(space.search.micro_batch_size)),
    )
    for cfg in grid:
        estimator.predict(cfg)
    screen_s = time.perf_counter() - start
    return {
        "rows": rows,
        "median_s_per_trace": statistics.median(r["median_s"] for r in rows),
        "max_s_per_trace": max(r["median_s"] for r in rows),
        "configs_in_space": len(grid),
        "screen_whole_space_s": screen_s,
        "screen_s_per_config": screen_s / len(grid),
    }


def main(
    repeats: int = 3, out: Path = RESULTS, cases: list[tuple[str, Any, str]] = CASES
) -> dict[str, Any]:
    torch.set_num_threads(1)
    at = measured_at()
    results: dict[str, Any] = {
        "benchmark": "trace_cost",
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s)",
        "torch": torch.__version__,
        "repeats": repeats,
        "workloads": {},
    }
    for name, cls, space_name in cases:
        results["workloads"][name] = {"space": space_name} | time_case(
            cls(), raybatch.load_space(space_name), repeats
        )
    write_result(out, results, at)
    for name, r in results["workloads"].items():
        print(
            f"{name:>14}: {r['median_s_per_trace']:.3f} s per trace"
            f" (max {r['max_s_per_trace']:.3f}),"
            f" whole space of {r['configs_in_space']} configs screened in"
            f" {r['screen_whole_space_s']:.2f} s ({r['screen_s_per_config']:.3f} s per config)"
        )
    return results


if __name__ == "__main__":
    main()
