"""How much GPU memory a trial may use: NVML readings, or an explicit budget.

On a machine with an NVIDIA driver the budget comes from NVML (:mod:`raybatch.cluster.nvml`):

    budget = headroom x free - CUDA_CONTEXT_OVERHEAD_BYTES

``headroom`` (default 0.9) keeps the 10-20% margin the batch-size guides advise ("use 80-90% of
memory", seed 001/003): the caching allocator's fragmentation and kernel workspaces need it,
and a batch found at the very edge OOMs later in ``fit()``. The context overhead is subtracted
because the budget is computed before the trial's process creates its CUDA context, which
takes memory outside PyTorch's allocator.

Without a driver (CI, laptops) NVML fails to load; that is caught and the budget must be given
explicitly (``memory_budget="2GiB"``, read by :mod:`raybatch.memory.sizes`), used as is.
"""

from __future__ import annotations

from dataclasses import dataclass

from raybatch.cluster.nvml import DeviceMemory, read_device_memory
from raybatch.errors import BudgetUnavailableError, Issue, OptionError
from raybatch.memory.sizes import format_bytes, parse_size

DEFAULT_HEADROOM = 0.9

CUDA_CONTEXT_OVERHEAD_BYTES = 512 * 2**20
"""Memory a new process's CUDA context takes outside PyTorch's allocator, where it is not
measured.

A search measures it on its GPU model at start (:mod:`raybatch.cluster.gpu_budget`) and uses that;
this figure, the upper end of what recent drivers take for the context and PyTorch's loaded
kernel modules, is the fallback (no GPU alive yet, NVML silent) and the default of the helpers
called outside a search.
"""


@dataclass(frozen=True)
class MemoryBudget:
    """The bytes a trial may use on its device, and where that number came from."""

    bytes: int
    source: str
    device: DeviceMemory | None = None


def resolve_budget(
    memory_budget: str | int | float | None = None,
    cuda_index: int | None = 0,
    headroom: float = DEFAULT_HEADROOM,
    context_overhead_bytes: int = CUDA_CONTEXT_OVERHEAD_BYTES,
) -> MemoryBudget:
    """The budget for a trial: the explicit one if given, else NVML's free memory.

    Args:
        memory_budget: An explicit budget (``"2GiB"``, bytes); used as is, no headroom.
        cuda_index: The CUDA device to read through NVML (``None``: do not try NVML).
        headroom: Fraction of the free memory to use.
        context_overhead_bytes: Subtracted for the trial's own CUDA context.

    Raises:
        OptionError: The explicit budget is not a valid size, or headroom is not in (0, 1].
        BudgetUnavailableError: No explicit budget, and NVML is unavailable (no NVIDIA driver).
    """
    if memory_budget is not None:
        return MemoryBudget(parse_size(memory_budget), "explicit")
    if not 0 < headroom <= 1:
        raise OptionError([Issue("headroom", f"must be in (0, 1], got {headroom}")])
    device = None if cuda_index is None else read_device_memory(cuda_index)
    if device is None:
        raise BudgetUnavailableError(
            "no GPU memory budget: NVML is not available here (no NVIDIA driver), so give one"
            " explicitly, e.g. --memory-budget 8GiB or memory_budget='8GiB'"
        )
    return budget_of(device, headroom, context_overhead_bytes)


def budget_of(
    device: DeviceMemory,
    headroom: float = DEFAULT_HEADROOM,
    context_overhead_bytes: int = CUDA_CONTEXT_OVERHEAD_BYTES,
    where: str = "",
) -> MemoryBudget:
    """What one trial alone may use on ``device``: ``headroom x free - one CUDA context``."""
    usable = int(headroom * device.free_bytes) - context_overhead_bytes
    return MemoryBudget(
        max(usable, 0),
        f"NVML: {headroom:g} x {format_bytes(device.free_bytes)} free on {device.name}{where}"
        f" - {format_bytes(context_overhead_bytes)} CUDA context",
        device,
    )


__all__ = [
    "CUDA_CONTEXT_OVERHEAD_BYTES", "DEFAULT_HEADROOM", "MemoryBudget", "budget_of",
    "resolve_budget",
]  # fmt: skip
