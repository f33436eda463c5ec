"""The rung rule on real learning curves: what each rule saves, and what it loses.

The equal-time rungs (:mod:`raybatch.tuning.rungs`) stop a trial early only where its rank there
holds; how well early ranks hold is a property of real curves, not of the simulated family's.
This replays the real benchmark's grid (``bench/results/real_training.json``: every micro
batch at each LR, one run each, its curve of metric against training time) through the
shipped :class:`~raybatch.tuning.scheduler.CappingScheduler`, built as the driver builds it
(:meth:`~raybatch.tuning.scheduler.CappingScheduler.for_time_cap`, through the simulated
benchmark's ``_Capping``), on the simulated benchmark's
clock (:func:`search_efficiency.simulate_search`: two slots, marks in clock order, heartbeats
between them). Only the rule's settings vary.

Each draw: the opening as the plan builds it (:func:`~raybatch.tuning.seeding.opening_points`:
the largest batch at the LR sweep and the reference recipe), then recipes drawn at random from
the rest of the grid, 12 in all. Per case and rule, over the draws: the training seconds the
trials held, in trainings of the grid's best (no start-up nor evaluation: the rule's share of
the cost), the part of it before the search's first reach (while ``B`` is the guess), and the
regret of the fastest recipe that reached against the fastest of those drawn (each recipe's
one grid run: what the rule saw is what it is judged by), median and 90th percentile, with
the share of draws where the fastest drawn was stopped.

The confirmation's race replays too: each recipe has one recorded curve, so its fresh-seed run
is that curve again (to the race's meeting level, or the target; the race's cap is not
applied), and the race's pair repeats the search's, cut short: the replay measures the rule,
not the race.

The curves are the grid's as measured, at the evaluation marks of the commit the real
benchmark ran at (recorded under ``source``), and no warmup is flagged (the grid keeps no
warmup flag): the shipped rule judges a trial in its warmup at every rung once a trial has
reached the target, as here, but not before (it judges it once, past its warmup), so its cost
can only be higher; its regret may differ either way.

Run: .venv/bin/python bench/rung_replay.py   (after bench/real_training.py; writes
bench/results/rung_replay.json)
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import search_efficiency as se
from provenance import measured_at, write_result

import raybatch
from raybatch import keys
from raybatch.tuning.options import SearchOptions
from raybatch.tuning.rungs import DEFAULT_ETA, DEFAULT_ZONE, HEDGE
from raybatch.tuning.seeding import opening_points

REAL = Path(__file__).parent / "results" / "real_training.json"
RESULTS = Path(__file__).parent / "results" / "rung_replay.json"
TRIALS = 12
SLOTS = 2
PAUSE = SearchOptions().pause


def _rule(zone: float | None, hedge: float, pause: bool, eta: float = DEFAULT_ETA
          ) -> dict[str, Any]:  # fmt: skip
    return {"zone": zone, "hedge": hedge, "pause": pause, "eta": eta}


RULES: dict[str, dict[str, Any]] = {
    "shipped": _rule(DEFAULT_ZONE, HEDGE, PAUSE),
    "stopped_not_paused": _rule(DEFAULT_ZONE, HEDGE, False),
    "zone_unhedged": _rule(DEFAULT_ZONE, 0.0, False),
    "level_or_top_third": _rule(0.0, 0.0, False),
    "no_rungs": _rule(None, HEDGE, False),
    "halving_by_2": _rule(DEFAULT_ZONE, HEDGE, PAUSE, eta=2.0),
    "halving_by_4": _rule(DEFAULT_ZONE, HEDGE, PAUSE, eta=4.0),
}
"""The shipped rule (a trial behind at a rung below the top paused, :mod:`raybatch.run.
promotion`), the same stopping trials instead of pausing them (the rule before pauses), its
zone unhedged (10 % at every rung), no zone at all (a trial goes on only while level with the
best curve or in the top third: ASHA's rule with ties kept), capping on the final time alone,
and the shipped rule halving by 2 and by 4 instead of 3 (its rungs and its guess of ``B``
before a reach, the cap / eta, with it): what halving harder saves, and what it loses."""


class _Observed(se._Capping):
    """The rule as the simulated benchmark drives it, noting each trial's training up to the
    search's first reach: before it, ``B`` is a guess and the rungs are tied to it."""

    def __init__(self, zone: float | None, max_time_s: float, pause: bool = False,
                 **rule: Any) -> None:  # fmt: skip
        super().__init__(zone, max_time_s, pause, **rule)
        self.before_reach: dict[str, float] = {}

    def mark(self, trial_id: str, t: float, progress: float | None, beat: bool = False
             ) -> bool | str:  # fmt: skip
        if self.scheduler.best_time_to_target_s is None:
            self.before_reach[trial_id] = max(t, self.before_reach.get(trial_id, 0.0))
        return super().mark(trial_id, t, progress, beat)


class ReplayedCase:
    """One real case's grid, as the simulated clock's workload: each recipe's measured curve
    (progress: the metric over the target, or the target over a loss; 1 at the run's reach)."""

    def __init__(self, case: dict[str, Any], max_time_s: float) -> None:
        grid = case["grid"]
        self.names: list[str] = list(grid["medians"])
        self.runs = dict(zip(self.names, grid["runs"], strict=True))
        self.times = {n: math.inf if t is None else t for n, t in grid["medians"].items()}
        self.best = min(self.times.values())
        self.target = raybatch.Target.parse(str(case["target"]))
        self.max_time_s = max_time_s

    def held_before_training(self) -> float:
        return 0.0  # the rule's share of the cost only

    def eval_cost(self) -> float:
        return 0.0

    def step_time(self, micro: int, accumulation: int) -> float:
        return 0.0  # no warmup flagged (the grid's reports predate the flag)

    def _progress(self, value: float) -> float:
        if self.target.mode == "max":
            return value / self.target.value
        return self.target.value / max(value, 1e-12)

    def run(self, micro: int, accumulation: int, multiplier: float, rng: random.Random,
            cap_s: float | None = None, stop: Any = None, rung_marks: Any = (),
            level: float | None = None) -> dict[str, Any]:  # fmt: skip
        # A recorded curve has the evaluations it had: ``rung_marks`` (the rungs the searcher
        # names) cannot add one, so a rung judges it at its first recorded evaluation past it.
        measured = self.runs[name_of(micro, multiplier)]
        curve = measured["curve"]
        reached = measured["status"] == "reached"
        last = len(curve) - 1
        marks = [(float(t), 1.0 if reached and i == last else min(self._progress(v), 0.999))
                 for i, (t, v) in enumerate(curve)]  # fmt: skip
        met = [i for i, (_, p) in enumerate(marks) if level is not None and p >= level]
        if met:  # a confirmation run to its meeting level: its first evaluation there
            t = marks[met[0]][0]
            return {"status": "reached", "time": t, "cost": t, "train": t,
                    "marks": marks[: met[0] + 1]}  # fmt: skip
        if reached:
            t = marks[-1][0]
            return {"status": "reached", "time": t, "cost": t, "train": t, "marks": marks}
        end = max(self.max_time_s, marks[-1][0] if marks else 0.0)  # the cap read at a step
        return {"status": "censored", "time": None, "cost": end, "train": end, "marks": marks}


def name_of(micro: int, multiplier: float) -> str:
    return f"{micro}@{multiplier:g}"


def _opening(case: dict[str, Any]) -> list[str]:
    """The plan's opening on this case's grid: the largest batch the search swept, at the
    sweep's LRs, and the reference recipe (accumulation 1, as the grid has it)."""
    space = raybatch.load_space(case["space"])
    recipes = case["recipes"]
    baseline = {keys.MICRO_BATCH_SIZE: recipes["max_batch"]["micro_batch_size"],
                keys.ACCUMULATION_STEPS: 1, keys.LR_MULTIPLIER: 1.0}  # fmt: skip
    reference = {keys.MICRO_BATCH_SIZE: recipes["reference"]["micro_batch_size"],
                 keys.ACCUMULATION_STEPS: 1, keys.LR_MULTIPLIER: 1.0}  # fmt: skip
    points = opening_points(space, baseline, reference)
    return [name_of(int(p[keys.MICRO_BATCH_SIZE]), float(p.get(keys.LR_MULTIPLIER, 1.0)))
            for p in points]  # fmt: skip


def replay(case: ReplayedCase, order: list[str], rule: dict[str, Any], seed: int
           ) -> dict[str, Any]:  # fmt: skip
    """One search of ``order``'s recipes under ``rule``, on the simulated clock."""
    recipes = iter(order)

    def suggest(_trial_id: str) -> tuple[int, int, float] | None:
        name = next(recipes, None)
        if name is None:
            return None
        micro, multiplier = name.split("@")
        return int(micro), 1, float(multiplier)

    capping = _Observed(rule["zone"], case.max_time_s, hedge=rule["hedge"], pause=rule["pause"],
                        eta=rule["eta"])  # fmt: skip
    trials = se.simulate_search(case, random.Random(seed), len(order), suggest,  # type: ignore[arg-type]
                                lambda _t, _r: None, capping, SLOTS)  # fmt: skip
    reached = [(t["time"], name_of(t["knobs"][0], t["knobs"][2]))
               for t in trials if t["status"] == "reached"]  # fmt: skip
    drawn = min(order, key=lambda n: case.times[n])
    picked = min(reached)[1] if reached else None
    return {
        "cost_trainings": sum(t["train"] for t in trials) / case.best,
        "before_reach_trainings": sum(capping.before_reach.values()) / case.best,
        "regret": case.times[picked] / case.times[drawn] if picked else math.inf,
        "fastest_drawn_stopped": all(n != drawn for _, n in reached),
    }


def main(draws: int = 40, real: Path = REAL, out: Path = RESULTS) -> dict[str, Any]:
    at = measured_at()
    source = json.loads(real.read_text())
    cases: dict[str, Any] = {}
    for name, data in source["workloads"].items():
        case = ReplayedCase(data, float(source["max_time_s"]))
        opening = [n for n in _opening(data) if n in case.runs]
        rest = [n for n in case.names if n not in opening]
        orders = [opening + random.Random(d).sample(rest, TRIALS - len(opening))
                  for d in range(draws)]  # fmt: skip
        cases[name] = {}
        for rule_name, rule in RULES.items():
            runs = [replay(case, order, rule, d) for d, order in enumerate(orders)]
            regrets = [r["regret"] for r in runs]
            cases[name][rule_name] = {
                "median_cost_trainings": statistics.median(r["cost_trainings"] for r in runs),
                "median_before_reach_trainings": statistics.median(
                    r["before_reach_trainings"] for r in runs
                ),
                "median_regret": statistics.median(regrets),
                "p90_regret": se._p90(regrets),
                "fastest_drawn_stopped": sum(r["fastest_drawn_stopped"] for r in runs) / draws,
            }
            row = cases[name][rule_name]
            print(f"{name:18} {rule_name:20} cost {row['median_cost_trainings']:5.2f}"
                  f" (before a reach {row['median_before_reach_trainings']:5.2f})"
                  f" regret {row['median_regret']:.2f} p90 {row['p90_regret']:.2f}"
                  f" fastest stopped {row['fastest_drawn_stopped']:.0%}", flush=True)  # fmt: skip
    data = {
        "benchmark": "rung_replay",
        "source": {
            "file": "bench/results/real_training.json",
            "measured_at": source.get("measured_at"),
        },
        "settings": {
            "draws": draws,
            "trials": TRIALS,
            "slots": SLOTS,
            "slack": se.SLACK,
            "rules": RULES,
        },
        "cases": cases,
    }
    write_result(out, data, at)
    return data


if __name__ == "__main__":
    main()
