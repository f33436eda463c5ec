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
        if self.process == "sparse" and self.calls % 2:  # NVML's sampling is slower than ours
            raise _NotFound("no new sample")
        ours = self.process in ("own", "sparse")
        pid = os.getpid() if ours else os.getpid() + 100_000  # "container": another PID space
        return [SimpleNamespace(pid=pid, smUtil=40), SimpleNamespace(pid=1, smUtil=50)]

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Any:
        return SimpleNamespace(gpu=90)


@pytest.mark.parametrize(
    ("process", "scope", "mean"),
    [("own", "process", 40.0), ("unsupported", "device", 90.0), ("container", "device", 90.0),
     ("sparse", "process", 40.0)],
)  # fmt: skip
def test_the_trials_own_utilisation_is_used_only_where_nvml_names_its_process(
    process: str, scope: str, mean: float
) -> None:
    """``sparse``: NVML has no new sample at every other query; that interval is not measured
    (recorded as 0 % it would halve the mean)."""
    monitor = UtilizationMonitor(interval_s=0.01)
    monitor._pynvml = _Nvml(process)  # what start() finds where a driver exists
    monitor._thread = threading.Thread(target=monitor._run, args=(object(),), daemon=True)
    monitor._thread.start()
    time.sleep(0.15)
    monitor.stop()
    assert (monitor.scope, monitor.mean()) == (scope, mean)
