"""Search efficiency on the simulated workload family: regret against compute, every peer
charged alike.

Strategies (each run sequentially, one trial at a time; a budget's figures are read off the
first N trials of one run, which is what a run with that budget would do):

- ``max_batch``: Lightning's power finder (double the batch from 2 until OOM, 3 steps a try)
  then one trial at the largest batch that fits, accumulation 1, the rule's LR;
- ``max_batch_lr_sweep``: the same finder, then the largest batch at LR multipliers 0.5, 1, 2
  and 4 of the rule's, each trained to the target (the strong simple baseline);
- ``random``: random search over the raw knobs (Ray Tune's default searcher);
- ``optuna_tpe``: plain TPE as Optuna's defaults give it (what ``OptunaSearch`` runs: 10
  random trials, independent TPE), no seeds, no early stopping;
- ``asha`` / ``asha_tpe``: Ray Tune's ``ASHAScheduler`` rule (rungs on samples at 1, 3, 9...
  evaluation marks, reduction factor 3, the validation metric judged at each rung) over random
  and over TPE suggestions;
- ``hyperband``: Optuna's ``HyperbandPruner`` (reduction factor 3, marks as steps) with TPE --
  the BOHB-like combination;
- ``raybatch``: :class:`raybatch.run.searcher.RaybatchSearcher` as the search runs it: the
  plan (the largest batch at an LR sweep and the reference, then the ladder from the time
  model, :mod:`raybatch.run.prior`, measured with the member's noise-scale error and charged),
  the pre-screen with the member's imperfect estimate and a 20% probe margin, adaptive capping
  at slack 1.2 on the final level and 1.5 on every intermediate level
  (:class:`raybatch.run.scheduler.CappingScheduler`'s rule), then TPE;
- ablations: ``raybatch_no_model`` (the ladder without the time model), ``raybatch_no_fidelity``
  (capping on the final time only), ``raybatch_no_plan`` (only the reference and the max batch
  seeded, as before the plan), ``raybatch_no_prescreen``.

Every strategy's pick is confirmed the same way (:func:`race`): its two fastest distinct
recipes race on paired seeds, 2 to 5 rounds, the loser of a pair stopped at 1.2x the winner's
time; the winner is the recipe faster in most pairs. The confirmation is charged to every
strategy alike.

Per strategy and budget: regret (true time to target of the confirmed pick / the true optimum;
median and 90th percentile over seeds), compute (simulated GPU seconds and in units of the
optimum's time to target: "trainings"; finder steps, OOMs, the prior's measurement and the
confirmation included), OOM crashes per search, and ``compute_to_regret_105``: the median
compute, in trainings, of the shortest prefix of the run whose confirmed pick has regret
<= 1.05 (``None`` where fewer than half the seeds get there).

Run: .venv/bin/python bench/search_efficiency.py   (writes bench/results/search_efficiency.json)
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

sys.path.insert(0, str(Path(__file__).parent))

from provenance import measured_at, write_result
from simulator import (
    ACCUMULATION,
    LR_MULTIPLIER,
    MEMBERS,
    MICRO,
    Member,
    SimulatedEstimator,
    sim_space,
    simulated_time_model,
)

from raybatch import keys
from raybatch.run.scheduler import DEFAULT_LEVEL_SLACK, Trajectory, behind
from raybatch.run.searcher import RaybatchSearcher
from raybatch.run.seeding import (
    Ladder,
    budget_check,
    max_batch_point,
    opening_points,
    reference_point,
    searched_knobs,
)

RESULTS = Path(__file__).parent / "results" / "search_efficiency.json"
BUDGETS = (5, 10, 20, 40, 80)
PREFIXES = (5, 8, 10, 12, 15, 20, 25, 30, 40, 60, 80)
STRATEGIES = ("max_batch", "max_batch_lr_sweep", "random", "optuna_tpe", "asha", "asha_tpe",
              "hyperband", "raybatch", "raybatch_no_model", "raybatch_no_fidelity",
              "raybatch_no_plan", "raybatch_no_prescreen")  # fmt: skip
SLACK = 1.2
PROBE_MARGIN = 0.2
SWEEP = (0.5, 1.0, 2.0, 4.0)
ETA = 3

Trial = dict[str, Any]  # knobs + outcome + cost


def _outcome(member: Member, knobs: tuple[int, int, float], rng: random.Random,
             cap_s: float | None = None, stop: Any = None) -> Trial:  # fmt: skip
    micro, accumulation, multiplier = knobs
    return {"knobs": knobs, **member.run(micro, accumulation, multiplier, rng, cap_s, stop)}


def _finder_cost(member: Member) -> float:
    """Lightning's power finder: 3 steps at each doubling from 2, then the step that OOMs."""
    cost, batch = 0.0, 2
    while batch <= 2**20:
        if not member.fits(batch):
            return cost + member.step_time(batch, 1)
        cost += 3 * member.step_time(batch, 1)
        batch *= 2
    return cost


def run_max_batch(member: Member, rng: random.Random, n: int, sweep: tuple[float, ...] = (1.0,)
                  ) -> list[Trial]:  # fmt: skip
    largest = member.max_fitting_micro()
    trials = [_outcome(member, (largest, 1, m), rng) for m in sweep]
    trials[0]["cost"] += _finder_cost(member)
    return trials


def _random_knobs(rng: random.Random) -> tuple[int, int, float]:
    low, high = (math.log(v) for v in LR_MULTIPLIER)
    return rng.choice(MICRO), rng.choice(ACCUMULATION), math.exp(rng.uniform(low, high))


def _tpe_knobs(t: optuna.Trial) -> tuple[int, int, float]:
    return (t.suggest_categorical(keys.MICRO_BATCH_SIZE, MICRO),
            t.suggest_categorical(keys.ACCUMULATION_STEPS, ACCUMULATION),
            t.suggest_float(keys.LR_MULTIPLIER, *LR_MULTIPLIER, log=True))  # fmt: skip


def _asha_stop(rungs: dict[int, list[float]]) -> Callable[[float, float], bool]:
    """Ray Tune's ASHA rule on one trial: at rung marks 1, 3, 9..., stop below the top 1/3."""
    seen = [0]

    def stop(_t: float, progress: float) -> bool:
        seen[0] += 1
        mark = seen[0]
        if round(math.log(mark, ETA), 9) % 1:  # not a rung
            return False
        recorded = rungs.setdefault(mark, [])
        recorded.append(progress)
        ordered = sorted(recorded)
        cutoff = ordered[min(len(ordered) - 1, int((1 - 1 / ETA) * len(ordered)))]
        return len(recorded) > 1 and progress < cutoff

    return stop


def run_random(member: Member, rng: random.Random, n: int, asha: bool = False) -> list[Trial]:
    rungs: dict[int, list[float]] = {}
    return [_outcome(member, _random_knobs(rng), rng, stop=_asha_stop(rungs) if asha else None)
            for _ in range(n)]  # fmt: skip


def run_tpe(member: Member, rng: random.Random, n: int, seed: int, early: str | None = None
            ) -> list[Trial]:  # fmt: skip
    """TPE as Optuna's defaults give it; ``early``: ``asha`` or ``hyperband`` stopping."""
    pruner = optuna.pruners.HyperbandPruner(reduction_factor=ETA) if early == "hyperband" else None
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed), pruner=pruner)
    rungs: dict[int, list[float]] = {}
    trials = []
    for _ in range(n):
        t = study.ask()
        stop: Any = _asha_stop(rungs) if early == "asha" else None
        if early == "hyperband":
            stop = _pruner_stop(t)
        trial = _outcome(member, _tpe_knobs(t), rng, stop=stop)
        if trial["status"] == "capped" and early == "hyperband":
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(t, trial["time"] if trial["time"] is not None else 10 * member.max_time_s)
        trials.append(trial)
    return trials


def _pruner_stop(t: optuna.Trial) -> Callable[[float, float], bool]:
    step = [0]

    def stop(_t: float, progress: float) -> bool:
        step[0] += 1
        t.report(progress, step[0])
        return bool(t.should_prune())

    return stop


def _searcher(member: Member, seed: int, prescreen: bool, plan: bool, model: bool
              ) -> tuple[RaybatchSearcher, float]:  # fmt: skip
    """raybatch's searcher for ``member`` as the driver builds it, and the prior's cost."""
    space = sim_space()
    # Without the pre-screen there is no estimate anywhere: the opening's "largest batch" is
    # the space's largest, and only OOMs (remembered, replaced) teach the search what fits.
    estimator = SimulatedEstimator(member) if prescreen else None
    fits = budget_check(estimator, int(member.budget), PROBE_MARGIN)
    baseline = max_batch_point(space, fits)
    reference = reference_point(space)
    prior = simulated_time_model(member) if plan and model else None
    if plan:
        points = opening_points(space, baseline, reference)
        ladder = Ladder(space, estimator, int(member.budget), prior)
    else:
        points = [searched_knobs(space, p) for p in (reference, baseline) if p is not None]
        ladder = None
    searcher = RaybatchSearcher(
        space, storage_url=None,  # type: ignore[arg-type]
        study_name=f"sim-{member.name}-{seed}", penalty=10 * member.max_time_s,
        estimator=estimator, budget_bytes=int(member.budget),
        points_to_evaluate=points, seed=seed, ladder=ladder,
        probe_margin=PROBE_MARGIN if prescreen else 0.0, baseline=baseline if plan else None,
    )  # fmt: skip
    return searcher, prior.cost_s if prior is not None else 0.0


def _level_stop(incumbent: Trajectory | None, level_slack: float | None
                ) -> tuple[Trajectory, Callable[[float, float], bool] | None]:  # fmt: skip
    trajectory = Trajectory("max")

    def stop(t: float, progress: float) -> bool:
        trajectory.add(t, progress)
        assert incumbent is not None and level_slack is not None
        return behind(incumbent, trajectory, t, level_slack)

    return trajectory, (stop if incumbent is not None and level_slack is not None else None)


def run_raybatch(member: Member, rng: random.Random, n: int, seed: int, prescreen: bool = True,
                 plan: bool = True, model: bool = True, fidelity: bool = True
                 ) -> list[Trial]:  # fmt: skip
    searcher, prior_cost = _searcher(member, seed, prescreen, plan, model)
    level_slack = DEFAULT_LEVEL_SLACK if fidelity else None
    trials: list[Trial] = []
    best: float | None = None
    incumbent: Trajectory | None = None
    for i in range(n):
        config = searcher.suggest(f"t{i}")
        assert isinstance(config, dict)
        knobs = (config[keys.MICRO_BATCH_SIZE], config[keys.ACCUMULATION_STEPS],
                 config[keys.LR_MULTIPLIER])  # fmt: skip
        _, stop = _level_stop(incumbent, level_slack)
        trial = _outcome(member, knobs, rng, SLACK * best if best is not None else None, stop)
        status = {"oom": "infeasible_memory", "capped": "running"}.get(
            trial["status"], trial["status"]
        )
        result = {keys.STATUS: status, keys.TIME_TO_TARGET_S: trial["time"],
                  keys.OBJECTIVE: trial["time"], keys.ELAPSED_S: trial["cost"]}  # fmt: skip
        searcher.on_trial_complete(f"t{i}", result)
        if trial["time"] is not None and (best is None or trial["time"] < best):
            best = trial["time"]
            incumbent = Trajectory("max")
            for t, progress in trial["marks"]:
                incumbent.add(t, progress)
            incumbent.reached_s = best
        trial["prescreened"] = len(searcher.prescreened)
        trials.append(trial)
    if trials:
        trials[0]["cost"] += prior_cost
    return trials


def run(strategy: str, member: Member, seed: int, n: int) -> list[Trial]:
    rng = random.Random(seed * 7919 + zlib.crc32(member.name.encode()) % 1000)  # stable
    if strategy.startswith("max_batch"):
        return run_max_batch(member, rng, n, SWEEP if strategy.endswith("sweep") else (1.0,))
    if strategy in ("random", "asha"):
        return run_random(member, rng, n, asha=strategy == "asha")
    if strategy in ("optuna_tpe", "asha_tpe", "hyperband"):
        early = {"asha_tpe": "asha", "hyperband": "hyperband"}.get(strategy)
        return run_tpe(member, rng, n, seed, early)
    return run_raybatch(member, rng, n, seed, prescreen=strategy != "raybatch_no_prescreen",
                        plan=strategy != "raybatch_no_plan",
                        model=strategy != "raybatch_no_model",
                        fidelity=strategy != "raybatch_no_fidelity")  # fmt: skip


def race(member: Member, trials: list[Trial], rng: random.Random, rounds: int = 5
         ) -> tuple[tuple[int, int, float] | None, float]:  # fmt: skip
    """The confirmation every strategy gets: its two fastest distinct recipes race on paired
    seeds (2 to ``rounds`` rounds, the second run of a pair stopped at ``SLACK`` x the first's
    time), the winner faster in most pairs. Returns the pick and what the runs cost."""
    reached = sorted((t for t in trials if t["time"] is not None), key=lambda t: t["time"])
    chosen: list[tuple[int, int, float]] = []
    for t in reached:
        if t["knobs"] not in chosen:
            chosen.append(t["knobs"])
    if len(chosen) < 2:
        return (chosen[0] if chosen else None), 0.0
    a, b = chosen[:2]
    cost, wins = 0.0, []
    for i in range(rounds):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        one = member.run(*first, rng)
        cost += one["cost"]
        other = member.run(*second, rng, cap_s=SLACK * one["time"] if one["time"] else None)
        cost += other["cost"]
        first_won = other["time"] is None or (
            one["time"] is not None and one["time"] < other["time"]
        )
        wins.append((first == a) == first_won)
        if len(wins) >= 2 and (all(wins) or not any(wins)):
            break
    return (a if sum(wins) * 2 >= len(wins) else b), cost


def score(member: Member, trials: list[Trial], optimum: float, rng: random.Random
          ) -> dict[str, float]:  # fmt: skip
    """Regret of the confirmed pick, compute (confirmation included) and OOM crashes."""
    chosen, extra = race(member, trials, rng)
    cost = sum(t["cost"] for t in trials) + extra
    regret = member.true_time(*chosen) / optimum if chosen is not None else math.inf
    if math.isinf(regret):
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


def _to_regret(member: Member, run_: list[Trial], optimum: float, seed: int) -> float:
    """Compute (in trainings) of the shortest prefix whose confirmed pick has regret <= 1.05."""
    for n in [p for p in PREFIXES if p <= len(run_)] or [len(run_)]:
        s = score(member, run_[:n], optimum, random.Random(seed * 31 + n))
        if s["regret"] <= 1.05:
            return s["compute"] / optimum
    return math.inf


def _rows(member: Member, strategy: str, runs: list[list[Trial]], budgets: tuple[int, ...],
          seeds: int) -> list[dict[str, Any]]:  # fmt: skip
    optimum, where = member.optimum()
    to_regret = statistics.median(_to_regret(member, r, optimum, s) for s, r in enumerate(runs))
    rows = []
    for budget in budgets:
        scores = [score(member, r[:budget], optimum, random.Random(seed * 31 + budget))
                  for seed, r in enumerate(runs)]  # fmt: skip
        compute = statistics.median(s["compute"] for s in scores)
        rows.append({
            "workload": member.name, "strategy": strategy,
            "trials": min(budget, len(runs[0])), "budget": budget, "seeds": seeds,
            "median_regret": statistics.median(s["regret"] for s in scores),
            "p90_regret": _p90([s["regret"] for s in scores]),
            "compute_median": compute, "compute_trainings": compute / optimum,
            "compute_to_regret_105": None if math.isinf(to_regret) else to_regret,
            "oom_median": statistics.median(s["oom_crashes"] for s in scores),
            "oom_p90": _p90([s["oom_crashes"] for s in scores]),
            "estimator_error": member.estimate_error,
            "prescreened_out": statistics.median(s["prescreened_out"] for s in scores),
            "optimum_s": optimum, "optimum_at": list(where),
        })  # fmt: skip
    return rows


def main(
    seeds: int = 20,
    budgets: tuple[int, ...] = BUDGETS,
    members: list[Member] | None = None,
    strategies: tuple[str, ...] = STRATEGIES,
    out: Path = RESULTS,
) -> list[dict[str, Any]]:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rows: list[dict[str, Any]] = []
    at = measured_at()
    start = time.perf_counter()
    for member in members or MEMBERS:
        for strategy in strategies:
            runs = [run(strategy, member, seed, max(budgets)) for seed in range(seeds)]
            rows += _rows(member, strategy, runs, budgets, seeds)
            last = next(r for r in reversed(rows) if r["budget"] == 20 or r is rows[-1])
            print(f"{member.name:>22} {strategy:>22}: median regret {last['median_regret']:.3f}"
                  f" at {last['budget']} trials, {last['compute_trainings']:.1f} trainings,"
                  f" to 1.05: {last['compute_to_regret_105']}", flush=True)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    members_info = {
        m.name: {"best_lr_multiplier": m.best_multiplier, "estimator_error": m.estimate_error,
                 "noise_scale_error": m.noise_scale_error,
                 "follows_model": m.steps_rise_past is None and m.lr_batch_exponent == 0}
        for m in members or MEMBERS
    }  # fmt: skip
    write_result(out, {"benchmark": "search_efficiency", "seeds": seeds,
                               "strategies": list(strategies), "confirmation": "race of the top 2,"
                               " paired seeds, 2-5 rounds, every strategy",
                               "confirmation_charged": True, "members": members_info,
                               "elapsed_s": time.perf_counter() - start, "rows": rows},
                 at)  # fmt: skip
    return rows


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    """Median regret against median compute (trainings), one panel per member, one line per
    strategy through its budgets: the peers compared at equal compute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    members = list(dict.fromkeys(r["workload"] for r in rows))
    cols = 4
    fig, axes = plt.subplots(math.ceil(len(members) / cols), cols, figsize=(14, 3.2 * math.ceil(
        len(members) / cols)), squeeze=False)  # fmt: skip
    for ax, member in zip(axes.flat, members, strict=False):
        for strategy in dict.fromkeys(r["strategy"] for r in rows):
            mine = sorted((r for r in rows if (r["workload"], r["strategy"]) == (member, strategy)),
                          key=lambda r: r["budget"])  # fmt: skip
            style = "-o" if strategy == "raybatch" else ("--" if "raybatch" in strategy else ":.")
            ax.plot([r["compute_trainings"] for r in mine], [r["median_regret"] for r in mine],
                    style, label=strategy, linewidth=2.2 if strategy == "raybatch" else 1.0,
                    markersize=3)  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(member, fontsize=9)
        ax.set_xlabel("compute (trainings of the optimum)", fontsize=8)
        ax.set_ylabel("median regret", fontsize=8)
    for ax in list(axes.flat)[len(members) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    plot(main(), Path(__file__).parent.parent / "docs" / "search_efficiency.png")
