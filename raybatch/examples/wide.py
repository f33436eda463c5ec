"""A wide MLP on generated data: the bundled example where the largest batch is *not* the optimum.

The data are generated, not downloaded: scikit-learn's ``make_classification`` (20,000 points,
64 features of which 24 informative and 8 redundant, 10 classes of 2 clusters each, class
separation 1.2, fixed seed), split 16,000 for training and 4,000 for validation. The model has
two hidden layers of 1,024 units (about 1.1M parameters), so one sample costs enough compute
that a CPU core is saturated from a micro batch of about 256 on (the largest batch, 1,024, is
no faster per sample), while the gradient noise scale stays near 200: past a few hundred
samples a batch buys fewer steps than it costs. ``accuracy>=0.82`` is reached within about two
epochs. A grid on this machine (``bench/real_training.py``) puts the fastest recipe at a
quarter of the largest batch, whatever the largest batch's LR.

CLI reference: ``raybatch.examples.wide:workload`` (space ``wide_mlp_adamw``).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from torch import nn
from torch.utils.data import Dataset, TensorDataset

from raybatch.examples.datacache import cached_split
from raybatch.examples.tabular import generated_split, mlp
from raybatch.workload import Workload

TRAIN_SIZE = 16_000
VAL_SIZE = 4_000
FEATURES = 64
CLASSES = 10


@cache
def _split() -> tuple[TensorDataset, TensorDataset]:
    return cached_split("make_classification", generated_split, train_size=TRAIN_SIZE,
                        val_size=VAL_SIZE, features=FEATURES, classes=CLASSES, informative=24,
                        class_sep=1.2, seed=1)  # fmt: skip


class WideWorkload(Workload):
    """The wide classifier; the target metric is validation accuracy."""

    name = "wide_mlp"
    space = "wide_mlp_adamw"

    def build_model(self) -> nn.Module:
        return mlp(1024, FEATURES, CLASSES)

    def train_dataset(self) -> Dataset[Any]:
        return _split()[0]

    def val_dataset(self) -> Dataset[Any]:
        return _split()[1]


workload = WideWorkload()
