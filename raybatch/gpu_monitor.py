"""Mean GPU utilisation of a trial, sampled through NVML in a background thread.

A low utilisation at a given batch size says the GPU waits — on the input pipeline, on the
host, or on small kernels — which is what the user needs to know before blaming the batch
size (seed 001). Without NVML (no NVIDIA driver) the monitor reports ``None``.
"""

from __future__ import annotations

import threading
from typing import Any

from raybatch.budget import _nvml, _physical_handle


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
        self._pynvml = _nvml()
        if self._pynvml is None:
            return self
        try:
            handle = _physical_handle(self._pynvml, self.cuda_index)
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
