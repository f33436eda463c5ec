"""NVML of a machine with four GPUs, the third one busy: a stand-in for the NVIDIA driver only.

No driver exists on CI to answer for real; the code under test is the real reading. Shipped by
value to Ray workers (``ray.cloudpickle.register_pickle_by_value``) where a test reads NVML in
one.
"""

from __future__ import annotations

from types import SimpleNamespace


class NoPermission(Exception):
    """pynvml's NVMLError stand-in: the real one needs a driver to be raised."""


class FourGpus:
    """Indices 0-3, UUIDs ``GPU-a``..``GPU-d``; GPU 2 has 2 GiB free (a job outside Ray)."""

    NVMLError = NoPermission

    def __init__(self) -> None:
        self.uuids = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return self.uuids.index(uuid)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> object:
        free = 2 if handle == 2 else 70  # GiB
        return SimpleNamespace(total=80 * 2**30, free=free * 2**30, used=(80 - free) * 2**30)

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return f"GPU {handle}".encode()

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[object]:
        return []
