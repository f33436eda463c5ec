"""The memory a process's CUDA context takes on its GPU, measured rather than assumed.

Every trial is a fresh Ray worker process, and its CUDA context (the driver's state and the
kernel modules PyTorch loads) takes memory outside PyTorch's allocator: the budget subtracts
one context, and packed trials each pay one. Its size depends on the GPU model, the driver and
the CUDA and PyTorch builds (a few hundred MiB, more with lazy loading off), so the search
measures it once, on the GPU model it runs on, in a process that has not touched CUDA yet
(:mod:`raybatch.cluster.gpu_budget`); :data:`~raybatch.cluster.budget.CUDA_CONTEXT_OVERHEAD_BYTES`
is only the fallback where it cannot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raybatch.cluster.nvml import read_device_memory

if TYPE_CHECKING:
    import torch


def measure_context_bytes(cuda_index: int = 0) -> int | None:
    """The memory creating a CUDA context takes on device ``cuda_index``, or ``None``.

    NVML's used memory of the device before and after this process initialises CUDA and runs
    one tiny training step of each kind a trial may run (:func:`typical_step`), so that
    cuBLAS's, cuBLASLt's and cuDNN's handles and workspaces and the kernel modules a trial
    loads are counted, less what PyTorch's allocator reserved meanwhile (a trial's own memory,
    which the estimate covers). Call it in a process that has not used CUDA yet.
    ``None`` without CUDA or NVML, or when another process on the GPU freed memory meanwhile
    (the difference is then no measurement).
    """
    import torch

    if not torch.cuda.is_available():
        return None
    before = read_device_memory(cuda_index)
    if before is None:
        return None
    device = torch.device("cuda", cuda_index)
    typical_step(device)
    torch.cuda.synchronize(device)
    after = read_device_memory(cuda_index)
    allocator = int(torch.cuda.memory_reserved(device))
    if after is None:
        return None
    context = after.used_bytes - before.used_bytes - allocator
    return context if context > 0 else None


def typical_step(device: torch.device) -> None:
    """One tiny step of every kind of work a trial's model may do, forward and backward.

    With CUDA's lazy loading (the default since CUDA 11.7) a kernel module takes memory only
    once something calls it, and the libraries' handles only once first used: a matmul alone
    loads cuBLAS, not cuDNN (convolutions), cuBLASLt (half-precision matmuls under autocast),
    the fused attention kernels, the normalisation and loss kernels or the optimizer's
    multi-tensor ones. A context measured with fewer kinds than the trial runs is undercounted,
    and packed trials then overrun their caps.
    """
    import torch
    import torch.nn.functional as F

    cuda = device.type == "cuda"
    half = torch.float16 if cuda and not torch.cuda.is_bf16_supported() else torch.bfloat16
    conv = torch.randn(8, 3, 3, 3, device=device, requires_grad=True)
    linear = torch.randn(64, 64, device=device, requires_grad=True)
    image = torch.randn(2, 3, 16, 16, device=device)
    tokens = torch.randn(2, 4, 16, 64, device=device)  # batch, heads, sequence, head size
    labels = torch.randint(0, 64, (2 * 4 * 16,), device=device)
    hidden = F.layer_norm(tokens @ linear, (64,))
    with torch.autocast(device.type, dtype=half):
        attended = F.scaled_dot_product_attention(hidden, hidden, hidden, is_causal=True)
        logits = (attended @ linear).reshape(-1, 64)
    loss = F.cross_entropy(logits.float(), labels) + F.conv2d(image, conv).relu().sum()
    loss.backward()
    optimizer = torch.optim.AdamW([conv, linear], lr=1e-3)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


__all__ = ["measure_context_bytes", "typical_step"]
