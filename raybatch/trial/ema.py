"""An exponential moving average of the weights, updated without waiting for the device.

``torch.optim.swa_utils.AveragedModel`` counts its updates in a tensor and branches on it
(``if self.n_averaged == 0``) at every update: on CUDA that reads the device back once per
optimizer step, a host synchronisation inside the timed loop that makes small, launch-bound
batches look slower than they are. Here the count is a Python int and the update is one fused
``torch._foreach_lerp_`` over all parameters (``ema += (1 - decay) x (param - ema)``, the same
arithmetic as ``get_ema_multi_avg_fn``), queued like any other kernel.

Buffers (BatchNorm's running statistics) are copied from the trained model at each update, so
the averaged model evaluates with current statistics rather than those of step 0.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


class WeightAverage:
    """The EMA copy of a model: :attr:`module` is what gets evaluated.

    Attributes:
        module: A copy of the model holding the averaged weights (no gradients).
        updates: How many optimizer steps it has averaged (a Python int: no device read).
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.module = copy.deepcopy(model)
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.decay = decay
        self.updates = 0

    def update(self, model: nn.Module) -> None:
        """Fold the model's current weights in (the first update copies them)."""
        import torch

        with torch.no_grad():
            averaged: list[torch.Tensor] = list(self.module.parameters())
            current: list[torch.Tensor] = [p.detach() for p in model.parameters()]
            if self.updates == 0:
                torch._foreach_copy_(averaged, current)
            else:
                torch._foreach_lerp_(averaged, current, 1.0 - self.decay)
            for mine, theirs in zip(self.module.buffers(), model.buffers(), strict=True):
                mine.copy_(theirs)
        self.updates += 1


__all__ = ["WeightAverage"]
