"""raybatch's own trainable in a plain Ray Tune search (no custom loop to write).

``raybatch.trainable`` turns the digits workload, its space and a target accuracy into a Tune
function trainable: each trial derives its recipe, trains with raybatch's loop, evaluates at
fixed sample marks, and ends with a status (reached, censored, diverged, infeasible_memory,
error) and an ``objective`` (time to target, or 10x the cap). ``raybatch.with_resources`` asks
Ray for the CPUs (and GPU share) each trial needs.

Run:  .venv/bin/python examples/trainable_digits.py --trials 6
"""

from __future__ import annotations

import argparse
import tempfile

import optuna
from ray import tune
from ray.tune.search.optuna import OptunaSearch

import raybatch
from raybatch.examples.digits import workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--storage", default=None, help="Ray Tune storage path (default: temp).")
    args = parser.parse_args()

    space = raybatch.load_space("digits_cnn_sgd")
    trainable = raybatch.trainable(workload, space, target=args.target, max_time_s=20)
    searcher = OptunaSearch(
        space=raybatch.optuna_space(space),
        metric="objective",
        mode="min",
        sampler=optuna.samplers.TPESampler(seed=0, multivariate=True),
    )
    tuner = tune.Tuner(
        raybatch.with_resources(trainable, workload, space, gpus_per_trial=0, cpus_per_trial=1),
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=args.trials),
        run_config=tune.RunConfig(
            storage_path=args.storage or tempfile.mkdtemp(prefix="raybatch-example-"),
            name="digits_trainable",
            verbose=0,
        ),
    )
    results = tuner.fit()
    print(f"{'micro':>5} {'accum':>5} {'eff':>5} {'lr':>8}  {'status':<17} time_to_target_s")
    for r in sorted(results, key=lambda r: r.metrics["objective"]):
        c, m = r.config, r.metrics
        ttt = m["time_to_target_s"]
        print(
            f"{c['micro_batch_size']:>5} {c['accumulation_steps']:>5}"
            f" {c['effective_batch_size']:>5} {c['lr']:>8.4f}  {m['status']:<17}"
            f" {'-' if ttt is None else f'{ttt:.2f}'}"
        )


if __name__ == "__main__":
    main()
