"""The time model in a search: measured before its first trial, written into its rows after.

:mod:`raybatch.run.prior` holds the model; :mod:`raybatch.trial.gradient_noise` measures it on
a trial's device. Here the driver's two uses: :func:`measure_prior` (on one trial's resources,
with a note saying what it found and what it cost) and :func:`write_predictions` (each row's
``predicted_time_s``, and how well the model ranked the search's trials).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from raybatch import keys
from raybatch.results.rows import TrialRow
from raybatch.run.options import SearchOptions
from raybatch.run.prior import TimeModel, spearman
from raybatch.run.seeding import budget_check
from raybatch.space.search_space import SearchSpace
from raybatch.trial.gradient_noise import measure_remotely
from raybatch.trial.placement import model_resource
from raybatch.workload import Workload

PRIOR_FILE = "prior.json"
"""The time model a search measured, in its run directory: a resumed search reads it back."""
MEASURE_TIMEOUT_FLOOR_S = 30.0
"""The measurement is given up after one trial's time cap, but never sooner than this: a Ray
worker's start and torch's import alone take seconds on a busy machine."""


def measure_prior(
    workload: Workload,
    space: SearchSpace,
    estimator: Any,
    budget: int | None,
    cuda: bool,
    options: SearchOptions,
    notes: list[str],
    run_dir: Path | None = None,
) -> TimeModel | None:
    """The time model, measured on one trial's resources (``None``, and a note, if it fails:
    the plan then climbs a geometric ladder of batches instead); kept in ``run_dir`` and read
    back from there when the search resumes."""

    stored = run_dir / PRIOR_FILE if run_dir is not None else None
    if stored is not None and stored.is_file():
        model = TimeModel.from_dict(json.loads(stored.read_text()))
        notes.append(f"time model read from {PRIOR_FILE} (measured when the search started)")
        return model

    fits = budget_check(estimator, budget)
    micros = [m for m in space.search.micro_batch_size if fits(space.derive(m))]
    micros = micros or [min(space.search.micro_batch_size)]
    try:
        # In a Ray task, never in the driver: the driver of a cluster may have no GPU, and a
        # workload that crashes its process (a segfault, a kill) must not take the search down.
        resources: dict[str, Any] = {
            "num_cpus": options.cpus_per_trial, "num_gpus": 1 if cuda else 0,
        }  # fmt: skip
        if cuda and options.gpu_model:  # measured on the GPUs the trials will run on
            resources["resources"] = model_resource(options.gpu_model)
        timeout = max(options.max_time_s, MEASURE_TIMEOUT_FLOOR_S)
        started = time.perf_counter()
        model = measure_remotely(workload, space, micros, resources, timeout)
        # The task's whole wall time held the device (its start-up and data loading too), not
        # only the timed measurements inside it: that is what the search is charged.
        model = replace(model, cost_s=time.perf_counter() - started)
    except Exception as exc:  # the workload's own failure shows again in its first trial
        notes.append(f"the time model could not be measured ({type(exc).__name__}: {exc});"
                     " the plan tried a geometric ladder of batches instead")  # fmt: skip
        return None
    if stored is not None:
        stored.write_text(json.dumps(model.to_dict(), indent=2) + "\n")
    n = model.noise
    grid = [space.derive(m, a, w) for m in micros for a in space.search.accumulation_steps
            for w in space.search.world_size if fits(space.derive(m, a, w))]  # fmt: skip
    notes.append(
        f"time model measured in {model.cost_s:.1f} s (charged to the search): gradient noise"
        f" scale {n.b_simple:.0f} (80% interval {n.low:.0f}-{n.high:.0f}, batches {n.small_batch}"
        f" and {n.big_batch}); predicted best effective batch"
        f" {model.best_effective_batch(grid)}"
    )
    return model


def write_predictions(
    rows: list[TrialRow], model: TimeModel, notes: list[str]
) -> tuple[list[TrialRow], dict[str, Any]]:
    """Each row with its predicted time (the model's relative time, scaled by the one constant
    that best matches the search's measured times), and how well the model ranked them."""
    relative = [model.predicted_time(r) for r in rows]
    pairs = [
        (p, r.time_to_target_s)
        for p, r in zip(relative, rows, strict=True)
        if r.phase == keys.PHASE_SEARCH and r.reached and r.time_to_target_s is not None
    ]
    scale = statistics.median(t / p for p, t in pairs) if pairs else None
    rows = [
        replace(r, predicted_time_s=p * scale if scale is not None and math.isfinite(p) else None)
        for p, r in zip(relative, rows, strict=True)
    ]
    rho = spearman([p for p, _ in pairs], [t for _, t in pairs])
    if rho is not None:
        notes.append(f"the time model ranked the {len(pairs)} trials that reached the target"
                     f" with Spearman {rho:.2f} against their measured times")  # fmt: skip
    grid = {r.effective_batch_size: r for r in rows}
    return rows, {
        "noise_scale": model.noise.to_dict(),
        "predicted_best_effective_batch": model.best_effective_batch(list(grid.values())),
        "spearman_predicted_vs_measured": rho,
        "cost_s": model.cost_s,
    }
