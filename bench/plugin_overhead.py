"""Wall-clock overhead of the plugin: plain ``tune.Tuner`` vs raybatch's searcher + scheduler.

The same trivial trainable (it reports once and ends) runs the same number of trials (30 by
default, ``trials`` in the result) through:

- ``plain``: ``tune.Tuner`` with Ray Tune's random search over the coupled space's
  ``param_space`` and the default FIFO scheduler;
- ``raybatch``: ``tune.Tuner`` with :class:`RaybatchSearcher` (Optuna TPE in SQLite, memory
  pre-screen on) and :class:`CappingScheduler`, the trainable reporting through
  :class:`raybatch.trial.reporting.TrialReporter`.

Runs alternate on one local Ray (plain first in even repeats, raybatch first in odd ones), so
drift on a shared machine hits both; a repeat is a pair, and the figure is the median over five
or more pairs of raybatch / plain, with a 95% bootstrap interval over pairs so that one noisy
run cannot decide it (target <= 1.10).

raybatch sets ``max_concurrent_trials`` to the trials the cluster can run at once
(:func:`raybatch.cluster.hardware.trials_in_flight`), as ``raybatch.search`` does: without a
limit, Ray Tune keeps a single trial pending at a time for any custom searcher (its own random
search gets 200), so trials start one by one — measured here, that alone was most of the
overhead.

Run: .venv/bin/python bench/plugin_overhead.py  (writes bench/results/plugin_overhead.json)
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from provenance import measured_at, write_result
from ray import tune
from stats import paired_ratio

import raybatch
from raybatch.cluster.hardware import trials_in_flight
from raybatch.examples.digits import DigitsWorkload
from raybatch.memory.estimator import MemoryEstimator
from raybatch.space.tune_space import tune_param_space
from raybatch.trial.reporting import TrialReporter
from raybatch.tuning.gates import search_gates
from raybatch.tuning.scheduler import CappingScheduler
from raybatch.tuning.searcher import RaybatchSearcher
from raybatch.tuning.study import SearchStudy

RESULTS = Path(__file__).parent / "results" / "plugin_overhead.json"
SPACE = raybatch.load_space("digits_cnn_sgd")


def trivial(config: dict[str, Any]) -> None:
    tune.report({"objective": float(config["micro_batch_size"]), "status": "reached"})


def through_reporter(config: dict[str, Any]) -> None:
    with TrialReporter(0.5, eval_every_samples=1, max_time_s=60) as run:
        run.add(samples=config["micro_batch_size"], steps=1, loss=1.0)
        run.report(1.0)


def run_plain(trials: int, storage: str) -> float:
    start = time.perf_counter()
    tune.Tuner(
        trivial,
        param_space=tune_param_space(SPACE),
        tune_config=tune.TuneConfig(num_samples=trials, metric="objective", mode="min"),
        run_config=tune.RunConfig(storage_path=storage, verbose=0),
    ).fit()
    return time.perf_counter() - start


def run_raybatch(trials: int, storage: str, estimator: MemoryEstimator) -> float:
    start = time.perf_counter()
    study = SearchStudy(f"sqlite:///{storage}/optuna.db", "overhead")
    gates = search_gates(estimator, 2**30)
    searcher = RaybatchSearcher(SPACE, penalty=600.0, study=study, gates=gates)
    tune.Tuner(
        through_reporter,
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            scheduler=CappingScheduler(),
            num_samples=trials,
            # As raybatch.search sets it (one CPU per trial, as Tune gives this trainable).
            max_concurrent_trials=trials_in_flight(ray.cluster_resources(), 0, 1.0),
        ),
        run_config=tune.RunConfig(storage_path=storage, verbose=0),
    ).fit()
    return time.perf_counter() - start


TARGET_RATIO = 1.10


def main(trials: int = 30, repeats: int = 5, out: Path = RESULTS) -> dict[str, Any]:
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    estimator = MemoryEstimator(DigitsWorkload(), SPACE.reference_config(), anchors=(16, 256))
    estimator.model_for()  # trace once up front, as a search does before its first trial
    at = measured_at()
    times: dict[str, list[float]] = {"plain": [], "raybatch": []}
    for repeat in range(repeats):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            for which in ("plain", "raybatch") if repeat % 2 == 0 else ("raybatch", "plain"):
                times[which].append(
                    run_plain(trials, a) if which == "plain" else run_raybatch(trials, b, estimator)
                )
    if started_here:
        ray.shutdown()
    plain, ours = statistics.median(times["plain"]), statistics.median(times["raybatch"])
    paired = paired_ratio(list(zip(times["raybatch"], times["plain"], strict=True)))
    data = {
        "benchmark": "plugin_overhead",
        "trials": trials,
        "repeats": repeats,
        "plain_s": times["plain"],
        "raybatch_s": times["raybatch"],
        "plain_median_s": plain,
        "raybatch_median_s": ours,
        "ratio": paired["ratio"],
        "ratio_ci95": paired["ratio_ci95"],
        "target_ratio": TARGET_RATIO,
        "target_met": paired["ratio"] <= TARGET_RATIO,
    }
    write_result(out, data, at)
    print(
        f"{trials} trials: plain {plain:.1f} s, raybatch {ours:.1f} s, ratio {paired['ratio']:.2f}"
    )
    return data


if __name__ == "__main__":
    main()
