"""A training script that uses the recipe a raybatch search found, retyping no number.

    .venv/bin/python examples/train_with_best_config.py runs/digits-.../   # or best_config.yaml

``raybatch.load_best`` gives the DataLoader batch size, the accumulation steps, the optimizer
(the space's family with the searched lr and weight decay) and the warmup schedule.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader

import raybatch
from raybatch.examples.digits import DigitsWorkload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("best", help="a run directory or its best_config.yaml")
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()

    best = raybatch.load_best(args.best)
    print(f"recipe from trial {best.provenance.trial_id}:")
    print(best.config.explain())

    torch.manual_seed(0)
    workload = DigitsWorkload()
    model = workload.build_model()
    loader = DataLoader(workload.train_dataset(), shuffle=True, **best.dataloader_kwargs())
    optimizer = best.build_optimizer(model.parameters())
    scheduler = best.build_scheduler(optimizer)  # stepped once per optimizer step
    accumulation = best.config.accumulation_steps

    for _ in range(args.epochs):
        model.train()
        for i, batch in enumerate(loader, start=1):
            loss = workload.loss(model, batch) / accumulation
            loss.backward()
            if i % accumulation == 0:
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
    model.eval()
    accuracy = workload.evaluate(model, DataLoader(workload.val_dataset(), batch_size=256))
    print(f"validation accuracy after {args.epochs} epochs: {accuracy:.3f}")


if __name__ == "__main__":
    main()
