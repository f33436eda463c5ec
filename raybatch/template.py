"""``raybatch init-workload``: a workload file (and its space) to start from, that runs as written.

The workloads guide (``docs/workloads.md``) shows these same two files; a test keeps them equal
and runs the template for real.
"""

from __future__ import annotations

from pathlib import Path

from raybatch.errors import Issue, OptionError

WORKLOAD_TEMPLATE = '''\
"""My workload for raybatch: the model, the data, the loss and the metrics.

raybatch supplies everything that depends on the batch recipe (batch size, accumulation,
learning rate, weight decay, warmup); this file supplies the rest. Replace the model and the
data with yours. Search with:

    raybatch search {file}:workload --space {space} --target "accuracy>=0.9"
"""

from __future__ import annotations

from functools import cache

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import raybatch


@cache
def make_data(split: str) -> TensorDataset:
    """Generated data (replace with yours): 4 classes of Gaussian clusters in 20 dimensions.

    Cached: every trial asks for the data again, and a worker runs several trials.
    """
    centres = torch.randn(8, 20, generator=torch.Generator().manual_seed(0)) * 0.9
    size, seed = (8192, 1) if split == "train" else (2048, 2)
    generator = torch.Generator().manual_seed(seed)
    cluster = torch.randint(0, 8, (size,), generator=generator)
    inputs = centres[cluster] + torch.randn(size, 20, generator=generator)
    return TensorDataset(inputs, cluster % 4)


class MyWorkload(raybatch.Workload):
    name = "my_workload"  # shown in reports and in the exported best config
    amp_dtype = None  # "bf16" or "fp16" if you train with autocast on a GPU
    # What evaluate() returns, first the metric a bare --target means. Each says which way is
    # better and its range, so an impossible target is refused before any trial runs.
    metrics = (
        raybatch.Metric("accuracy", "max", low=0.0, high=1.0),
        raybatch.Metric("loss", "min", low=0.0),
    )

    def build_model(self) -> nn.Module:
        """A fresh model on the CPU, once per trial (raybatch moves it to the device)."""
        return nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 4))

    def train_dataset(self) -> Dataset:
        return make_data("train")

    def val_dataset(self) -> Dataset:
        return make_data("val")

    # Optional: the defaults below fit a classifier whose dataset yields (input, label).
    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        inputs, labels = batch
        return nn.functional.cross_entropy(model(inputs), labels)

    def evaluate(self, model: nn.Module, batches) -> dict[str, float]:
        correct, total, loss_sum = 0, 0, 0.0
        with torch.no_grad():
            for inputs, labels in batches:
                logits = model(inputs)
                loss_sum += float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
                correct += int((logits.argmax(dim=1) == labels).sum())
                total += len(labels)
        return {{"accuracy": correct / total, "loss": loss_sum / total}}


workload = MyWorkload()
'''

SPACE_TEMPLATE = """\
# The batch recipes raybatch searches for {file}. The reference is a recipe known to train
# well at one batch size; the rules carry it to every other effective batch.
name: {name}
description: MLP on generated clusters, AdamW; sqrt rules for adaptive optimizers
reference:
  batch_size: 64            # the batch the values below were tuned at
  lr: 0.002
  weight_decay: 0.01
  optimizer: adamw
rules:
  lr: sqrt                  # Adam-family: lr grows with sqrt(batch) (Malladi et al. 2022)
  weight_decay: sqrt
search:
  micro_batch_size: [16, 32, 64, 128, 256, 512]
  accumulation_steps: [1, 2, 4]
  lr_multiplier: {{low: 0.25, high: 8.0}}   # the rule is the centre, not a cage: search wide
warmup:
  samples_per_scale: 2048   # warm up over this many samples per unit of LR scale
"""


def render(workload_path: Path) -> tuple[str, Path, str]:
    """The workload file's text, the space file's path and its text."""
    space_path = workload_path.with_name(f"{workload_path.stem}_space.yaml")
    workload_text = WORKLOAD_TEMPLATE.format(file=workload_path.name, space=space_path.name)
    space_text = SPACE_TEMPLATE.format(file=workload_path.name, name=workload_path.stem)
    return workload_text, space_path, space_text


def write_template(workload_path: str | Path) -> tuple[Path, Path]:
    """Write a workload file and its space file beside it; never overwrite either.

    Raises:
        OptionError: A file of that name exists, or the folder cannot be written.
    """
    path = Path(workload_path)
    if path.suffix != ".py":
        path = path.with_suffix(".py")
    workload_text, space_path, space_text = render(path)
    for target in (path, space_path):
        if target.exists():
            raise OptionError([Issue("(file)", "exists; choose another name")], str(target))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(workload_text)
        space_path.write_text(space_text)
    except OSError as exc:
        raise OptionError(
            [Issue("(file)", f"cannot write: {exc.strerror or exc}")], str(path)
        ) from None
    return path, space_path
