"""The utilisation monitor's choice between the trial's own figure and the device's.

No NVIDIA driver exists on CI: the stand-in below answers as NVML does in three settings, and
the monitor's own sampling thread runs against it."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from raybatch.trial.gpu_monitor import UtilizationMonitor


class _NVMLError(Exception):
    pass


class _NotFound(_NVMLError):
    pass


class _Nvml:
    NVMLError = _NVMLError
    NVMLError_NotFound = _NotFound

    def __init__(self, process: str) -> None:
        self.process = process

    def nvmlDeviceGetProcessUtilization(self, handle: object, since: int) -> list[Any]:
        if self.process == "unsupported":
            raise _NVMLError("Not Supported")
        self.calls = getattr(self, "calls", 0) + 1
        self.idle = self.process == "idle" and self.calls % 2 == 0
        if (self.process == "sparse" and self.calls % 2) or self.idle:
            raise _NotFound("no new sample")  # NVML's sampling is slower than ours, or idle
        ours = self.process in ("own", "sparse", "idle")
        pid = os.getpid() if ours else os.getpid() + 100_000  # "container": another PID space
        return [SimpleNamespace(pid=pid, smUtil=40), SimpleNamespace(pid=1, smUtil=50)]

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Any:
        return SimpleNamespace(gpu=0 if getattr(self, "idle", False) else 90)


@pytest.mark.parametrize(
    ("process", "scope", "mean"),
    [("own", "process", 40.0), ("unsupported", "device", 90.0), ("container", "device", 90.0),
     ("sparse", "process", 40.0), ("idle", "process", 20.0)],
)  # fmt: skip
def test_the_trials_own_utilisation_is_used_only_where_nvml_names_its_process(
    process: str, scope: str, mean: float
) -> None:
    """``sparse``: NVML has no new sample at every other query; that interval is not measured
    (recorded as 0 % it would halve the mean). ``idle``: the GPU is idle at every other query,
    so NVML has no sample of anyone and the device reads 0 %: that interval is idle."""
    monitor = UtilizationMonitor(interval_s=0.01)
    monitor._pynvml = _Nvml(process)  # what start() finds where a driver exists
    monitor._thread = threading.Thread(target=monitor._run, args=(object(),), daemon=True)
    monitor._thread.start()
    time.sleep(0.15)
    monitor.stop()
    assert monitor.scope == scope
    # ``idle`` alternates 40 and 0: an odd count of samples leaves the mean a little above 20.
    assert monitor.mean() == pytest.approx(mean, abs=4)
