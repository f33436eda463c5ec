"""What raybatch's own training loop adds: the built-in loop vs a plain hand-written loop.

The search ranks recipes by their training time to target; whatever the loop adds per step
flattens or reorders the differences between recipes. So the same recipes are run, on the
same seeds, by:

- ``raybatch``: :func:`raybatch.trial.wrapper.run_trial` (the trial a search runs, minus Ray);
- ``plain``: the loop an ML engineer writes by hand: shuffle an index with a seeded generator,
  index the dataset's tensors, forward/backward, step the optimizer and the warmup scheduler on
  the accumulation boundary, and evaluate the whole validation set in one batch at the same
  sample marks.

Both start from the same initial weights and the same data order (the model is built after
``seed_everything(seed)``; the permutation comes from ``torch.Generator().manual_seed(seed)``),
so they follow the same trajectory and reach the target after the same number of samples
(checked: ``samples_to_target`` must agree): the ratio measures the loop alone. Both count
training time to target with evaluation excluded — the objective the search uses.

Runs alternate (ours first on even seeds, plain first on odd), one torch thread, five or more
seeds per recipe, two recipes per workload (a small and a large effective batch). A *pair* is
one recipe on one seed, run both ways; ``ratio`` is the median over pairs of ours / plain,
with a 95% bootstrap interval over pairs (``ratio_ci95``), per recipe (``recipes``), per
workload and over every pair of every workload (``overall``); ``target_met`` = ratio <= 1.10.
Not a ratio of pooled medians: with two recipes whose times cluster apart, each pooled median
falls between the clusters and compares different recipes.

Run: .venv/bin/python bench/loop_overhead.py  (writes bench/results/loop_overhead.json)
"""

from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from provenance import measured_at, write_result
from stats import paired_ratio

import raybatch
from raybatch import Target, keys
from raybatch.examples.digits import DigitsWorkload
from raybatch.examples.tabular import TabularWorkload
from raybatch.space.config import TrialConfig, warmup_factor
from raybatch.space.search_space import SearchSpace
from raybatch.trial.cadence import default_eval_every
from raybatch.trial.loop import seed_everything
from raybatch.trial.settings import TrialSettings
from raybatch.trial.wrapper import run_trial
from raybatch.workload import Workload

RESULTS = Path(__file__).parent / "results" / "loop_overhead.json"
TARGET_RATIO = 1.10
MAX_TIME_S = 60.0
CASES: list[tuple[str, Workload, float, list[tuple[int, int, float]]]] = [
    # name, workload, target accuracy, recipes (micro batch, accumulation, LR multiplier)
    ("digits_cnn", DigitsWorkload(), 0.97, [(32, 1, 1.0), (128, 2, 1.0)]),
    ("tabular_mlp", TabularWorkload(), 0.87, [(64, 1, 1.0), (256, 2, 2.0)]),
]


def ours(workload: Workload, space: SearchSpace, target: float, config: dict[str, Any],
         eval_every: int) -> tuple[float | None, int | None]:  # fmt: skip
    """Training time and samples to target of raybatch's loop (None when not reached)."""
    settings = TrialSettings(Target(target), max_time_s=MAX_TIME_S, eval_every_samples=eval_every)
    reports: list[dict[str, Any]] = []
    run_trial(workload, space, settings, config, report_fn=reports.append)
    final = reports[-1]
    return final[keys.TIME_TO_TARGET_S], final[keys.SAMPLES_TO_TARGET]


def plain(workload: Workload, recipe: TrialConfig, target: float, seed: int,
          eval_every: int) -> tuple[float | None, int | None]:  # fmt: skip
    """The same recipe, by hand: what the built-in loop must not be slower than."""
    import torch.nn.functional as F

    seed_everything(seed)
    model = workload.build_model()
    optimizer = workload.build_optimizer(model, recipe)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_factor(step, recipe.warmup_steps)
    )
    x, y = workload.train_dataset().tensors  # type: ignore[attr-defined]
    vx, vy = workload.val_dataset().tensors  # type: ignore[attr-defined]
    micro, accumulation = recipe.micro_batch_size, recipe.accumulation_steps
    generator = torch.Generator().manual_seed(seed)
    samples, next_mark, eval_s, micro_steps = 0, eval_every, 0.0, 0
    model.train()
    start = time.perf_counter()
    while time.perf_counter() - start - eval_s < MAX_TIME_S:
        order = torch.randperm(len(x), generator=generator)
        for first in range(0, len(x) - micro + 1, micro):
            index = order[first : first + micro]
            loss = F.cross_entropy(model(x[index]), y[index])
            (loss / accumulation).backward()
            micro_steps += 1  # an accumulation window may span two epochs
            if micro_steps % accumulation:
                continue
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            samples += micro * accumulation
            if samples < next_mark:
                continue
            next_mark += eval_every
            began = time.perf_counter()
            model.eval()
            with torch.no_grad():
                accuracy = float((model(vx).argmax(dim=1) == vy).float().mean())
            model.train()
            eval_s += time.perf_counter() - began
            if accuracy >= target:
                return time.perf_counter() - start - eval_s, samples
    return None, None


def _case(name: str, workload: Workload, target: float, recipes_of: list[tuple[int, int, float]],
          seeds: int) -> dict[str, Any]:  # fmt: skip
    space = raybatch.load_space(workload.space or "")
    eval_every = default_eval_every(len(workload.train_dataset()), space)  # type: ignore[arg-type]
    runs = []
    for micro, accumulation, multiplier in recipes_of:
        for seed in range(seeds):
            config = {keys.MICRO_BATCH_SIZE: micro, keys.ACCUMULATION_STEPS: accumulation,
                      keys.LR_MULTIPLIER: multiplier, keys.SEED: seed}  # fmt: skip
            recipe = space.derive_from(config)
            measured: dict[str, tuple[float | None, int | None]] = {}
            for which in ("ours", "plain") if seed % 2 == 0 else ("plain", "ours"):
                measured[which] = (
                    ours(workload, space, target, config, eval_every)
                    if which == "ours"
                    else plain(workload, recipe, target, seed, eval_every)
                )
            runs.append({"micro_batch_size": micro, "accumulation_steps": accumulation,
                         "lr_multiplier": multiplier, "seed": seed,
                         "ours_s": measured["ours"][0], "plain_s": measured["plain"][0],
                         "ours_samples": measured["ours"][1],
                         "plain_samples": measured["plain"][1]})  # fmt: skip
            print(f"{name} {micro}x{accumulation} seed {seed}: ours {measured['ours']},"
                  f" plain {measured['plain']}", flush=True)  # fmt: skip
    pairs = [(r["ours_s"], r["plain_s"]) for r in runs if r["ours_s"] and r["plain_s"]]
    recipes = {}
    for micro, accumulation, multiplier in recipes_of:
        mine = [(r["ours_s"], r["plain_s"]) for r in runs if r["ours_s"] and r["plain_s"]
                and (r["micro_batch_size"], r["accumulation_steps"], r["lr_multiplier"])
                == (micro, accumulation, multiplier)]  # fmt: skip
        recipes[f"{micro}x{accumulation}@{multiplier:g}"] = paired_ratio(mine)
    overall = paired_ratio(pairs)
    return {
        "target": target,
        "eval_every_samples": eval_every,
        "runs": runs,
        "reached_by_both": len(pairs),
        "same_samples_to_target": sum(r["ours_samples"] == r["plain_samples"] for r in runs),
        "ours_median_s": statistics.median(a for a, _ in pairs),
        "plain_median_s": statistics.median(b for _, b in pairs),
        "recipes": recipes,
        "ratio": overall["ratio"],
        "ratio_ci95": overall["ratio_ci95"],
        "target_met": overall["ratio"] <= TARGET_RATIO,
    }


def main(
    seeds: int = 5,
    out: Path = RESULTS,
    cases: list[tuple[str, Workload, float, list[tuple[int, int, float]]]] | None = None,
) -> dict[str, Any]:
    torch.set_num_threads(1)
    at = measured_at()
    data: dict[str, Any] = {
        "benchmark": "loop_overhead",
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "torch": torch.__version__,
        "threads": 1,
        "seeds": seeds,
        "target_ratio": TARGET_RATIO,
        "workloads": {},
    }
    for name, workload, target, recipes in cases or CASES:
        data["workloads"][name] = _case(name, workload, target, recipes, seeds)
        case = data["workloads"][name]
        print(f"{name}: ours {case['ours_median_s']:.3f} s, plain {case['plain_median_s']:.3f} s,"
              f" ratio {case['ratio']:.3f} {case['ratio_ci95']}", flush=True)  # fmt: skip
    every = [(r["ours_s"], r["plain_s"]) for w in data["workloads"].values() for r in w["runs"]
             if r["ours_s"] and r["plain_s"]]  # fmt: skip
    data["overall"] = paired_ratio(every)
    write_result(out, data, at)
    return data


if __name__ == "__main__":
    main()
