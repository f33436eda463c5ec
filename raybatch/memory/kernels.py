"""CUDA's kernels in the trace: attention and dropout keep less on CUDA than on the CPU.

The trace runs on the CPU, where two ops keep more for backward than CUDA's kernels do:

- ``scaled_dot_product_attention`` in training takes the math path (the CPU's fused kernel
  takes no dropout): it keeps the sequence-by-sequence scores' softmax, dropout mask and
  dropped copy. CUDA picks a fused kernel (flash, memory-efficient, cuDNN) that keeps the
  output and one float32 statistic per query row, and recomputes the rest in backward.
- ``dropout`` keeps a mask of the input's dtype on the CPU and a byte mask on CUDA.

A trace of the CPU's ops over-predicted a small transformer's GPU peak by up to 1.49x (an H100
at c21938b), and the pre-screen refused batches that fit. Under the CUDA projection both are
traced as CUDA runs them, through PyTorch's own fake-tensor kernels of the CUDA ops. The
kernel is chosen as ``sdp_utils.cpp`` does on sm80 and newer: flash for fp16/bf16 without a
mask, head dims equal and at most 256; else memory-efficient where the head dims are aligned;
else the math path, traced as it is. cuDNN's kernel, which recent PyTorch prefers on sm90 and
sm100 where it applies, keeps what flash keeps, so it is traced as flash.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

FLASH_MAX_HEAD_DIM = 256
"""Flash attention's largest head dimension (``check_head_dim_size_flash``)."""

BIAS_ALIGNMENT = 16
"""The memory-efficient kernel's mask is padded to a multiple of this many keys."""

_PATCH = threading.RLock()
"""One trace at a time replaces the functions, so a second never restores the first's."""


def cuda_backend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> str:
    """``"flash"``, ``"efficient"`` or ``"math"``: the attention kernel CUDA runs these on."""
    import torch

    dense = all(t.dim() == 4 and t.stride(-1) == 1 for t in (query, key, value))
    if not dense or not query.dtype == key.dtype == value.dtype or query.shape[0] != key.shape[0]:
        return "math"
    d_qk, d_v = query.shape[-1], value.shape[-1]
    half = query.dtype in (torch.float16, torch.bfloat16)
    square = query.shape[-2] == key.shape[-2]
    if (
        half
        and attn_mask is None
        and (square or not is_causal)
        and d_qk == key.shape[-1] == d_v <= FLASH_MAX_HEAD_DIM
    ):
        return "flash"
    align = 8 if half else 4
    aligned = d_qk == key.shape[-1] and d_qk % align == 0 and d_v % align == 0
    if (half or query.dtype == torch.float32) and aligned and query.shape[1] == key.shape[1]:
        return "efficient"  # the memory-efficient kernel takes no grouped-query heads
    return "math"


@contextmanager
def cuda_kernels(cuda: bool) -> Iterator[None]:
    """Within it, ``F.scaled_dot_product_attention`` and ``F.dropout`` run as on CUDA (nothing
    changes when the trace does not project for CUDA).

    The functions are replaced on ``torch.nn.functional`` for the trace's step, where
    ``nn.MultiheadAttention``, ``nn.Dropout``, Hugging Face's models and most others look them
    up; a ``TorchFunctionMode`` would not do, since it does not see the call made inside
    ``F.multi_head_attention_forward``. A model that bound a function to a name of its own at
    import keeps the CPU's op: over-predicted, never under.
    """
    if not cuda:
        yield
        return
    import torch
    import torch.nn.functional as F

    sdpa, dropout = F.scaled_dot_product_attention, F.dropout

    def attention(*args: Any, **kwargs: Any) -> Any:
        fused = _fused(*args, **kwargs)
        return sdpa(*args, **kwargs) if fused is None else fused

    def byte_mask_dropout(
        input: Any, p: float = 0.5, training: bool = True, inplace: bool = False
    ) -> Any:
        if not training or inplace or not 0.0 < p < 1.0:
            return dropout(input, p, training, inplace)
        return torch.native_dropout(input, p, True)[0]

    with _PATCH:
        F.scaled_dot_product_attention, F.dropout = attention, byte_mask_dropout
        try:
            yield
        finally:
            F.scaled_dot_product_attention, F.dropout = sdpa, dropout


def _fused(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor | None:
    """The fused kernel's output, or ``None`` where CUDA takes the math path too."""
    import torch

    if torch.is_autocast_enabled("cpu"):
        # CUDA autocast runs scaled_dot_product_attention in its lower precision.
        low = torch.get_autocast_dtype("cpu")
        query, key, value = (t.to(low) if t.is_floating_point() else t for t in (query, key, value))
    backend = cuda_backend(query, key, value, attn_mask, is_causal)
    if backend == "math" or (query.shape[1] != key.shape[1] and not enable_gqa):
        return None
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    out: torch.Tensor
    try:
        with torch.autocast("cpu", enabled=False):
            if backend == "flash":
                out = torch.ops.aten._scaled_dot_product_flash_attention(
                    query, key, value, dropout_p, is_causal, False, scale=scale
                )[0]
            else:
                bias = _additive_bias(attn_mask, query)
                out = torch.ops.aten._scaled_dot_product_efficient_attention(
                    query, key, value, bias, grad, dropout_p, is_causal, scale=scale
                )[0]
    except RuntimeError:
        return None  # a shape the kernel's fake implementation refuses: trace the math path
    return out


def _additive_bias(mask: torch.Tensor | None, query: torch.Tensor) -> torch.Tensor | None:
    """The mask as the memory-efficient kernel takes it: an additive bias of the query's dtype,
    expanded to every batch item and head, and where its last dimension is not a multiple of
    16, copied whole into one that is (SDPA's ``preprocess_mask``, which allocates it)."""
    import torch

    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=query.dtype).masked_fill(mask.logical_not(), -math.inf)
    *lead, keys = (query.shape[0], query.shape[1], query.shape[2], mask.shape[-1])
    bias = mask.to(query.dtype).expand(*lead, keys)
    if keys % BIAS_ALIGNMENT:
        padded = torch.empty((*lead, -(-keys // BIAS_ALIGNMENT) * BIAS_ALIGNMENT), dtype=bias.dtype)
        bias = padded[..., :keys]
    return bias
