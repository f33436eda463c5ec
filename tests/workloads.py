"""Small workloads for the memory tests, whose bytes can be counted by hand."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from raybatch.workload import Workload

D, H, C = 32, 128, 10  # MLP input, hidden and class counts


def mlp_parameter_bytes() -> int:
    return (D * H + H + H * C + C) * 4


class MLPWorkload(Workload):
    """Linear(D, H) -> ReLU -> Linear(H, C) with cross-entropy, on random data.

    Activation bytes per sample, counted by hand for fp32: the ReLU output (H floats, saved
    for backward) and the log-softmax output (C floats, saved by the NLL loss); plus the loss
    and NLL's total weight, two scalars.
    """

    name = "mlp"

    def __init__(self, amp_dtype: str | None = None, gpu_prefetch_batches: int = 0) -> None:
        self.amp_dtype = amp_dtype
        self.gpu_prefetch_batches = gpu_prefetch_batches
        generator = torch.Generator().manual_seed(0)
        self.data = TensorDataset(
            torch.randn(256, D, generator=generator),
            torch.randint(0, C, (256,), generator=generator),
        )
        self.models: list[weakref.ref[nn.Module]] = []

    def build_model(self) -> nn.Module:
        model = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, C))
        self.models.append(weakref.ref(model))
        return model

    def train_dataset(self) -> Dataset[Any]:
        return self.data

    def val_dataset(self) -> Dataset[Any]:
        return self.data


class DataDependentModel(nn.Module):
    """Branches on a tensor's value: ``FakeTensorMode`` cannot know which way to go."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(D, C)
        self.b = nn.Linear(D, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) if x.sum() > 0 else self.b(x)


class DataDependentWorkload(MLPWorkload):
    name = "data_dependent"

    def build_model(self) -> nn.Module:
        return DataDependentModel()


class OOMWorkload(MLPWorkload):
    """Raises the real ``torch.cuda.OutOfMemoryError`` from a forward hook, as CUDA would."""

    name = "oom"

    def build_model(self) -> nn.Module:
        model = super().build_model()

        def out_of_memory(*_: Any) -> None:
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.11 GiB total capacity)"
            )

        model.register_forward_hook(out_of_memory)
        return model


class DigitsOOMAtLargeBatch(Workload):
    """The digits workload, but a micro batch of 128 or more runs out of memory mid-training.

    It raises the real ``torch.cuda.OutOfMemoryError`` on the third training step, as a CUDA
    allocator would once a late, larger allocation fails.
    """

    name = "digits_oom"
    space = "digits_cnn_sgd"
    oom_from = 128

    def __init__(self) -> None:
        from raybatch.examples.digits import DigitsWorkload

        self.inner = DigitsWorkload()
        self.calls = 0

    def build_model(self) -> nn.Module:
        return self.inner.build_model()

    def train_dataset(self) -> Dataset[Any]:
        return self.inner.train_dataset()

    def val_dataset(self) -> Dataset[Any]:
        return self.inner.val_dataset()

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        self.calls += 1
        if batch[0].shape[0] >= self.oom_from and self.calls >= 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB")
        return super().loss(model, batch)


class DigitsOOMAtMaxBatch(DigitsOOMAtLargeBatch):
    """Runs out of memory mid-training only at the space's largest micro batch (256)."""

    name = "digits_oom_max"
    oom_from = 256


class BrokenModelWorkload(DigitsOOMAtLargeBatch):
    """Its model cannot even be built (the constructor raises)."""

    name = "broken_model"

    def build_model(self) -> nn.Module:
        raise RuntimeError("layer sizes do not match the checkpoint")


class NaNMetricWorkload(DigitsOOMAtLargeBatch):
    """Evaluation returns NaN (e.g. a metric divided by an empty class count)."""

    name = "nan_metric"

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        return super(DigitsOOMAtLargeBatch, self).loss(model, batch)

    def evaluate(self, model: nn.Module, batches: Any) -> float:
        return float("nan")


class SlowStepWorkload(DigitsOOMAtLargeBatch):
    """Every training step takes 0.3 s longer: it runs past any short time cap."""

    name = "slow_step"
    STEP_SLEEP_S = 0.3

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        import time

        time.sleep(self.STEP_SLEEP_S)
        return super(DigitsOOMAtLargeBatch, self).loss(model, batch)


class HangsAtMaxBatch(DigitsOOMAtLargeBatch):
    """At the largest micro batch (256), the first training step after an evaluation never
    returns: the trial has reported, then hangs mid-training.

    As a stuck NCCL collective or a deadlocked data loader does: a blocking call that no
    per-step check inside the trial can interrupt.
    """

    name = "hangs_at_max_batch"

    def __init__(self) -> None:
        super().__init__()
        self.evaluated = False

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        import time

        if batch[0].shape[0] >= 256 and self.evaluated:
            time.sleep(3600)
        return super(DigitsOOMAtLargeBatch, self).loss(model, batch)

    def evaluate(self, model: nn.Module, batches: Any) -> Any:
        self.evaluated = True
        return super().evaluate(model, batches)


class KillsItsWorkerOnce(DigitsOOMAtLargeBatch):
    """SIGKILLs its own Ray worker process mid-training, once (a marker file remembers)."""

    name = "kills_worker_once"

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        import os
        import signal
        from pathlib import Path

        self.calls += 1
        if self.calls == 5 and not Path(self.marker).exists():
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super(DigitsOOMAtLargeBatch, self).loss(model, batch)


CLOCKED_TARGET_SAMPLES = 512
CLOCKED_SECONDS = {16: 9.6, 32: 4.8, 64: 1.2, 128: 3.6, 256: 6.0}
"""Training time to target of each micro batch: the optimum is 64, neither end of the range.
Long enough that a step's share (0.15 s for 64) absorbs what a busy machine adds to it: at
half these, a fresh-clone suite once saw 64 behind 128 at a rung, its few first steps slowed
by the other worker's trials."""


class ClockedWorkload(MLPWorkload):
    """Time to target fixed by the micro batch, whatever the machine's load: each training step
    lasts its share of :data:`CLOCKED_SECONDS` (reaching :data:`CLOCKED_TARGET_SAMPLES` takes
    that long); the metric is the share of those samples seen so far.

    A step sleeps (which needs no CPU) for what is left of its share once the time since the
    last step's sleep ended (the forward, backward, optimizer step, an evaluation) is taken
    off: the work a loaded machine slows down is absorbed, not added per step, so a small
    micro batch's many steps do not make it slower than its figure (a fixed sleep per step let
    a loaded machine add tens of milliseconds a step, and 64 lost its lead over 128)."""

    name = "clocked"

    def build_model(self) -> nn.Module:
        self.samples = 0  # a fresh count per trial (an actor may be reused)
        self.last_step: float | None = None
        return super().build_model()

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        import time

        micro = len(batch[0])
        share = CLOCKED_SECONDS[micro] * micro / CLOCKED_TARGET_SAMPLES
        spent = 0.0 if self.last_step is None else time.perf_counter() - self.last_step
        time.sleep(max(0.0, share - spent))
        self.last_step = time.perf_counter()
        self.samples += micro
        return super().loss(model, batch)

    def evaluate(self, model: nn.Module, batches: Any) -> float:
        for _ in batches:
            pass
        return min(self.samples / CLOCKED_TARGET_SAMPLES, 1.0)


class NormSoftmaxBlock(nn.Module):
    """The float32-sensitive part of a transformer block: Linear -> LayerNorm -> softmax."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width, bias=False)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.norm(self.proj(x)), dim=-1)


class NormSoftmaxWorkload(MLPWorkload):
    """:class:`NormSoftmaxBlock` under autocast; the loss is the output's sum."""

    name = "norm_softmax"
    width = 128

    def build_model(self) -> nn.Module:
        return NormSoftmaxBlock(self.width)

    def example_batch(self, batch_size: int) -> Any:
        return torch.randn(batch_size, self.width)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        return model(batch).sum()


class SelfAttention(nn.Module):
    """One projection to queries, keys and values, then ``F.scaled_dot_product_attention``
    with dropout, as a transformer's attention calls it (the heads are strided views)."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout)


class AttentionWorkload(MLPWorkload):
    """:class:`SelfAttention` over random sequences; the loss is the output's sum."""

    name = "attention"
    width, heads = 64, 2

    def __init__(self, length: int = 64, dropout: float = 0.1, amp_dtype: str | None = None):
        super().__init__(amp_dtype)
        self.length, self.dropout = length, dropout

    def build_model(self) -> nn.Module:
        return SelfAttention(self.width, self.heads, self.dropout)

    def example_batch(self, batch_size: int) -> Any:
        return torch.randn(batch_size, self.length, self.width)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        return model(batch).float().sum()


class DropoutWorkload(MLPWorkload):
    """Linear -> Dropout; the loss is the output's sum."""

    name = "dropout"

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(D, H, bias=False), nn.Dropout(0.5))

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        return model(batch[0]).sum()


class CheckpointedAttentionWorkload(AttentionWorkload):
    """:class:`SelfAttention` then dropout, recomputed in backward by non-reentrant activation
    checkpointing (as Hugging Face's gradient checkpointing runs a layer)."""

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        def layer(x: torch.Tensor) -> torch.Tensor:
            return nn.functional.dropout(model(x), 0.1, True)

        out = checkpoint(layer, batch, use_reentrant=False)
        return out.float().sum()


class LearnedBias(nn.Module):
    """Attention under a learned additive bias per head (as ALiBi- or T5-style models add),
    whose last dimension is not aligned: the memory-efficient kernel takes a padded copy."""

    def __init__(self, width: int, heads: int, length: int) -> None:
        super().__init__()
        self.attention = SelfAttention(width, heads, 0.0)
        self.bias = nn.Parameter(torch.zeros(1, heads, length, length))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        heads = self.attention.heads
        qkv = self.attention.qkv(x).view(batch, length, 3, heads, width // heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)


class LearnedBiasWorkload(AttentionWorkload):
    """:class:`LearnedBias` over sequences of 60 tokens."""

    def __init__(self) -> None:
        super().__init__(length=60, dropout=0.0)

    def build_model(self) -> nn.Module:
        return LearnedBias(self.width, self.heads, self.length)
