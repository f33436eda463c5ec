"""``raybatch init-workload``: a workload file (and its space) to start from, that runs as written;
``raybatch init-space``: a space read from the training code itself (:mod:`raybatch.space.infer`).

The workloads guide (``docs/workloads.md``) shows these same two files; a test keeps them equal
and runs the template for real.
"""

from __future__ import annotations

from pathlib import Path

from raybatch.errors import Issue, OptionError
from raybatch.space.infer import FoundRecipe, refuse_existing, write_space
from raybatch.workload import load_workload

_MAKE_DATA_BODY = """\
    centres = torch.randn(8, 20, generator=torch.Generator().manual_seed(0)) * 0.9
    size, seed = (8192, 1) if split == "train" else (2048, 2)
    generator = torch.Generator().manual_seed(seed)
    cluster = torch.randint(0, 8, (size,), generator=generator)
    inputs = centres[cluster] + torch.randn(size, 20, generator=generator)
    return TensorDataset(inputs, cluster % 4)\
"""
"""The body of ``make_data`` in the workload and Lightning templates (their
``{make_data_body}``): the same generated clusters in both, written once."""

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
{make_data_body}


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
        return {"accuracy": correct / total, "loss": loss_sum / total}


workload = MyWorkload()
'''

_ADAMW_RULES = """\
  weight_decay: 0.01
  optimizer: adamw
rules:
  lr: sqrt                  # Adam-family: lr grows with sqrt(batch) (Malladi et al. 2022)
  weight_decay: sqrt\
"""
"""The end of the reference and the rules in both space files (their ``{adamw_rules}``): AdamW,
with the sqrt rules of adaptive optimizers."""

SPACE_TEMPLATE = """\
# The batch recipes raybatch searches for {file}. The reference is a recipe known to train
# well at one batch size; the rules carry it to every other effective batch.
name: {name}
description: MLP on generated clusters, AdamW; sqrt rules for adaptive optimizers
reference:
  batch_size: 64            # the batch the values below were tuned at
  lr: 0.002
{adamw_rules}
search:
  micro_batch_size: [16, 32, 64, 128, 256, 512]
  accumulation_steps: [1, 2, 4]
  lr_multiplier: {low: 0.25, high: 8.0}   # the rule is the centre, not a cage: search wide
warmup:
  samples_per_scale: 2048   # warm up over this many samples per unit of LR scale
"""


LIGHTNING_TEMPLATE = '''\
"""My Lightning job for raybatch: a LightningModule and its LightningDataModule, as they are.

raybatch reads them through LightningWorkload: the datasets behind the loaders (with each
loader's collate_fn), training_step's loss, what validation_step logs, and the optimizer
configure_optimizers returns, its LR and weight decay set to each recipe's. Replace the module
and the data with yours (or import them from your code). Search with:

    raybatch search {file}:workload --space {space} --target "val_acc>=0.9"
"""

from __future__ import annotations

from functools import cache

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from raybatch.adapters.lightning import LightningWorkload


@cache
def make_data(split: str) -> TensorDataset:
    """Generated data (replace with yours): 4 classes of Gaussian clusters in 20 dimensions."""
{make_data_body}


class ClusterData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 64) -> None:
        super().__init__()
        self.batch_size = batch_size  # the search's micro batch replaces it

    def setup(self, stage: str | None = None) -> None:
        self.train, self.val = make_data("train"), make_data("val")

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, 512)


class ClusterClassifier(pl.LightningModule):
    def __init__(self, lr: float = 0.002) -> None:
        super().__init__()
        self.lr = lr  # the space's reference LR: the search scales it with the batch
        self.net = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 4))

    def training_step(self, batch, batch_idx):
        inputs, labels = batch
        return nn.functional.cross_entropy(self.net(inputs), labels)

    def validation_step(self, batch, batch_idx):
        inputs, labels = batch
        logits = self.net(inputs)
        self.log("val_loss", nn.functional.cross_entropy(logits, labels))
        self.log("val_acc", (logits.argmax(1) == labels).float().mean())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)


# The first metric is what a bare --target means.
workload = LightningWorkload(ClusterClassifier, ClusterData(), metrics=("val_acc", "val_loss"))
'''

HUGGINGFACE_TEMPLATE = '''\
"""My Hugging Face model for raybatch: what Trainer.hyperparameter_search takes (model_init,
the datasets, a data collator and compute_metrics), searched as it is.

Each recipe replaces TrainingArguments' batch size, gradient accumulation, learning rate,
weight decay and warmup; the rest is yours. Replace model_init (e.g. with
AutoModelForSequenceClassification.from_pretrained) and the datasets with your tokenized ones.
Search with:

    raybatch search {file}:workload --space {space} --target "accuracy>=0.9"
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, default_data_collator

from raybatch.adapters.huggingface import HuggingFaceWorkload


class Tokens(Dataset):
    """Generated token sequences (replace with your tokenized dataset): the label says whether
    token 3 occurs in the sequence."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(4, 32, (size, 12), generator=generator)
        self.labels = torch.randint(0, 2, (size,), generator=generator)
        where = torch.randint(0, 12, (size,), generator=generator)
        rows = self.labels.nonzero().flatten()
        self.ids[rows, where[rows]] = 3

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        mask = torch.ones_like(self.ids[i])
        return {"input_ids": self.ids[i], "attention_mask": mask, "labels": self.labels[i]}


def model_init():
    """A fresh model for every trial: a tiny BERT built from its config (nothing downloaded)."""
    config = BertConfig(
        vocab_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=16, num_labels=2,
    )
    return BertForSequenceClassification(config)


def compute_metrics(prediction) -> dict[str, float]:
    predicted = np.argmax(prediction.predictions, axis=-1)
    return {"accuracy": float((predicted == prediction.label_ids).mean())}


workload = HuggingFaceWorkload(
    model_init,
    Tokens(2048, seed=0),
    Tokens(512, seed=1),
    data_collator=default_data_collator,
    compute_metrics=compute_metrics,
    metrics=("accuracy", "loss"),  # the first is what a bare --target means
)
'''

HUGGINGFACE_SPACE = """\
# The batch recipes raybatch searches for {file}. The reference is a recipe known to train
# well at one batch size (TrainingArguments' per-device batch, learning_rate, weight_decay);
# the rules carry it to every other effective batch.
name: {name}
description: tiny BERT on generated token sequences, AdamW; sqrt rules for adaptive optimizers
reference:
  batch_size: 128
  lr: 0.001
{adamw_rules}
search:
  micro_batch_size: [16, 32, 64, 128, 256]
  accumulation_steps: [1, 2, 4]
  world_size: [1]
  lr_multiplier: {low: 0.25, high: 8.0}   # the rule is the centre, not a cage: search wide
warmup:
  samples_per_scale: 2048   # warm up over this many samples per unit of LR scale
"""

TEMPLATES: dict[str, tuple[str, str]] = {
    "workload": (WORKLOAD_TEMPLATE, SPACE_TEMPLATE),
    "lightning": (
        LIGHTNING_TEMPLATE,
        SPACE_TEMPLATE.replace(
            "search:\n",
            "search:\n  world_size: [1]            # a LightningModule searches on one device\n",
        ),
    ),
    "huggingface": (HUGGINGFACE_TEMPLATE, HUGGINGFACE_SPACE),
}
"""The starting points of ``init-workload --from``: a workload of raybatch's own, a
LightningModule with its LightningDataModule, or a Hugging Face model as the Trainer takes
it; each with its space file."""


def _fill(text: str, **values: str) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def render(workload_path: Path, kind: str = "workload") -> tuple[str, Path, str]:
    """The workload file's text, the space file's path and its text.

    Raises:
        OptionError: ``kind`` is not one of :data:`TEMPLATES`.
    """
    if kind not in TEMPLATES:
        message = f"must be one of {', '.join(TEMPLATES)}, got {kind!r}"
        raise OptionError([Issue("from", message)])
    workload_template, space_template = TEMPLATES[kind]
    space_path = workload_path.with_name(f"{workload_path.stem}_space.yaml")
    workload_text = _fill(
        workload_template,
        file=workload_path.name,
        space=space_path.name,
        make_data_body=_MAKE_DATA_BODY,
    )
    space_text = _fill(
        space_template, file=workload_path.name, name=workload_path.stem, adamw_rules=_ADAMW_RULES
    )
    return workload_text, space_path, space_text


def write_template(workload_path: str | Path, kind: str = "workload") -> tuple[Path, Path]:
    """Write a workload file of ``kind`` (:data:`TEMPLATES`) and its space file beside it;
    never overwrite either.

    Raises:
        OptionError: An unknown kind, a file of that name exists, or the folder cannot be
            written.
    """
    path = Path(workload_path)
    if path.suffix != ".py":
        path = path.with_suffix(".py")
    workload_text, space_path, space_text = render(path, kind)
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


def write_space_for(workload: str, out: str | None) -> tuple[Path, FoundRecipe]:
    """``raybatch init-space``: the space of ``workload``'s own recipe written at ``out``
    (default: ``FILE_space.yaml`` beside a workload file, ``NAME_space.yaml`` here for a
    module's); returns its path and what was found.

    Raises:
        WorkloadError: The workload cannot be loaded, is raybatch's own, or its code says no
            recipe a space can hold.
        OptionError: The file exists.
    """
    file = workload.rsplit(":", 1)[0]
    if out:
        known: Path | None = Path(out)
    elif file.endswith(".py"):
        known = Path(file).with_name(f"{Path(file).stem}_space.yaml")
    else:
        known = None  # a module's is named after its workload, known once it is loaded
    if known is not None:
        refuse_existing(known)  # in a second, not after the workload's imports (Lightning: 5 s)
    loaded = load_workload(workload)
    found = loaded.found_recipe()
    path = write_space(found, loaded.name, known or Path(f"{loaded.name}_space.yaml"))
    assert found is not None  # write_space refused a workload without one
    return path, found
