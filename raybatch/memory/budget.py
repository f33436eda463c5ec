"""How much GPU memory a trial may use: NVML readings, or an explicit budget.

On a machine with an NVIDIA driver the budget comes from NVML (``pynvml``, shipped by the
``nvidia-ml-py`` distribution):

    budget = headroom x free - CUDA_CONTEXT_OVERHEAD_BYTES

``headroom`` (default 0.9) keeps the 10-20% margin the batch-size guides advise ("use 80-90% of
memory", seed 001/003): the caching allocator's fragmentation and kernel workspaces need it,
and a batch found at the very edge OOMs later in ``fit()``. The context overhead is subtracted
because the budget is computed before the trial's process creates its CUDA context, which
takes memory outside PyTorch's allocator.

Without a driver (CI, laptops) NVML fails to load; that is caught and the budget must be given
explicitly (``memory_budget="2GiB"``), which is then used as is.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from raybatch.errors import BudgetUnavailableError, Issue, OptionError

DEFAULT_HEADROOM = 0.9

CUDA_CONTEXT_OVERHEAD_BYTES = 512 * 2**20
"""Memory a new process's CUDA context takes outside PyTorch's allocator, where it is not
measured.

A search measures it on its GPU model at start (:mod:`raybatch.run.context`) and uses that;
this figure, the upper end of what recent drivers take for the context and PyTorch's loaded
kernel modules, is the fallback (no GPU alive yet, NVML silent) and the default of the helpers
called outside a search.
"""

_UNITS_TEXT = "units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"


def parse_size(
    value: str | int | float, field: str = "memory_budget", source: str = "<python>"
) -> int:
    """Bytes from ``"2GiB"``, ``"1500MB"``, ``"512 MiB"``, ``"1e9"`` or a number of bytes.

    Sizes with a unit are read by ``pydantic.ByteSize`` (binary units KiB..TiB are powers of
    1024, decimal ones KB..TB powers of 1000, as in the IEC/SI standards and as
    ``nvidia-smi`` reports MiB); a bare number, scientific notation included, is bytes.

    Raises:
        OptionError: Not a size, an unknown unit, zero or negative.
    """
    from pydantic import ByteSize, TypeAdapter, ValidationError

    allowed = f"a positive size such as 2GiB, 1500MB or 1073741824 ({_UNITS_TEXT})"

    def refuse(message: str) -> OptionError:
        return OptionError([Issue(field, message)], source)

    if isinstance(value, bool):
        raise refuse(f"must be {allowed}, got {value!r}")
    number: float | int | None = value if isinstance(value, int | float) else _number(value)
    if number is not None:
        if not math.isfinite(number):
            raise refuse(f"must be {allowed}, got {value!r}")
        size = int(number)
    else:
        try:
            size = int(TypeAdapter(ByteSize).validate_python(str(value).strip()))
        except ValidationError as exc:
            if exc.errors()[0]["type"] == "byte_size_unit":
                unit = str(value).strip().lstrip("0123456789. ")
                raise refuse(f"unknown unit {unit!r} in {value!r}; must be {allowed}") from None
            raise refuse(f"must be {allowed}, got {value!r}") from None
    if size <= 0:
        raise refuse(f"must be {allowed}, got {value!r}")
    return size


def _number(text: str) -> float | None:
    """A bare number of bytes written as text (``"1073741824"``, ``"1e9"``), else None."""
    try:
        return float(text)
    except ValueError:
        return None


def format_bytes(n: int | float) -> str:
    """Binary human units: ``1.50 GiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} TiB"


@dataclass(frozen=True)
class DeviceMemory:
    """One GPU's memory as NVML reports it, in bytes."""

    name: str
    total_bytes: int
    free_bytes: int
    used_bytes: int
    used_by_other_processes_bytes: int | None
    """``None`` where NVML may not list processes (containers, MIG)."""


def nvml() -> Any:
    """The initialised ``pynvml`` module, or ``None`` when NVML cannot be used here."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError):
        return None
    return pynvml


def visible_devices(visible: str | None = None) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs, in CUDA's order; default:
    this process's), or ``None`` when it is unset (every GPU is visible).

    Set but blank, it hides every GPU, as CUDA reads it: an empty list, not "all". Ray sets it
    so for a task that holds no GPU under ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1``.
    """
    text = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if text is None:
        return None
    return [e.strip() for e in text.split(",") if e.strip()]


def physical_handle(pynvml: Any, cuda_index: int, visible: str | None = None) -> Any:
    """NVML handle of CUDA device ``cuda_index`` of this process (or of a process whose
    ``CUDA_VISIBLE_DEVICES`` is ``visible``).

    NVML numbers physical GPUs; CUDA numbers the ones in ``CUDA_VISIBLE_DEVICES`` (which Ray
    sets per trial). The visible list may name indices or UUIDs.
    """
    entries = visible_devices(visible)
    if entries is None:
        return pynvml.nvmlDeviceGetHandleByIndex(cuda_index)
    entry = entries[cuda_index]
    if entry.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(entry))
    return pynvml.nvmlDeviceGetHandleByUUID(entry)


def _device_memory(pynvml: Any, handle: Any) -> DeviceMemory:
    """One GPU's memory; the process listing may fail on its own (MIG, containers)."""
    info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    name = pynvml.nvmlDeviceGetName(handle)
    # Listing processes needs permissions the memory read does not (NoPermission in many
    # containers, NotSupported under MIG): without it the other processes' use is unknown,
    # not zero, and the budget (read from free memory) is still right.
    others: int | None = 0
    try:
        own = os.getpid()
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid != own and proc.usedGpuMemory is not None:
                others = (others or 0) + int(proc.usedGpuMemory)
    except pynvml.NVMLError:
        others = None
    return DeviceMemory(
        name=name.decode() if isinstance(name, bytes) else str(name),
        total_bytes=int(info.total),
        free_bytes=int(info.free),
        used_bytes=int(info.used),
        used_by_other_processes_bytes=others,
    )


def read_device_memory(cuda_index: int = 0) -> DeviceMemory | None:
    """NVML's view of a GPU, or ``None`` without a usable NVIDIA driver (never raises for that)."""
    pynvml = nvml()
    if pynvml is None:
        return None
    try:
        return _device_memory(pynvml, physical_handle(pynvml, cuda_index))
    except (pynvml.NVMLError, IndexError):
        return None
    finally:
        pynvml.nvmlShutdown()


def read_all_devices(visible: str | None = None) -> list[DeviceMemory] | None:
    """The GPUs this process's CUDA numbers (or a process's whose ``CUDA_VISIBLE_DEVICES`` is
    ``visible``), in CUDA's order: those ``CUDA_VISIBLE_DEVICES`` names (indices or UUIDs,
    matched to NVML's physical GPUs), or every GPU when it is unset. A node started with
    ``CUDA_VISIBLE_DEVICES`` gives Ray only those GPUs, and a busy GPU outside them must not
    shrink the budget. ``None`` without a usable NVIDIA driver."""
    pynvml = nvml()
    if pynvml is None:
        return None
    try:
        entries = visible_devices(visible)
        count = len(entries) if entries is not None else pynvml.nvmlDeviceGetCount()
        return [_device_memory(pynvml, physical_handle(pynvml, i, visible)) for i in range(count)]
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


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
