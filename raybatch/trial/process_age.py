"""How long this process has lived: the start-up a trial's first run in it is charged.

Tune reuses a trial's process for the next trial of the same resources
(:data:`raybatch.run.resources.REUSE_ACTORS`), so the process's start-up (Ray starting the
worker, importing torch and the workload, unpickling the trainable) is paid once per process,
not once per trial, but it is still device time the search held: the first trial run in a
process is charged from the process's start, every later one from its own.
"""

from __future__ import annotations

import os
import time

_charged = False


def _age_s() -> float | None:
    """Seconds since this process started, from ``/proc`` (Linux); ``None`` elsewhere."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started)


def held_since() -> float:
    """When the calling trial began to hold its device, on ``time.perf_counter``'s clock: the
    process's start for the first trial it runs, now for every later one."""
    global _charged
    now = time.perf_counter()
    if _charged:
        return now
    _charged = True
    age = _age_s()
    return now if age is None else now - age


__all__ = ["held_since"]
