"""Mean GPU utilisation of a trial, sampled through NVML in a background thread.

A low utilisation at a given batch size says the GPU waits — on the input pipeline, on the
host, or on small kernels — which is what the user needs to know before blaming the batch
size (seed 001). Without NVML (no NVIDIA driver) the monitor reports ``None``.

Trials packed on one GPU share it, so the device-wide figure counts the neighbours too. The
monitor reads the trial's *own process's* SM utilisation (``nvmlDeviceGetProcessUtilization``)
where NVML gives it, and falls back to the device-wide figure where it does not (MIG, some
containers, older drivers); the report names which one it is (``gpu_utilization_scope``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from raybatch import keys
from raybatch.cluster.nvml import nvml, physical_handle
from raybatch.cluster.placement import assigned_gpu_ids


class UtilizationMonitor:
    """Samples the GPU's utilisation every ``interval_s`` until stopped: the device-wide rate
    (``nvmlDeviceGetUtilizationRates``) and this process's own SM rate
    (``nvmlDeviceGetProcessUtilization``), side by side.

    The process's figure is used (:attr:`scope` ``"process"``) once NVML has named this
    process in a sample; until then, and wherever it never does — per-process figures not
    supported (MIG, older drivers), or a container whose PIDs are not the host's — the
    device-wide figure is (``"device"``), which counts packed neighbours too.
    """

    def __init__(self, cuda_index: int = 0, interval_s: float = 0.1) -> None:
        self.cuda_index = cuda_index
        self.interval_s = interval_s
        self._device: list[float] = []
        self._process: list[float] = []
        self._seen = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pynvml: Any = None

    @property
    def scope(self) -> str | None:
        """``"process"``, ``"device"``, or ``None`` before any sample."""
        if self._seen:
            return "process"
        return "device" if self._device else None

    def start(self) -> UtilizationMonitor:
        self._pynvml = nvml()
        if self._pynvml is None:
            return self
        try:
            handle = physical_handle(self._pynvml, self.cuda_index)
        except (self._pynvml.NVMLError, IndexError):
            return self
        self._thread = threading.Thread(target=self._run, args=(handle,), daemon=True)
        self._thread.start()
        return self

    def _own_process(self, handle: Any, since_us: int) -> tuple[bool, float | None]:
        """``(new, utilisation)``: this process's SM utilisation since ``since_us`` (NVML's
        clock), 0.0 when NVML has samples of other processes only, ``None`` when it cannot
        say; ``new`` is False when NVML has no sample since then (that interval is not
        measured, which is not the same as idle)."""
        pynvml = self._pynvml
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)
        except getattr(pynvml, "NVMLError_NotFound", ()):  # no sample in the interval
            return False, None
        except pynvml.NVMLError:
            return True, None
        own = [float(x.smUtil) for x in samples if x.pid == os.getpid()]
        if own:
            self._seen = True
        return True, max(own, default=0.0)

    def _run(self, handle: Any) -> None:
        since_us = int(time.time() * 1e6)
        while not self._stop.wait(self.interval_s):
            new, own = self._own_process(handle, since_us)
            if new:  # else nothing new: ask again from the same moment next time
                since_us = int(time.time() * 1e6)
            try:
                rates = self._pynvml.nvmlDeviceGetUtilizationRates(handle)
            except self._pynvml.NVMLError:
                return
            self._device.append(float(rates.gpu))
            if not new and self._seen and float(rates.gpu) == 0.0:
                own = 0.0  # no sample because the whole GPU is idle: idle, not unmeasured
            if own is not None:
                self._process.append(own)

    def mean(self) -> float | None:
        """Mean utilisation in percent so far (in :attr:`scope`), or ``None`` when nothing
        could be sampled."""
        samples = list(self._process if self._seen else self._device)
        return sum(samples) / len(samples) if samples else None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


class DeviceFigures:
    """Peak GPU memory and mean NVML utilisation for reports (nothing on CPU).

    Owns the NVML sampling thread; :meth:`close` stops it when the trial ends.
    """

    def __init__(self, device: Any) -> None:
        import torch  # deferred: the module is imported where torch may not be (a CLI's start)

        self.device = device
        self.monitor = (
            UtilizationMonitor(device.index or 0).start() if device.type == "cuda" else None
        )
        self.gpu: dict[str, Any] = {}
        """Which GPU this is (its model, and its id as Ray assigned it, else CUDA's index): a
        trial's row says where it ran, so a cluster of mixed GPUs is read right."""
        if self.monitor is not None:
            ids = assigned_gpu_ids()
            self.gpu = {keys.GPU_NAME: str(torch.cuda.get_device_name(device)),
                        keys.GPU_ID: ids[0] if ids else str(device.index or 0)}  # fmt: skip

    def __call__(self) -> dict[str, Any]:
        import torch

        if self.monitor is None:
            return {}
        return {
            **self.gpu,
            keys.PEAK_MEMORY_BYTES: int(torch.cuda.max_memory_allocated(self.device)),
            keys.PEAK_RESERVED_BYTES: int(torch.cuda.max_memory_reserved(self.device)),
            keys.GPU_UTILIZATION: self.monitor.mean(),
            keys.GPU_UTILIZATION_SCOPE: self.monitor.scope,
        }

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
