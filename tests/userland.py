"""A user's own workload, written into a folder outside the repository, as a user would.

The workload file defines its own ``Workload`` subclass, its own model and its own generated
data, and imports a sibling module (``blobs_data.py``) from its folder: nothing of it is
importable by name from a Ray worker, so it only runs if raybatch ships the code.
"""

from __future__ import annotations

from pathlib import Path

HELPER = '''
"""Generated data: four Gaussian blobs in 16 dimensions."""
import torch
from torch.utils.data import TensorDataset


def blobs(n: int, seed: int) -> TensorDataset:
    centres = torch.randn(4, 16, generator=torch.Generator().manual_seed(7)) * 1.5
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    points = centres[labels] + torch.randn(n, 16, generator=g)
    return TensorDataset(points, labels)
'''

WORKLOAD = '''
"""A user's workload: its own class, model and data, and a sibling helper module."""
import os

import torch
from torch import nn

import raybatch
from blobs_data import blobs

FAIL = {fail!r}


class BlobsWorkload(raybatch.Workload):
    name = "blobs"
    space = "generic_adamw"

    def build_model(self) -> nn.Module:
        if FAIL == "build_model":
            raise RuntimeError("weights file blobs.pt not found")
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def train_dataset(self):
        return blobs(2048, 0)

    def val_dataset(self):
        return blobs(512, 1)


    def __reduce__(self):
        if FAIL == "unpickle":  # as a package installed on the driver only would
            return (_rebuild_elsewhere, (os.getpid(),))
        return super().__reduce__()


def _rebuild_elsewhere(driver_pid: int) -> "BlobsWorkload":
    if os.getpid() != driver_pid:
        import blobs_private_dependency  # noqa: F401  (not installed on the workers)
    return BlobsWorkload()


workload = BlobsWorkload()
'''

SPACE = """\
name: blobs_adamw
description: AdamW on the blobs MLP; sqrt rules (Malladi et al. 2022)
reference: {batch_size: 64, lr: 0.003, weight_decay: 0.01, optimizer: adamw}
rules: {lr: sqrt, weight_decay: sqrt}
search:
  micro_batch_size: [16, 32, 64, 128]
  accumulation_steps: [1, 2]
"""


def write_user_workload(folder: Path, fail: str | None = None) -> Path:
    """Write ``my_workload.py``, its sibling ``blobs_data.py`` and ``space.yaml``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "blobs_data.py").write_text(HELPER)
    (folder / "my_workload.py").write_text(WORKLOAD.format(fail=fail))
    (folder / "space.yaml").write_text(SPACE)
    return folder / "my_workload.py"
