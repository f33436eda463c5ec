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

FLASH_HEAD_ALIGNMENT = 8
"""SDPA pads q, k and v to a multiple of this many head dims before flash (``pad_last_dim``)."""

BIAS_ALIGNMENT = 8
"""SDPA pads a memory-efficient kernel's mask whose strides are not multiples of this
(``preprocess_mask``): a copy of the mask as given, before it is expanded."""

_PATCH = threading.RLock()
"""One trace at a time replaces the functions, so a second never restores the first's."""


def _heads_fit(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, gqa: bool) -> bool:
    """PyTorch's ``check_batch_size_and_num_heads_dense``: equal heads, or with ``gqa`` (the
    call's ``enable_gqa``, and a kernel that takes it) query heads a multiple of the keys'."""
    if not query.shape[0] == key.shape[0] == value.shape[0]:
        return False
    q, k, v = query.shape[1], key.shape[1], value.shape[1]
    return q == k == v or (gqa and k == v and q % k == 0)


def cuda_backend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> str:
    """``"flash"``, ``"efficient"`` or ``"math"``: the attention kernel CUDA runs these on
    (sm80 and newer; on sm86/89 flash also refuses training at head dims over 192)."""
    import torch

    dense = all(t.dim() == 4 and t.stride(-1) == 1 for t in (query, key, value))
    if not dense or not query.dtype == key.dtype == value.dtype:
        return "math"
    d_qk, d_v = query.shape[-1], value.shape[-1]
    half = query.dtype in (torch.float16, torch.bfloat16)
    square = query.shape[-2] == key.shape[-2]
    if (
        half
        and attn_mask is None
        and (square or not is_causal)
        and d_qk == key.shape[-1] == d_v <= FLASH_MAX_HEAD_DIM
        and _heads_fit(query, key, value, enable_gqa)
    ):
        return "flash"
    align = 8 if half else 4
    aligned = d_qk == key.shape[-1] and d_qk % align == 0 and d_v % align == 0
    if (half or query.dtype == torch.float32) and aligned and _heads_fit(query, key, value, False):
        return "efficient"  # the memory-efficient kernel takes no grouped-query heads
    return "math"


@contextmanager
def cuda_kernels(cuda: bool) -> Iterator[None]:
    """Within it, ``F.scaled_dot_product_attention`` and ``F.dropout`` run as on CUDA in this
    thread (nothing changes when the trace does not project for CUDA).

    The functions are replaced on ``torch.nn.functional`` for the trace's step, where
    ``nn.MultiheadAttention``, ``nn.Dropout``, Hugging Face's models and most others look them
    up; a ``TorchFunctionMode`` would not do, since it does not see the call made inside
    ``F.multi_head_attention_forward``. A model that bound a function to a name of its own at
    import keeps the CPU's op: over-predicted, never under. The replacements act only in the
    tracing thread (where a fake tensor's backward, and a checkpointed forward recomputed in
    it, run too); any other thread of the process calls PyTorch's own.
    """
    if not cuda:
        yield
        return
    import torch
    import torch.nn.functional as F

    owner = threading.get_ident()

    def ours() -> bool:
        # A fake (CPU) tensor's backward runs in the calling thread: a checkpointed forward
        # recomputed there is traced alike.
        return threading.get_ident() == owner

    with _PATCH:
        sdpa, dropout = F.scaled_dot_product_attention, F.dropout

        def attention(*args: Any, **kwargs: Any) -> Any:
            fused = _fused(*args, **kwargs) if ours() else None
            return sdpa(*args, **kwargs) if fused is None else fused

        def byte_mask_dropout(
            input: Any, p: float = 0.5, training: bool = True, inplace: bool = False
        ) -> Any:
            plain = not training or inplace or not 0.0 < p < 1.0
            if plain or not ours():
                return dropout(input, p, training, inplace)
            return torch.native_dropout(input, p, True)[0]

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
    import torch.nn.functional as F

    if torch.is_autocast_enabled("cpu"):
        # CUDA autocast runs scaled_dot_product_attention in its lower precision (float32
        # inputs cast; float64 is left alone, as CUDA's autocast leaves it).
        low = torch.get_autocast_dtype("cpu")
        query, key, value = (
            t.to(low) if t.dtype == torch.float32 else t for t in (query, key, value)
        )
    backend = cuda_backend(query, key, value, attn_mask, is_causal, enable_gqa)
    if backend == "math":
        return None
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    out: torch.Tensor
    try:
        with torch.autocast("cpu", enabled=False):
            if backend == "flash":
                d_v = value.shape[-1]
                pad = -query.shape[-1] % FLASH_HEAD_ALIGNMENT
                if pad:  # padded copies, which flash keeps for backward
                    query, key, value = (F.pad(t, (0, pad)) for t in (query, key, value))
                out = torch.ops.aten._scaled_dot_product_flash_attention(
                    query, key, value, dropout_p, is_causal, False, scale=scale
                )[0][..., :d_v]
            else:
                bias = _additive_bias(attn_mask, query, key)
                out = torch.ops.aten._scaled_dot_product_efficient_attention(
                    query, key, value, bias, grad, dropout_p, is_causal, scale=scale
                )[0]
    except RuntimeError:
        return None  # a shape the kernel's fake implementation refuses: trace the math path
    return out


def _additive_bias(
    mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor
) -> torch.Tensor | None:
    """The mask as SDPA hands it to the memory-efficient kernel: a boolean one made additive
    (``where``, at its own shape), padded to aligned strides where they are not (a copy of
    the mask as given, which the kernel keeps for backward), then expanded to every batch
    item, head, query and key (a view)."""
    import torch
    import torch.nn.functional as F

    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.where(mask, 0.0, torch.tensor(-math.inf, dtype=query.dtype))
    aligned = mask.stride(-1) == 1 and all(s % BIAS_ALIGNMENT == 0 for s in mask.stride()[:-1])
    if not aligned:
        keys = mask.shape[-1]
        mask = F.pad(mask, (0, BIAS_ALIGNMENT - keys % BIAS_ALIGNMENT))[..., :keys]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[-2])
