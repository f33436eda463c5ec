"""Nothing of a local Ray outlives a driver killed outright (``kill -9``).

``ray.init()`` starts the local Ray's processes in the driver's process group, with a reaper
of Ray's own that sends the group SIGTERM when the driver dies. Two agents the raylet starts
(the dashboard agent and the runtime-env agent) ignore it and lingered 60-90 s after a
``kill -9`` of the driver, until they noticed the raylet was gone. A watch started with the
local Ray waits on a pipe from the driver, in a session of its own (so that neither Ray's
SIGTERM nor a terminal's Ctrl-C reaches it); when the pipe closes, the driver has ended, and
the watch kills what is left of Ray in the driver's process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 1.0
"""How long the watch leaves Ray's own shutdown (or its reaper) to end the processes first."""

_WATCHES: list[subprocess.Popen[bytes]] = []
"""The watches this process started: held for its lifetime, since a collected ``Popen`` would
close its end of the pipe, and the watch would take the driver for dead."""


def watch_local_ray(ray_dir: str) -> None:
    """Start the watch for the local Ray this driver just started (nothing where processes
    and groups are not POSIX's): a process reading a pipe whose write end only this driver
    holds, which closes when the driver exits, however it exits. ``ray_dir`` is Ray's package
    folder: what the watch kills runs from there, or is a worker named ``ray::...``."""
    if os.name != "posix":
        return
    _WATCHES.append(subprocess.Popen(
        [sys.executable, "-m", __name__, str(os.getpgrp()), str(os.getpid()), ray_dir],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    ))  # fmt: skip


def ray_processes_of_group(pgid: int, spare: int, ray_dir: str) -> list[int]:
    """The live processes of process group ``pgid`` that are Ray's (run from its package
    folder ``ray_dir``, or a worker named ``ray::...``), all but ``spare``."""
    folder = os.fsencode(ray_dir.rstrip("/") + "/")
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            stat = (proc / "stat").read_text()
            command = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(proc.name)
        if fields[0] == "Z" or int(fields[2]) != pgid or pid == spare:
            continue
        if command.startswith(b"ray::") or folder in command:
            found.append(pid)
    return found


def main(argv: list[str]) -> int:
    """The watch: block until the driver's pipe closes, then kill its group's Ray."""
    pgid, driver, ray_dir = int(argv[0]), int(argv[1]), argv[2]
    sys.stdin.buffer.read()  # EOF: the driver has exited (or been killed)
    time.sleep(GRACE_S)
    for pid in ray_processes_of_group(pgid, driver, ray_dir):
        with contextlib.suppress(OSError):  # ended meanwhile, or not ours to end
            os.kill(pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
