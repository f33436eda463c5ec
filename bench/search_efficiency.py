"""Search efficiency on the simulated workload family: regret, compute and OOM crashes.

Strategies, at equal trial budgets (10, 20, 40, 80 launched trials; a budget's figures are read
off the first N trials of one sequential run, which is what a run with that budget would do):

- ``max_batch``: Lightning's power finder (double the batch from 2 until OOM, 3 steps a try)
  then one trial at the largest batch that fits, accumulation 1, rule-scaled LR;
- ``random``: Ray Tune-style random search over the raw knobs; no pre-screen, no capping;
- ``optuna``: plain multivariate TPE over the raw knobs, given what raybatch is given — the same
  two seeded points (reference recipe, max batch by the same estimate) and the same startup
  count — but no pre-screen, no capping, no confirmation;
- ``raybatch``: :class:`raybatch.run.searcher.RaybatchSearcher` (pre-screen with the member's
  imperfect estimate, seeded with the reference and the max-batch baseline) with adaptive
  capping (slack 1.2), then the confirmation the search runs: the 3 fastest candidates, the
  baseline and the reference re-run 3 times each, uncapped, the winner the lowest median among
  those that reached the target every time (``selection.select_winner``'s rule);
- ``raybatch_no_prescreen``, ``raybatch_no_capping``, ``raybatch_no_seeds``: one part switched
  off each.

Per strategy: regret (true time to target of the config it picks, divided by the true optimum;
median and 90th percentile over seeds), simulated GPU seconds spent (``compute_median``: the
confirmation included for the strategies that run one), OOM crashes per search (median and
90th percentile).

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
from raybatch.run.study import STARTUP_TRIALS

RESULTS = Path(__file__).parent / "results" / "search_efficiency.json"
BUDGETS = (10, 20, 40, 80)
STRATEGIES = ("max_batch", "random", "optuna", "raybatch", "raybatch_no_prescreen",
              "raybatch_no_capping", "raybatch_no_seeds")  # fmt: skip
CONFIRMED = frozenset(s for s in STRATEGIES if s.startswith("raybatch"))
SLACK = 1.2
CONFIRM_TOP, CONFIRM_SEEDS = 3, 3

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


def _seeded_points(member: Member) -> list[dict[str, Any]]:
    """The reference recipe and the max batch by the member's (imperfect) estimate."""
    space = sim_space()
    estimator = SimulatedEstimator(member)
    points = (reference_point(space),
              max_batch_point(space, lambda r: estimator.predict(r) <= member.budget))  # fmt: skip
    return [searched_knobs(space, p) for p in points if p is not None]


def run_optuna(member: Member, rng: random.Random, n: int, seed: int) -> list[Trial]:
    sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                         n_startup_trials=STARTUP_TRIALS)  # fmt: skip
    study = optuna.create_study(sampler=sampler)
    for point in _seeded_points(member):
        study.enqueue_trial(point, skip_if_exists=True)
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


def run_raybatch(member: Member, rng: random.Random, n: int, seed: int, prescreen: bool = True,
                 capping: bool = True, seeded: bool = True) -> list[Trial]:  # fmt: skip
    points = _seeded_points(member) if seeded else []
    searcher = RaybatchSearcher(
        sim_space(), storage_url=None,  # type: ignore[arg-type]
        study_name=f"sim-{member.name}-{seed}", penalty=10 * member.max_time_s,
        estimator=SimulatedEstimator(member) if prescreen else None,
        budget_bytes=int(member.budget), points_to_evaluate=points, seed=seed,
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
        trial["seeded"] = i < len(points)
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
                        capping=strategy != "raybatch_no_capping",
                        seeded=strategy != "raybatch_no_seeds")  # fmt: skip


def confirm(member: Member, trials: list[Trial], rng: random.Random
            ) -> tuple[tuple[int, int, float] | None, float]:  # fmt: skip
    """The search's confirmation, simulated: the recipe it exports and what the runs cost."""
    reached = sorted((t for t in trials if t["time"] is not None), key=lambda t: t["time"])
    chosen: list[tuple[int, int, float]] = []
    for t in reached:
        if t["knobs"] not in chosen and len(chosen) < CONFIRM_TOP:
            chosen.append(t["knobs"])
    for t in trials:  # the baseline and the reference, when they reached or were capped
        if t.get("seeded") and t["status"] in ("reached", "capped") and t["knobs"] not in chosen:
            chosen.append(t["knobs"])
    cost, medians = 0.0, []
    for knobs in chosen:
        runs = [member.run(*knobs, rng) for _ in range(CONFIRM_SEEDS)]
        cost += sum(r["cost"] for r in runs)
        if all(r["time"] is not None for r in runs):
            medians.append((statistics.median(r["time"] for r in runs), knobs))
    return (min(medians)[1] if medians else None), cost


def score(member: Member, trials: list[Trial], optimum: float,
          rng: random.Random | None = None) -> dict[str, float]:  # fmt: skip
    """Regret of the exported config, compute and OOM crashes of a trial prefix.

    With ``rng`` the strategy confirms (raybatch's), and the confirmation's cost is charged;
    otherwise it exports the fastest config it measured.
    """
    cost = sum(t["cost"] for t in trials)
    if rng is not None:
        chosen, extra = confirm(member, trials, rng)
        cost += extra
    else:
        reached = [t for t in trials if t["time"] is not None]
        chosen = min(reached, key=lambda t: t["time"])["knobs"] if reached else None
    if chosen is not None:
        regret = member.true_time(*chosen) / optimum
    else:
        regret = 10 * member.max_time_s / optimum  # PAR-10: nothing usable was found
    return {
        "regret": regret,
        "compute": cost,
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
                scores = [
                    score(member, r[:budget], optimum,
                          random.Random(seed * 31 + budget) if strategy in CONFIRMED else None)
                    for seed, r in enumerate(runs)
                ]  # fmt: skip
                rows.append({
                    "workload": member.name,
                    "strategy": strategy,
                    "trials": budget if strategy != "max_batch" else 1,
                    "budget": budget,
                    "seeds": seeds,
                    "median_regret": statistics.median(s["regret"] for s in scores),
                    "p90_regret": _p90([s["regret"] for s in scores]),
                    "compute_median": statistics.median(s["compute"] for s in scores),
                    "oom_median": statistics.median(s["oom_crashes"] for s in scores),
                    "oom_p90": _p90([s["oom_crashes"] for s in scores]),
                    "estimator_error": member.estimate_error,
                    "prescreened_out": statistics.median(s["prescreened_out"] for s in scores),
                    "optimum_s": optimum,
                    "optimum_at": list(where),
                })  # fmt: skip
            last = rows[-1]
            print(f"{member.name:>20} {strategy:>22}: median regret {last['median_regret']:.3f}"
                  f" at {last['budget']} trials, {last['compute_median']:.0f} GPU s,"
                  f" {last['oom_median']} OOM crashes (median)")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    members_info = {
        m.name: {"best_lr_multiplier": m.best_multiplier, "estimator_error": m.estimate_error}
        for m in members or MEMBERS
    }
    out.write_text(json.dumps({"benchmark": "search_efficiency", "seeds": seeds,
                               "confirmation_charged": True, "members": members_info,
                               "elapsed_s": time.perf_counter() - start, "rows": rows},
                              indent=2) + "\n")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
