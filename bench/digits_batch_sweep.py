"""Time to target across batch recipes for the bundled digits example: optimal is not maximal.

Runs raybatch's own trial (``run_trial``: probe-free CPU loop, its default marks, the
``digits_cnn_sgd`` rules) for a grid of micro batch x accumulation at the rule-scaled LR,
three seeds each, on one torch thread, and records the median time to 97% validation accuracy.

Run: .venv/bin/python bench/digits_batch_sweep.py   (writes bench/results/digits_batch_sweep.json)
"""

from __future__ import annotations

import platform
import statistics
from pathlib import Path
from typing import Any

import torch
from provenance import measured_at, write_result

import raybatch
from raybatch.examples.digits import DigitsWorkload
from raybatch.trial.settings import TrialSettings
from raybatch.trial.wrapper import run_trial

RESULTS = Path(__file__).parent / "results" / "digits_batch_sweep.json"
GRID = [(16, 1), (32, 1), (64, 1), (128, 1), (256, 1), (64, 4), (256, 4)]


def main(
    grid: list[tuple[int, int]] = GRID,
    seeds: tuple[int, ...] = (0, 1, 2),
    max_time_s: float = 15.0,
    out: Path = RESULTS,
) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    space = raybatch.load_space("digits_cnn_sgd")
    workload = DigitsWorkload()
    at = measured_at()
    settings = TrialSettings(raybatch.Target(0.97), max_time_s=max_time_s)
    rows = []
    for micro, accumulation in grid:
        runs = []
        for seed in seeds:  # interleaving seeds inside a config keeps the data warm
            config = {"micro_batch_size": micro, "accumulation_steps": accumulation, "seed": seed}
            reporter = run_trial(workload, space, settings, config, report_fn=lambda m: None)
            runs.append({"seed": seed, "status": reporter.status.value,
                         "time_to_target_s": reporter.tally.time_to_target_s})  # fmt: skip
        times = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
        recipe = space.derive(micro, accumulation)
        rows.append(
            {
                "micro_batch_size": micro,
                "accumulation_steps": accumulation,
                "effective_batch_size": recipe.effective_batch_size,
                "lr": recipe.lr,
                "reached": f"{len(times)}/{len(runs)}",
                "median_time_to_target_s": statistics.median(times) if times else None,
                "runs": runs,
            }
        )
        print(f"micro {micro:>3} x accum {accumulation}: {rows[-1]['reached']} reached,"
              f" median {rows[-1]['median_time_to_target_s']}")  # fmt: skip
    write_result(
        out,
        {
            "benchmark": "digits_batch_sweep",
            "machine": f"{platform.machine()}, 1 torch thread",
            "torch": torch.__version__,
            "target": 0.97,
            "max_time_s": max_time_s,
            "rows": rows,
        },
        at,
    )
    return rows


if __name__ == "__main__":
    main()
