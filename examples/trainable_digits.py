"""raybatch as a Ray Tune plugin: your own tune.Tuner, raybatch's searcher, scheduler, trainable.

``raybatch.trainable`` turns the digits workload, its space and a target accuracy into a Tune
function trainable: each trial derives its recipe, trains with raybatch's loop, evaluates at
training-time marks (and at least once an epoch), and ends with a status (reached, censored,
capped, diverged, infeasible_memory, error) and an ``objective`` (time to target, or 10x the cap).

The rest follows from that one call:

- ``RaybatchSearcher.for_trainable`` searches the trainable's space with Optuna's TPE and tells
  Optuna the same penalty the trainable's time cap gives; with a memory budget in the settings
  it pre-screens every suggestion before it is launched. Its Optuna study lives in memory and
  in the searcher's Tune checkpoint (pass ``storage_url="sqlite:///...db"`` to keep it in a
  database instead);
- ``CappingScheduler.for_trainable`` stops trials already slower than the best time to target;
- ``raybatch.with_resources`` asks Ray for the CPUs (and GPU share) each trial needs.

This is what ``raybatch search`` composes for you, minus its run directory (``trials.csv``, the
report, confirmation runs and ``best_config.yaml``).

Run:  .venv/bin/python examples/trainable_digits.py --trials 6
"""

from __future__ import annotations

import argparse
import tempfile

from ray import tune

import raybatch
from raybatch.examples.digits import workload
from raybatch.status import TrialStatus, final_status
from raybatch.trial.settings import parts_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--storage", default=None, help="Ray Tune storage path (default: temp).")
    args = parser.parse_args()

    trainable = raybatch.trainable(
        workload, "digits_cnn_sgd", target=args.target, max_time_s=20, memory_budget="1GiB"
    )
    tuner = tune.Tuner(
        raybatch.with_resources(trainable, gpus_per_trial=0, cpus_per_trial=1),
        tune_config=tune.TuneConfig(
            search_alg=raybatch.RaybatchSearcher.for_trainable(trainable, seed=0),
            scheduler=raybatch.CappingScheduler.for_trainable(trainable),
            num_samples=args.trials,
            reuse_actors=True,  # one process per slot: torch and the data load once
        ),
        run_config=tune.RunConfig(
            storage_path=args.storage or tempfile.mkdtemp(prefix="raybatch-example-"),
            name="digits_trainable",
            verbose=0,
        ),
    )
    results = tuner.fit()
    penalty = parts_of(trainable).settings.penalty  # what the searcher told Optuna for a miss
    print(f"{'micro':>5} {'accum':>5} {'eff':>5} {'lr':>8}  {'status':<17} time_to_target_s")
    # A trial the scheduler stopped still says "running" in its last report: final_status
    # reads it as capped, as the searcher did.
    ended = [(final_status(r.metrics, r.error is not None, penalty), r.config) for r in results]
    for (status, objective), c in sorted(ended, key=lambda e: e[0][1]):
        ttt = f"{objective:.2f}" if status is TrialStatus.REACHED else "-"
        print(
            f"{c['micro_batch_size']:>5} {c['accumulation_steps']:>5}"
            f" {c['effective_batch_size']:>5} {c['lr']:>8.4f}  {status.value:<17} {ttt}"
        )


if __name__ == "__main__":
    main()
