"""A user's Lightning job, as it was before raybatch: a LightningModule and a LightningDataModule
(digits from scikit-learn, batches as dicts from the loaders' own collate_fn)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Digits(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def as_dict(items: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    xs, ys = zip(*items, strict=True)
    return {"pixels": torch.stack(xs), "label": torch.stack(ys)}


class DigitsData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str | None = None) -> None:
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x / 16.0, dtype=torch.float32)
        y = torch.tensor(y, dtype=torch.long)
        self.train, self.val = Digits(x[:1400], y[:1400]), Digits(x[1400:], y[1400:])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, self.batch_size, shuffle=True, collate_fn=as_dict)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, 256, collate_fn=as_dict)


class DigitsClassifier(pl.LightningModule):
    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = nn.functional.cross_entropy(self(batch["pixels"]), batch["label"])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        logits = self(batch["pixels"])
        self.log("val_loss", nn.functional.cross_entropy(logits, batch["label"]))
        self.log("val_acc", (logits.argmax(1) == batch["label"]).float().mean())

    def configure_optimizers(self) -> Any:
        decay = [p for n, p in self.named_parameters() if n.endswith("weight")]
        no_decay = [p for n, p in self.named_parameters() if n.endswith("bias")]
        optimizer = torch.optim.AdamW([
            {"params": decay, "weight_decay": 0.01},
            {"params": no_decay, "weight_decay": 0.0, "lr": self.lr / 10},
        ], lr=self.lr)  # fmt: skip
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, 10)
        return {"optimizer": optimizer, "lr_scheduler": schedule}
