"""Real training on this machine: raybatch's confirmed winner vs the max-batch heuristic vs the
reference recipe, time to target re-measured side by side.

For each bundled example workload (digits CNN with momentum SGD; an MLP on generated tabular
data with AdamW):

1. a real raybatch search (``raybatch.search``: local Ray, Optuna in SQLite, capping,
   confirmation) picks its winner;
2. three recipes are then re-run ``reruns`` times each, *interleaved* (winner, max batch,
   reference, then the next round in a rotated order), with fresh seeds, on one torch thread:
   - ``raybatch``: the confirmed winner;
   - ``max_batch``: the largest micro batch that fits, accumulation 1, LR and weight decay
     scaled by the space's rules (what a batch-size finder plus the linear/sqrt rule gives);
   - ``reference``: the space's reference recipe, unscaled.

A run that does not reach the target within ``max_time_s`` counts as not reached; the median is
taken over all runs with those at ``+inf`` (so it is ``None`` when half or more failed).
The ratio is the other recipe's median over the winner's (> 1: the winner is faster).
On this CPU machine nothing limits the batch but the space: the max batch is the largest micro
batch the space lists.

Run: .venv/bin/python bench/real_training.py  (writes bench/results/real_training.json)
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import raybatch
from raybatch import keys
from raybatch.examples.digits import DigitsWorkload
from raybatch.examples.tabular import TabularWorkload
from raybatch.run.options import SearchOptions
from raybatch.trial.wrapper import TrialSettings, run_trial
from raybatch.workload import Workload

RESULTS = Path(__file__).parent / "results" / "real_training.json"
CASES: list[tuple[str, Workload, str, float]] = [
    ("digits_cnn", DigitsWorkload(), "raybatch.examples.digits:workload", 0.97),
    ("tabular_mlp", TabularWorkload(), "raybatch.examples.tabular:workload", 0.87),
]
RECIPES = ("raybatch", "max_batch", "reference")


def _median(times: list[float | None]) -> float | None:
    value = statistics.median(math.inf if t is None else t for t in times)
    return None if math.isinf(value) else value


def _search(
    name: str,
    workload: Workload,
    ref: str,
    target: float,
    trials: int,
    max_time_s: float,
    confirm_seeds: int = 3,
) -> tuple[dict[str, dict[str, Any]], float, dict[str, Any]]:
    """Run the search; return the three recipes' raw knobs, its wall time and its winner."""
    space = raybatch.load_space(workload.space)
    run_dir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-")) / "run"
    options = SearchOptions(trials=trials, max_time_s=max_time_s, gpus_per_trial=0, seed=0,
                            confirm_seeds=confirm_seeds)  # fmt: skip
    start = time.perf_counter()
    result = raybatch.search(workload, space, target, run_dir, options, ref, verbose=0)
    wall = time.perf_counter() - start
    if result.best is None:
        raise RuntimeError(f"{name}: no candidate reached {target} in every confirmation run")
    best = result.best.config
    recipes = {
        "raybatch": {k: getattr(best, k) for k in keys.RAW_KNOBS},
        "max_batch": {**(result.baseline or {}), keys.LR_MULTIPLIER: 1.0},
        "reference": {**(result.reference or {}), keys.LR_MULTIPLIER: 1.0},
    }
    winner = {
        "config": best.to_dict(),
        "search_median_time_to_target_s": result.best.provenance["median_time_to_target_s"],
        "run_dir": str(run_dir),
    }
    return recipes, wall, winner


def _rerun(
    workload: Workload,
    target: float,
    recipes: dict[str, dict[str, Any]],
    reruns: int,
    max_time_s: float,
) -> dict[str, list[dict[str, Any]]]:
    """Every recipe ``reruns`` times, interleaved, the order rotated each round."""
    space = raybatch.load_space(workload.space)
    settings = TrialSettings(raybatch.Target(target), max_time_s=max_time_s)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in recipes}
    names = list(recipes)
    for round_ in range(reruns):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            config = {**recipes[name], keys.SEED: 1000 + round_}
            reporter = run_trial(workload, space, settings, config, report_fn=lambda m: None)
            runs[name].append(
                {
                    "seed": 1000 + round_,
                    "status": reporter.status.value,
                    "time_to_target_s": reporter.time_to_target_s,
                }
            )
    return runs


def main(
    cases: list[tuple[str, Workload, str, float]] = CASES,
    trials: int = 12,
    reruns: int = 5,
    max_time_s: float = 20.0,
    out: Path = RESULTS,
    confirm_seeds: int = 3,
) -> dict[str, Any]:
    rows = []
    for name, workload, ref, target in cases:
        recipes, search_wall, winner = _search(
            name, workload, ref, target, trials, max_time_s, confirm_seeds
        )
        torch.set_num_threads(1)  # the reruns: one thread each, as each search trial had
        runs = _rerun(workload, target, recipes, reruns, max_time_s)
        space = raybatch.load_space(workload.space)
        medians = {n: _median([r["time_to_target_s"] for r in runs[n]]) for n in recipes}
        win = medians["raybatch"]
        for recipe in RECIPES:
            derived = space.derive_from(recipes[recipe])
            median = medians[recipe]
            rows.append(
                {
                    "workload": name,
                    "target": target,
                    "recipe": recipe,
                    "micro_batch_size": derived.micro_batch_size,
                    "accumulation_steps": derived.accumulation_steps,
                    "effective_batch_size": derived.effective_batch_size,
                    "lr": derived.lr,
                    "lr_multiplier": derived.lr_multiplier,
                    "reached": sum(r["status"] == "reached" for r in runs[recipe]),
                    "runs": runs[recipe],
                    "median_time_to_target_s": median,
                    "ratio_to_raybatch": (median / win) if median and win else None,
                }
            )
            print(f"{name:12} {recipe:10} {derived.micro_batch_size:>5} x"
                  f" {derived.accumulation_steps} lr {derived.lr:.4g}:"
                  f" {rows[-1]['reached']}/{reruns} reached, median {median}")  # fmt: skip
        rows.append(
            {
                "workload": name,
                "recipe": "search",
                "trials": trials,
                "search_wall_s": search_wall,
                "winner": winner,
            }
        )
    data = {
        "benchmark": "real_training",
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread per run",
        "torch": torch.__version__,
        "reruns": reruns,
        "max_time_s": max_time_s,
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    return data


if __name__ == "__main__":
    main()
