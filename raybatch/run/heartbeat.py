"""A line that breaks a silence outside Ray Tune's loop: what the driver is busy with.

Inside Tune's loop the progress callback says what the running trials are doing whenever
:data:`~raybatch.tuning.progress.SILENCE_S` pass without a line. Outside it the driver works on
its own: Ray's start, the workload's model built to read what a search leaves out, the memory
estimate traced for the space's largest recipes, and, at the end, the winner chosen and the
files written. On a large model each of these can take a minute, which a user reads as a hang.
:class:`Heartbeat` says ``still <what> (N s)`` after the same silence, from a thread of its own,
only while the driver says it is busy (:meth:`Heartbeat.doing`); any progress line resets it.
"""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType

from raybatch.tuning import progress
from raybatch.tuning.progress import log

_last_line = [time.monotonic()]  # when the progress logger last said something


def _note_line(record: logging.LogRecord) -> bool:
    _last_line[0] = time.monotonic()
    return True


log.addFilter(_note_line)


class Heartbeat:
    """Says ``still <what>`` when the driver has been silent for ``every_s`` seconds while it
    is busy with ``what`` (:meth:`doing`); a context manager whose exit stops it.

    Args:
        every_s: Seconds of silence before a line (default:
            :data:`~raybatch.tuning.progress.SILENCE_S`).
    """

    def __init__(self, every_s: float | None = None) -> None:
        self.every_s = progress.SILENCE_S if every_s is None else every_s
        self._what: str | None = None
        self._since = time.monotonic()
        self._lock = threading.Lock()  # a line is said whole before doing() returns
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raybatch-heartbeat", daemon=True)

    def doing(self, what: str | None) -> None:
        """The driver is busy with ``what`` from now (``None``: Tune's loop, or nothing)."""
        with self._lock:
            self._what, self._since = what, time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.every_s / 4)):
            with self._lock:
                now = time.monotonic()
                if self._what is not None and now - max(_last_line[0], self._since) >= self.every_s:
                    log.info(f"still {self._what} ({now - self._since:.0f} s so far)")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.doing(None)
        self._stop.set()
        self._thread.join()


__all__ = ["Heartbeat"]
