"""Wall-clock overhead of the plugin: plain ``tune.Tuner`` vs raybatch's searcher + scheduler.

The same trivial trainable (it reports once and ends) runs 50 trials through:

- ``plain``: ``tune.Tuner`` with Ray Tune's random search over the coupled space's
  ``param_space`` and the default FIFO scheduler;
- ``raybatch``: ``tune.Tuner`` with :class:`RaybatchSearcher` (Optuna TPE in SQLite, memory
  pre-screen on) and :class:`CappingScheduler`, the trainable reporting through
  :class:`raybatch.TrialReporter`.

Runs alternate (plain, raybatch, plain, raybatch) on one local Ray, so drift on a shared
machine hits both; the figure is the ratio of median wall-clock (target <= 1.2, Ray Tune's
own bar for its overhead).

Run: .venv/bin/python bench/plugin_overhead.py  (writes bench/results/plugin_overhead.json)
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune

import raybatch
from raybatch.examples.digits import DigitsWorkload
from raybatch.memory import MemoryEstimator
from raybatch.run.scheduler import CappingScheduler
from raybatch.run.searcher import RaybatchSearcher

RESULTS = Path(__file__).parent / "results" / "plugin_overhead.json"
SPACE = raybatch.load_space("digits_cnn_sgd")


def trivial(config: dict[str, Any]) -> None:
    tune.report({"objective": float(config["micro_batch_size"]), "status": "reached"})


def through_reporter(config: dict[str, Any]) -> None:
    with raybatch.TrialReporter(0.5, eval_every_samples=1, max_time_s=60) as run:
        run.add(samples=config["micro_batch_size"], steps=1, loss=1.0)
        run.report(1.0)


def run_plain(trials: int, storage: str) -> float:
    start = time.perf_counter()
    tune.Tuner(
        trivial,
        param_space=raybatch.tune_param_space(SPACE),
        tune_config=tune.TuneConfig(num_samples=trials, metric="objective", mode="min"),
        run_config=tune.RunConfig(storage_path=storage, verbose=0),
    ).fit()
    return time.perf_counter() - start


def run_raybatch(trials: int, storage: str, estimator: MemoryEstimator) -> float:
    start = time.perf_counter()
    searcher = RaybatchSearcher(
        SPACE, storage_url=f"sqlite:///{storage}/optuna.db", study_name="overhead",
        penalty=600.0, estimator=estimator, budget_bytes=2**30,
    )  # fmt: skip
    tune.Tuner(
        through_reporter,
        tune_config=tune.TuneConfig(
            search_alg=searcher, scheduler=CappingScheduler(), num_samples=trials
        ),
        run_config=tune.RunConfig(storage_path=storage, verbose=0),
    ).fit()
    return time.perf_counter() - start


def main(trials: int = 50, repeats: int = 2, out: Path = RESULTS) -> dict[str, Any]:
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    estimator = MemoryEstimator(DigitsWorkload(), SPACE.reference_config(), anchors=(16, 256))
    estimator.model_for()  # trace once up front, as a search does before its first trial
    times: dict[str, list[float]] = {"plain": [], "raybatch": []}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            times["plain"].append(run_plain(trials, a))
            times["raybatch"].append(run_raybatch(trials, b, estimator))
    if started_here:
        ray.shutdown()
    plain, ours = statistics.median(times["plain"]), statistics.median(times["raybatch"])
    data = {
        "benchmark": "plugin_overhead",
        "trials": trials,
        "repeats": repeats,
        "plain_s": times["plain"],
        "raybatch_s": times["raybatch"],
        "plain_median_s": plain,
        "raybatch_median_s": ours,
        "ratio": ours / plain,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"{trials} trials: plain {plain:.1f} s, raybatch {ours:.1f} s, ratio {ours / plain:.2f}")
    return data


if __name__ == "__main__":
    main()
