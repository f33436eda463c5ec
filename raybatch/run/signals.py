"""SIGTERM, the way Slurm and Kubernetes stop a job, taken as Ctrl-C while a search runs; and
Ctrl-C outside Ray Tune's loop ended as an interruption (:func:`interruptible`).

Ray's core worker, started in the driver by ``ray.init``, handles SIGTERM by dumping its C++
stack and aborting (exit 134): no raybatch line, no resume command, and trials left RUNNING.
Ctrl-C already ends a search cleanly (Ray Tune stops its trials, the driver records the
interruption and says how to resume), so SIGTERM is sent on as SIGINT, to the driver alone,
while the search runs (:func:`~raybatch.run.cluster.init_ray` keeps this handler through
``ray.init``); the handler that was there before is put back then (one installed outside
Python, as Ray's is, cannot be: the default, which also ends the process, takes its place).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from raybatch.errors import SearchInterrupted


def _as_interrupt(signum: int, frame: FrameType | None) -> None:
    os.kill(os.getpid(), signal.SIGINT)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM to this process is handled as Ctrl-C (see the module).

    Outside the main thread (where Python cannot set a handler) nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _as_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextmanager
def interruptible(run_dir: Path) -> Iterator[None]:
    """A search's driver: SIGTERM taken as Ctrl-C, and Ctrl-C where Ray Tune's loop is not
    there to stop gracefully (before the search's Tuner runs, or while the results are
    written) ended as an interruption, one line with the resume command, never a traceback.

    Raises:
        SearchInterrupted: Ctrl-C (or SIGTERM) outside Ray Tune's loop.
    """
    with sigterm_as_interrupt():
        try:
            yield
        except KeyboardInterrupt:
            raise SearchInterrupted(
                f"interrupted; what finished is saved: continue with `raybatch resume {run_dir}`"
            ) from None


__all__ = ["interruptible", "sigterm_as_interrupt"]
