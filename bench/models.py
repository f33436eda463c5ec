"""Workloads the memory benchmarks measure: an MLP, a ResNet-18 and a small transformer.

Self-contained (no torchvision, which has no CPU build here): ResNet-18 is He et al. 2016's
BasicBlock network at ImageNet size (224x224 inputs, 1000 classes, 11.7M parameters); the
transformer is a 4-layer, 256-wide encoder with a token-level head. Data are small random
tensors made on the spot, since only memory and time matter here.
"""

from __future__ import annotations

import abc
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from raybatch.workload import Workload


class _Synthetic(Workload):
    """A workload over a few random items (cycled by the default ``example_batch``)."""

    def __init__(self, amp_dtype: str | None = None) -> None:
        self.amp_dtype = amp_dtype
        self._data: TensorDataset | None = None

    @abc.abstractmethod
    def make_data(self) -> TensorDataset:
        """The few random items the workload cycles through."""

    def train_dataset(self) -> Dataset[Any]:
        if self._data is None:
            self._data = self.make_data()
        return self._data

    def val_dataset(self) -> Dataset[Any]:
        return self.train_dataset()

    def example_batch(self, batch_size: int) -> Any:
        # Index the stored tensors instead of collating item by item: the GPU benchmark's
        # bisection probes batches of 100k samples and more.
        data = self.train_dataset()
        assert isinstance(data, TensorDataset)
        index = torch.arange(batch_size) % len(data)
        return tuple(t[index] for t in data.tensors)


class MLP(_Synthetic):
    name = "mlp"

    def build_model(self) -> nn.Module:
        return nn.Sequential(
            nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10)
        )

    def make_data(self) -> TensorDataset:
        return TensorDataset(torch.randn(8, 1024), torch.randint(0, 10, (8,)))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.down(x))


def resnet18(num_classes: int = 1000) -> nn.Module:
    """ResNet-18 (He et al. 2016, Table 1): [2, 2, 2, 2] BasicBlocks, 64-512 channels."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [_BasicBlock(cin, cout, stride), _BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


class ResNet18(_Synthetic):
    name = "resnet18"

    def build_model(self) -> nn.Module:
        return resnet18()

    def make_data(self) -> TensorDataset:
        return TensorDataset(torch.randn(4, 3, 224, 224), torch.randint(0, 1000, (4,)))


class _Encoder(nn.Module):
    def __init__(self, vocab: int = 1000, width: int = 256, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


class SmallTransformer(_Synthetic):
    name = "transformer"
    seq_len = 128
    vocab = 1000

    def build_model(self) -> nn.Module:
        return _Encoder(self.vocab)

    def make_data(self) -> TensorDataset:
        tokens = torch.randint(0, self.vocab, (8, self.seq_len))
        return TensorDataset(tokens, torch.roll(tokens, -1, dims=1))

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        tokens, targets = batch
        logits = model(tokens)
        return F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))


WORKLOADS = {"mlp": MLP, "resnet18": ResNet18, "transformer": SmallTransformer}
