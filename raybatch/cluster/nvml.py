"""A GPU's memory as NVML reports it, read where CUDA numbers the GPUs as the process sees them.

``pynvml`` (shipped by the ``nvidia-ml-py`` distribution) is imported only when a reading is
asked for. Without a driver (CI, laptops) NVML fails to load: that is caught, and every reader
answers ``None`` (never raises for it), so the budget must then be given explicitly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


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


def physical_handle(pynvml: Any, cuda_index: int, entries: list[str] | None = None) -> Any:
    """NVML handle of CUDA device ``cuda_index`` of this process (or of a process whose
    ``CUDA_VISIBLE_DEVICES`` entries are ``entries``; default: this process's).

    NVML numbers physical GPUs; CUDA numbers the ones in ``CUDA_VISIBLE_DEVICES`` (which Ray
    sets per trial). The visible list may name indices or UUIDs.
    """
    entries = visible_devices() if entries is None else entries
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


def read_all_devices() -> list[DeviceMemory] | None:
    """The GPUs this process's CUDA numbers (:func:`read_devices` of its
    ``CUDA_VISIBLE_DEVICES``)."""
    return read_devices(visible_devices())


def read_devices(entries: list[str] | None) -> list[DeviceMemory] | None:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` entries name (indices or UUIDs, matched to NVML's
    physical GPUs), in CUDA's order; ``None``: every GPU (the variable unset). A node started
    with ``CUDA_VISIBLE_DEVICES`` gives Ray only those GPUs, and a busy GPU outside them must
    not shrink the budget. ``None`` without a usable NVIDIA driver."""
    pynvml = nvml()
    if pynvml is None:
        return None
    try:
        count = len(entries) if entries is not None else pynvml.nvmlDeviceGetCount()
        every = [str(i) for i in range(count)]  # physical indices, where nothing narrows them
        named = entries if entries is not None else every
        return [_device_memory(pynvml, physical_handle(pynvml, i, named)) for i in range(count)]
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


__all__ = [
    "DeviceMemory", "nvml", "physical_handle", "read_all_devices", "read_device_memory",
    "read_devices", "visible_devices",
]  # fmt: skip
