"""Use a raybatch search space in your own Ray Tune script (the "power user" path).

A small CNN on scikit-learn's digits (raybatch's bundled workload, used here only for its model
and data) is trained with your own loop; raybatch only supplies
the coupled search space: Optuna samples micro batch, accumulation and an LR multiplier, and
every trial's config already holds the derived lr, weight decay and warmup, so the loop never
scales anything by hand.

Run:  .venv/bin/python examples/tune_digits_with_space.py --trials 6
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import optuna
import torch
from ray import tune
from ray.tune.search.optuna import OptunaSearch
from torch import nn

import raybatch
from raybatch.examples.digits import DigitsWorkload
from raybatch.space.tune_space import optuna_space
from raybatch.trial.reporting import TrialReporter

TARGET_ACCURACY = 0.95
EVAL_EVERY_SAMPLES = 1_024  # the same sample marks for every batch size
TIME_CAP_S = 60.0  # a trial that has not reached the target by then is censored


def train_digits(config: dict[str, Any]) -> None:
    """A Ray Tune function trainable written by the user.

    The recipe (lr, weight decay, warmup, accumulation) comes from raybatch's coupled space;
    the clock, the sample marks, the target check and the final status come from
    ``TrialReporter`` (``raybatch.trial.reporting``), so this loop reports the fields
    raybatch's own loop does. A fixed grid of sample marks suits OptunaSearch, which judges
    only the final objective; under raybatch's ``CappingScheduler`` pass
    ``ReporterOptions(eval_at_s=time_marks(TIME_CAP_S))`` for its equal-time rungs.
    """
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = raybatch.TrialConfig.from_dict(config)
    workload = DigitsWorkload()
    x_tr, y_tr = workload.train_dataset().tensors  # type: ignore[attr-defined]
    x_va, y_va = workload.val_dataset().tensors  # type: ignore[attr-defined]
    model = workload.build_model()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, **cfg.optimizer_kwargs
    )
    # Linear warmup over the derived number of optimizer steps, then constant.
    warmup = max(cfg.warmup_steps, 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(0)
    micro_steps, window_loss = 0, 0.0
    # Ends the trial with a status whatever happens: reached, censored at the cap, diverged,
    # infeasible_memory on an OOM, error on a crash (reported, not raised).
    with TrialReporter(
        raybatch.Target(TARGET_ACCURACY), eval_every_samples=EVAL_EVERY_SAMPLES,
        max_time_s=TIME_CAP_S,
    ) as run:  # fmt: skip
        while not run.stopped:
            order = torch.randperm(len(x_tr), generator=generator)
            # drop_last: every micro batch has exactly micro_batch_size samples.
            for i in range(0, len(order) - cfg.micro_batch_size + 1, cfg.micro_batch_size):
                idx = order[i : i + cfg.micro_batch_size]
                loss = loss_fn(model(x_tr[idx]), y_tr[idx])
                (loss / cfg.accumulation_steps).backward()
                window_loss += loss.item()
                micro_steps += 1
                if micro_steps % cfg.accumulation_steps:
                    continue  # optimizer and scheduler step only on the accumulation boundary
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step_loss, window_loss = window_loss / cfg.accumulation_steps, 0.0
                if run.add(samples=cfg.effective_batch_size, steps=1, loss=step_loss):
                    break
                if run.eval_due:
                    with run.evaluating(), torch.no_grad():
                        accuracy = (model(x_va).argmax(1) == y_va).float().mean().item()
                    if run.report(accuracy):
                        break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--storage", default=None, help="Ray Tune storage path (default: temp).")
    args = parser.parse_args()

    space = raybatch.load_space("digits_cnn_sgd")
    searcher = OptunaSearch(
        space=optuna_space(space),
        metric="objective",  # time to target, or PAR-10 of the cap when not reached
        mode="min",
        sampler=optuna.samplers.TPESampler(seed=0, multivariate=True),
    )
    tuner = tune.Tuner(
        tune.with_resources(train_digits, {"cpu": 1}),
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=args.trials),
        run_config=tune.RunConfig(
            storage_path=args.storage or tempfile.mkdtemp(prefix="raybatch-example-"),
            name="digits",
            verbose=0,
        ),
    )
    results = tuner.fit()
    best = results.get_best_result(metric="objective", mode="min")
    statuses = sorted(r.metrics["status"] for r in results)
    print(
        f"{len(results)} trials ({', '.join(statuses)}); best: {best.metrics['status']},"
        f" {best.metrics['metric']:.3f} accuracy in {best.metrics['elapsed_s']:.2f}s with:"
    )
    print(raybatch.TrialConfig.from_dict(best.config).explain())


if __name__ == "__main__":
    main()
