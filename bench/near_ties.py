"""Where a real search's training goes: to trials the rungs let run near the target.

Reads the committed real benchmark (``bench/results/real_training.json``: each search's twelve
trials, their curves of metric against training time) and splits each search's training
seconds by how far each trial trained against ``B``, the search's own fastest time to target:
trials that trained past ``B/eta`` (the last rung below ``B``: the rungs could not tell them
from the best by then, or they reached) and trials stopped by it. Beside them, two floors that
no rung rule can go under: the training a search would hold if every trial but its fastest had
stopped at ``B/eta`` (or at ``B/eta^2``) at the latest, whatever its curve; and the search's
other costs: the confirmation's training (with what the trials trained past their last
evaluation), and what the slots held beyond training (evaluation, start-up beyond one process
per slot, gaps), all in trainings of the fastest recipe measured (the real benchmark's unit).
Nothing is run: every figure comes from the committed results.

Run: .venv/bin/python bench/near_ties.py   (after bench/real_training.py; writes
bench/results/near_ties.json)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from provenance import measured_at, write_result

from raybatch.tuning.rungs import DEFAULT_ETA

REAL = Path(__file__).parent / "results" / "real_training.json"
RESULTS = Path(__file__).parent / "results" / "near_ties.json"


def split(search: dict[str, Any], unit_s: float, eta: float = DEFAULT_ETA) -> dict[str, Any]:
    """One search's training, in trainings of ``unit_s``, by how far each trial trained."""
    # Each trial's training up to its last evaluation (its curve's end).
    trained = [c["curve"][-1][0] if c["curve"] else 0.0 for c in search["curves"]]
    reached = [c["time_to_target_s"] for c in search["curves"] if c["time_to_target_s"]]
    best = min(reached) if reached else None
    total = sum(trained)
    if best is None:
        return {"trials": len(trained), "best_s": None, "train_trainings": total / unit_s}
    past = [t for t in trained if t > best / eta]
    fastest = [c["time_to_target_s"] for c in search["curves"]].index(best)  # its own run

    def floor(rung_s: float) -> float:
        return sum(t if i == fastest else min(t, rung_s) for i, t in enumerate(trained))

    return {
        "trials": len(trained),
        "best_s": best,
        "train_trainings": total / unit_s,
        "past_last_rung": len(past),
        "past_last_rung_trainings": sum(past) / unit_s,
        "past_last_rung_share": sum(past) / total,
        "floor_stopped_at_b_over_eta": floor(best / eta) / unit_s,
        "floor_stopped_at_b_over_eta2": floor(best / eta**2) / unit_s,
        # The training the rows count beyond the trials' curves: the confirmation's runs, and
        # each trial's training past its last evaluation (where a cap or a rung stopped it).
        "race_trainings": search["cost_trainings_train"] - total / unit_s,
        "other_trainings": search["cost_trainings_wall_warm"] - search["cost_trainings_train"],
        "cost_trainings_wall_warm": search["cost_trainings_wall_warm"],
    }


def main(real: Path = REAL, out: Path = RESULTS) -> dict[str, Any]:
    at = measured_at()
    source = json.loads(real.read_text())
    cases: dict[str, Any] = {}
    for name, case in source["workloads"].items():
        searches = [split(s, case["cost_unit_s"]) for s in case["searches"]]
        measured = [s for s in searches if s["best_s"] is not None]
        cases[name] = {
            "unit_s": case["cost_unit_s"],
            "unit_recipe": case.get("cost_unit_recipe"),
            "searches": searches,
            "median": {
                key: statistics.median(s[key] for s in measured)
                for key in ("past_last_rung", "past_last_rung_share", "train_trainings",
                            "floor_stopped_at_b_over_eta", "floor_stopped_at_b_over_eta2",
                            "race_trainings", "other_trainings", "cost_trainings_wall_warm")
            } if measured else {},
        }  # fmt: skip
        row = cases[name]["median"]
        if row:
            print(f"{name:18} past B/3: {row['past_last_rung']:4.1f} trials,"
                  f" {row['past_last_rung_share']:.0%} of {row['train_trainings']:.1f} trainings;"
                  f" floors {row['floor_stopped_at_b_over_eta']:.1f} (B/3),"
                  f" {row['floor_stopped_at_b_over_eta2']:.1f} (B/9); race"
                  f" {row['race_trainings']:.1f}; other"
                  f" {row['other_trainings']:.1f}; paid {row['cost_trainings_wall_warm']:.1f}",
                  flush=True)  # fmt: skip
    data = {
        "benchmark": "near_ties",
        "source": {
            "file": "bench/results/real_training.json",
            "measured_at": source.get("measured_at"),
        },
        "settings": {"eta": DEFAULT_ETA, "trials": source["settings"]["trials"]},
        "cases": cases,
    }
    write_result(out, data, at)
    return data


if __name__ == "__main__":
    main()
