"""A small CNN on scikit-learn's 8x8 handwritten digits: the bundled example workload.

The data ships inside scikit-learn (1,797 images), so nothing is downloaded. The split is the
one the ``digits_cnn_sgd`` preset's ``limits.dataset_size`` refers to: 80% for training
(1,437 images), 20% for validation, stratified, fixed seed.

CLI reference: ``raybatch.examples.digits:workload``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from raybatch.examples.datacache import cached_split
from raybatch.workload import Workload

TRAIN_SIZE = 1437


@cache
def _split() -> tuple[TensorDataset, TensorDataset]:
    """The split, built once per machine (:mod:`raybatch.examples.datacache`)."""
    return cached_split("digits", _build, test_size=0.2, random_state=0)


def _build(test_size: float, random_state: int) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's digits, split stratified by label."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_tr, x_va, y_tr, y_va = train_test_split(
        x, y, test_size=test_size, random_state=random_state, stratify=y
    )

    def dataset(images: Any, labels: Any) -> TensorDataset:
        pixels = torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
        return TensorDataset(pixels, torch.tensor(labels, dtype=torch.long))

    return dataset(x_tr, y_tr), dataset(x_va, y_va)


def small_cnn() -> nn.Module:
    """Two 3x3 convolutions and a linear head: about 10k parameters."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 10),
    )


class DigitsWorkload(Workload):
    """The digits classifier; the target metric is validation accuracy."""

    name = "digits_cnn"
    space = "digits_cnn_sgd"

    def build_model(self) -> nn.Module:
        return small_cnn()

    def train_dataset(self) -> Dataset[Any]:
        return _split()[0]

    def val_dataset(self) -> Dataset[Any]:
        return _split()[1]


workload = DigitsWorkload()
