"""One driver per run directory: the lock ``raybatch search`` and ``resume`` hold.

Two drivers in one run directory tell one Optuna study about two Ray experiments: trials are
told twice (Ray Tune's ``UpdateFinishedTrialError``), the study ends with more trials than
asked, and the later driver's ``trials.csv`` drops the other's rows. So a driver takes an
exclusive ``fcntl.flock`` on ``RUN_DIR/driver.lock`` before it reads or writes anything else,
and a second driver is refused at once, naming the holder.

``flock`` belongs to the open file, so the operating system releases it when the driver's
process ends, however it ends (SIGKILL included): a lock is never stale. The file also holds
who took it (host, pid, command, time), for the refusal's message; a driver that ends cleanly
empties it, so a record found by the next driver is one a killed driver left, and is said.
The file itself is never deleted: a driver that opened it just before the deletion would
lock a file the next one no longer sees.

``flock`` is local to one machine's kernel (on some network file systems it is not shared
between machines): start the drivers of one run directory from one machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from raybatch.errors import Issue, RunDirError, RunLockedError

LOCK_FILE = "driver.lock"


class RunLock:
    """The exclusive lock of one run directory (a context manager).

    Args:
        run_dir: The run directory (created if missing).
        command: What holds it (``search``, ``resume``), for a refused driver's message.

    Attributes:
        taken_over: A note when the previous holder ended without releasing the lock (it was
            killed), else ``None``.

    Raises:
        RunLockedError: Another driver holds it (on entering).
        RunDirError: The directory cannot be written.
    """

    def __init__(self, run_dir: Path, command: str) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.command = command
        self.taken_over: str | None = None
        self._file: IO[str] | None = None

    def __enter__(self) -> RunLock:
        run_dir = self.path.parent
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            handle = self.path.open("a+", encoding="utf-8")
        except OSError as exc:  # read-only, a file where a directory should be...
            raise RunDirError(
                [Issue("(directory)", f"cannot write the run: {exc.strerror or exc}")],
                str(run_dir),
            ) from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read(handle))
            handle.close()
            why = (
                f"held by {holder}: one driver per run directory; wait for it to end, or stop"
                " it (Ctrl-C) and resume"
            )
            raise RunLockedError([Issue(LOCK_FILE, why)], str(run_dir)) from None
        previous = _read(handle)
        if previous:
            self.taken_over = f"{_describe(previous)} ended without releasing the run's lock"
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(_me(self.command)) + "\n")
        handle.flush()
        self._file = handle
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._file is None:
            return
        with contextlib.suppress(OSError):
            self._file.seek(0)
            self._file.truncate()  # released cleanly: nothing for the next driver to report
        self._file.close()  # and with it the flock
        self._file = None


def _me(command: str) -> dict[str, object]:
    return {
        "command": command,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _read(handle: IO[str]) -> dict[str, object] | None:
    """The holder's record, or None for an empty (released) or unreadable file."""
    handle.seek(0)
    try:
        record = json.loads(handle.read() or "null")
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _describe(record: dict[str, object] | None) -> str:
    if record is None:
        return "another driver"
    return (
        f"`raybatch {record.get('command', '?')}` (pid {record.get('pid', '?')} on"
        f" {record.get('host', '?')}, since {record.get('since', '?')})"
    )


__all__ = ["LOCK_FILE", "RunLock"]
