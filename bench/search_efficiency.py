"""Search efficiency on the simulated workload family: regret, compute and OOM crashes.

Strategies, at equal trial budgets (10, 20, 40, 80 launched trials; a budget's figures are read
off the first N trials of one sequential run, which is what a run with that budget would do):

- ``max_batch``: Lightning's power finder (double the batch from 2 until OOM, 3 steps a try)
  then one trial at the largest batch that fits, accumulation 1, rule-scaled LR;
- ``random``: Ray Tune-style random search over the raw knobs; no pre-screen, no capping;
- ``optuna``: plain TPE over independent raw knobs (what ``OptunaSearch`` does); no
  pre-screen, no capping, no seeding;
- ``raybatch``: :class:`raybatch.run.searcher.RaybatchSearcher` (pre-screen, seeded with the
  reference and the max-batch baseline) with adaptive capping (slack 1.2);
- ``raybatch_no_prescreen`` and ``raybatch_no_capping``: one part switched off each.

Per strategy: regret (true time to target of the config it would pick, the fastest measured
one, divided by the true optimum; median and 90th percentile over seeds), simulated GPU
seconds spent, OOM crashes suffered.

Run: .venv/bin/python bench/search_efficiency.py   (writes bench/results/search_efficiency.json)
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import optuna

sys.path.insert(0, str(Path(__file__).parent))

from simulator import (
    ACCUMULATION,
    LR_MULTIPLIER,
    MEMBERS,
    MICRO,
    Member,
    SimulatedEstimator,
    sim_space,
)

from raybatch import keys
from raybatch.run.searcher import RaybatchSearcher
from raybatch.run.seeding import max_batch_point, reference_point, searched_knobs

RESULTS = Path(__file__).parent / "results" / "search_efficiency.json"
BUDGETS = (10, 20, 40, 80)
STRATEGIES = ("max_batch", "random", "optuna", "raybatch", "raybatch_no_prescreen",
              "raybatch_no_capping")  # fmt: skip
SLACK = 1.2

Trial = dict[str, Any]  # knobs + outcome + cost


def _outcome(member: Member, knobs: tuple[int, int, float], rng: random.Random,
             cap_s: float | None = None) -> Trial:  # fmt: skip
    micro, accumulation, multiplier = knobs
    return {"knobs": knobs, **member.run(micro, accumulation, multiplier, rng, cap_s)}


def run_max_batch(member: Member, rng: random.Random, n: int) -> list[Trial]:
    """Lightning's power-mode finder, then one trial at the batch it found."""
    cost, batch = 0.0, 2
    while batch <= 2**20:
        if not member.fits(batch):
            cost += member.step_time(batch, 1)  # the step that ran out of memory
            break
        cost += 3 * member.step_time(batch, 1)
        batch *= 2
    largest = max([m for m in MICRO if member.fits(m)] or [MICRO[0]])
    trial = _outcome(member, (largest, 1, 1.0), rng)
    trial["cost"] += cost
    return [trial]


def run_random(member: Member, rng: random.Random, n: int) -> list[Trial]:
    low, high = (math.log(v) for v in LR_MULTIPLIER)
    return [
        _outcome(
            member,
            (rng.choice(MICRO), rng.choice(ACCUMULATION), math.exp(rng.uniform(low, high))),
            rng,
        )
        for _ in range(n)
    ]


def run_optuna(member: Member, rng: random.Random, n: int, seed: int) -> list[Trial]:
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed, multivariate=True))
    trials = []
    for _ in range(n):
        t = study.ask()
        knobs = (
            t.suggest_categorical(keys.MICRO_BATCH_SIZE, MICRO),
            t.suggest_categorical(keys.ACCUMULATION_STEPS, ACCUMULATION),
            t.suggest_float(keys.LR_MULTIPLIER, *LR_MULTIPLIER, log=True),
        )
        trial = _outcome(member, knobs, rng)
        study.tell(t, trial["time"] if trial["time"] is not None else 10 * member.max_time_s)
        trials.append(trial)
    return trials


def run_raybatch(member: Member, rng: random.Random, n: int, seed: int,
                 prescreen: bool = True, capping: bool = True) -> list[Trial]:  # fmt: skip
    space = sim_space()
    estimator = SimulatedEstimator(member)

    def fits(recipe: Any) -> bool:
        return estimator.predict(recipe) <= member.budget

    points = (reference_point(space), max_batch_point(space, fits))
    seeds = [searched_knobs(space, p) for p in points if p is not None]
    searcher = RaybatchSearcher(
        space, storage_url=None, study_name=f"sim-{member.name}-{seed}",  # type: ignore[arg-type]
        penalty=10 * member.max_time_s, estimator=estimator if prescreen else None,
        budget_bytes=int(member.budget), points_to_evaluate=seeds, seed=seed,
    )  # fmt: skip
    trials: list[Trial] = []
    best: float | None = None
    for i in range(n):
        config = searcher.suggest(f"t{i}")
        assert config is not None
        knobs = (config[keys.MICRO_BATCH_SIZE], config[keys.ACCUMULATION_STEPS],
                 config[keys.LR_MULTIPLIER])  # fmt: skip
        cap = SLACK * best if capping and best is not None else None
        trial = _outcome(member, knobs, rng, cap)
        status = {"oom": "infeasible_memory", "capped": "running"}.get(
            trial["status"], trial["status"]
        )
        result = {keys.STATUS: status, keys.TIME_TO_TARGET_S: trial["time"],
                  keys.OBJECTIVE: trial["time"], keys.ELAPSED_S: trial["cost"]}  # fmt: skip
        searcher.on_trial_complete(f"t{i}", result)
        if trial["time"] is not None:
            best = trial["time"] if best is None else min(best, trial["time"])
        trial["prescreened"] = len(searcher.prescreened)
        trials.append(trial)
    return trials


def run(strategy: str, member: Member, seed: int, n: int) -> list[Trial]:
    rng = random.Random(seed * 7919 + zlib.crc32(member.name.encode()) % 1000)  # stable
    if strategy == "max_batch":
        return run_max_batch(member, rng, n)
    if strategy == "random":
        return run_random(member, rng, n)
    if strategy == "optuna":
        return run_optuna(member, rng, n, seed)
    return run_raybatch(member, rng, n, seed, prescreen=strategy != "raybatch_no_prescreen",
                        capping=strategy != "raybatch_no_capping")  # fmt: skip


def score(member: Member, trials: list[Trial], optimum: float) -> dict[str, float]:
    """Regret of the fastest measured config, GPU seconds and OOM crashes of a trial prefix."""
    reached = [t for t in trials if t["time"] is not None]
    if reached:
        chosen = min(reached, key=lambda t: t["time"])["knobs"]
        regret = member.true_time(*chosen) / optimum
    else:
        regret = 10 * member.max_time_s / optimum  # PAR-10: nothing usable was found
    return {
        "regret": regret,
        "gpu_seconds": sum(t["cost"] for t in trials),
        "oom_crashes": sum(1 for t in trials if t["status"] == "oom"),
        "prescreened_out": trials[-1].get("prescreened", 0) if trials else 0,
    }


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


def main(
    seeds: int = 20,
    budgets: tuple[int, ...] = BUDGETS,
    members: list[Member] | None = None,
    strategies: tuple[str, ...] = STRATEGIES,
    out: Path = RESULTS,
) -> list[dict[str, Any]]:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rows = []
    start = time.perf_counter()
    for member in members or MEMBERS:
        optimum, where = member.optimum()
        for strategy in strategies:
            runs = [run(strategy, member, seed, max(budgets)) for seed in range(seeds)]
            for budget in budgets:
                scores = [score(member, r[:budget], optimum) for r in runs]
                rows.append({
                    "workload": member.name,
                    "strategy": strategy,
                    "trials": budget if strategy != "max_batch" else 1,
                    "budget": budget,
                    "seeds": seeds,
                    "median_regret": statistics.median(s["regret"] for s in scores),
                    "p90_regret": _p90([s["regret"] for s in scores]),
                    "gpu_seconds": statistics.median(s["gpu_seconds"] for s in scores),
                    "oom_crashes": sum(s["oom_crashes"] for s in scores),
                    "prescreened_out": statistics.median(s["prescreened_out"] for s in scores),
                    "optimum_s": optimum,
                    "optimum_at": list(where),
                })  # fmt: skip
            last = rows[-1]
            print(f"{member.name:>20} {strategy:>22}: median regret {last['median_regret']:.3f}"
                  f" at {last['budget']} trials, {last['gpu_seconds']:.0f} GPU s,"
                  f" {last['oom_crashes']} OOM crashes")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "search_efficiency", "seeds": seeds,
                               "elapsed_s": time.perf_counter() - start, "rows": rows},
                              indent=2) + "\n")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
