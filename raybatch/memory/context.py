"""The memory a process's CUDA context takes on its GPU, measured rather than assumed.

Every trial is a fresh Ray worker process, and its CUDA context (the driver's state and the
kernel modules PyTorch loads) takes memory outside PyTorch's allocator: the budget subtracts
one context, and packed trials each pay one. Its size depends on the GPU model, the driver and
the CUDA and PyTorch builds (a few hundred MiB, more with lazy loading off), so the search
measures it once, on the GPU model it runs on, in a process that has not touched CUDA yet
(:mod:`raybatch.run.context`); :data:`~raybatch.memory.budget.CUDA_CONTEXT_OVERHEAD_BYTES`
is only the fallback where it cannot.
"""

from __future__ import annotations

from raybatch.memory.budget import read_device_memory


def measure_context_bytes(cuda_index: int = 0) -> int | None:
    """The memory creating a CUDA context takes on device ``cuda_index``, or ``None``.

    NVML's used memory of the device before and after this process initialises CUDA and runs
    one small training step's kinds of work (a matmul, a convolution forward and backward), so
    that cuBLAS's and cuDNN's handles and the kernel modules a trial loads are counted, less
    what PyTorch's allocator reserved meanwhile (a trial's own memory, which the estimate
    covers). Call it in a process that has not used CUDA yet.
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
    weight = torch.randn(8, 3, 3, 3, device=device, requires_grad=True)
    matrix = torch.randn(64, 64, device=device)
    image = torch.randn(2, 3, 16, 16, device=device)
    loss = (matrix @ matrix).sum() + torch.nn.functional.conv2d(image, weight).sum()
    loss.backward()
    torch.cuda.synchronize(device)
    after = read_device_memory(cuda_index)
    allocator = int(torch.cuda.memory_reserved(device))
    del weight, matrix, image, loss
    if after is None:
        return None
    context = after.used_bytes - before.used_bytes - allocator
    return context if context > 0 else None


__all__ = ["measure_context_bytes"]
