"""Mean GPU utilisation of a trial, sampled through NVML in a background thread.

A low utilisation at a given batch size says the GPU waits — on the input pipeline, on the
host, or on small kernels — which is what the user needs to know before blaming the batch
size (seed 001). Without NVML (no NVIDIA driver) the monitor reports ``None``.
"""

from __future__ import annotations

import threading
from typing import Any

from raybatch import keys
from raybatch.memory.budget import nvml, physical_handle


class UtilizationMonitor:
    """Samples ``nvmlDeviceGetUtilizationRates`` every ``interval_s`` until stopped."""

    def __init__(self, cuda_index: int = 0, interval_s: float = 0.1) -> None:
        self.cuda_index = cuda_index
        self.interval_s = interval_s
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pynvml: Any = None

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

    def _run(self, handle: Any) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                rates = self._pynvml.nvmlDeviceGetUtilizationRates(handle)
            except self._pynvml.NVMLError:
                return
            self._samples.append(float(rates.gpu))

    def mean(self) -> float | None:
        """Mean utilisation in percent so far, or ``None`` when nothing could be sampled."""
        samples = list(self._samples)
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
        self.device = device
        self.monitor = (
            UtilizationMonitor(device.index or 0).start() if device.type == "cuda" else None
        )

    def __call__(self) -> dict[str, Any]:
        import torch

        if self.monitor is None:
            return {}
        return {
            keys.PEAK_MEMORY_BYTES: int(torch.cuda.max_memory_allocated(self.device)),
            keys.GPU_UTILIZATION: self.monitor.mean(),
        }

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
