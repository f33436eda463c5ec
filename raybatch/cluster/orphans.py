"""Nothing of a local Ray outlives a driver killed outright (``kill -9``).

``ray.init()`` starts the local Ray's processes as the driver's descendants, and they end with
it, but two agents the raylet starts (the dashboard agent and the runtime-env agent) lingered
60-90 s after a ``kill -9`` of the driver, until they noticed the raylet was gone. A watch
started with the local Ray, in a session of its own (no signal to the driver's group reaches
it), notes the driver's Ray descendants from time to time and waits on a pipe only the driver
holds; when the pipe closes, the driver has ended, and the watch kills the Ray processes it
noted (and what they started since) that are still alive. Descendants, not a process group:
a test runner's workers or a shell's background jobs share one group, each with a Ray of its
own. A worker the raylet starts as the driver dies is no one's descendant by the time the
watch looks (the raylet has died, and the worker was handed to init), so the watch also kills
the workers whose environment names a noted process as their raylet (``RAY_RAYLET_PID``).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 1.0
"""How long the watch leaves Ray's own shutdown to end the processes first."""
NOTE_EVERY_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""When the watch notes the driver's descendants again (then every 30 s): Ray starts its
agents with the raylet, at once; the workers started later end with the raylet."""

_WATCHES: list[subprocess.Popen[bytes]] = []
"""The watches this process started: held for its lifetime, since a collected ``Popen`` would
close its end of the pipe, and the watch would take the driver for dead."""

Process = tuple[int, str]
"""A process as the watch knows it: its pid and its start time (a pid may be reused)."""


def watch_local_ray(ray_dir: str) -> None:
    """Start the watch for the local Ray this driver just started (nothing where ``/proc`` is
    not there to read). ``ray_dir`` is Ray's package folder: what the watch kills runs from
    there, or is a worker named ``ray::...``."""
    if not Path("/proc/self/stat").exists():
        return
    _WATCHES.append(subprocess.Popen(
        [sys.executable, "-m", __name__, str(os.getpid()), ray_dir],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    ))  # fmt: skip


def watching() -> bool:
    """Whether this process started a watch: its local Ray ends with it, however it ends."""
    return bool(_WATCHES)


def _processes() -> dict[int, tuple[int, str, bytes]]:
    """Every live process: pid -> (parent pid, start time, command line)."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            stat = (proc / "stat").read_text()
            command = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            found[int(proc.name)] = (int(fields[1]), fields[19], command)
    return found


def ray_descendants(roots: set[Process], ray_dir: str) -> set[Process]:
    """The live processes descending from ``roots`` (each still the process it was) that are
    Ray's: run from its package folder ``ray_dir``, or a worker named ``ray::...``."""
    folder = os.fsencode(ray_dir.rstrip("/") + "/")
    live = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in live.items():
        children.setdefault(parent, []).append(pid)
    frontier = [pid for pid, start in roots if pid in live and live[pid][1] == start]
    found: set[Process] = set()
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, []):
            frontier.append(child)
            _, start, command = live[child]
            if command.startswith(b"ray::") or folder in command:
                found.add((child, start))
    return found


def _raylet_of(process: Path) -> int | None:
    """The raylet that started ``process`` (its ``/proc`` entry), as the ``RAY_RAYLET_PID`` Ray
    sets in its workers' environment, which stays when the raylet is gone; ``None``: none, or
    not ours to read, or ended meanwhile."""
    try:
        environment = (process / "environ").read_bytes()
    except OSError:
        return None
    for item in environment.split(b"\0"):
        if item.startswith(b"RAY_RAYLET_PID="):
            value = item.removeprefix(b"RAY_RAYLET_PID=")
            return int(value) if value.isdigit() else None
    return None


def workers_of(raylet_pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The processes a raylet started (Ray's workers: the trials), found by the
    ``RAY_RAYLET_PID`` Ray sets in their environment, which stays when the raylet is gone and
    they were handed to init. Linux only (``/proc``); elsewhere none are found."""
    return [int(entry.name) for entry in proc.glob("[0-9]*")
            if _raylet_of(entry) == raylet_pid and int(entry.name) != os.getpid()]  # fmt: skip


def raylet_workers(raylets: set[int], ray_dir: str) -> set[Process]:
    """The live Ray processes (run from Ray's package folder ``ray_dir``, or a worker named
    ``ray::...``) started by one of the ``raylets`` (pids), wherever they were handed since:
    each one's environment read once."""
    folder = os.fsencode(ray_dir.rstrip("/") + "/")
    return {(pid, start) for pid, (_, start, command) in _processes().items()
            if (command.startswith(b"ray::") or folder in command)
            and _raylet_of(Path(f"/proc/{pid}")) in raylets}  # fmt: skip


def main(argv: list[str]) -> int:
    """The watch: note the driver's Ray descendants until its pipe closes, then kill them."""
    driver, ray_dir = int(argv[0]), argv[1]
    started = _processes().get(driver)
    if started is None:  # the driver has ended already: its Ray's reaper saw to it
        return 0
    roots = {(driver, started[1])}
    noted: set[Process] = set()
    waits = iter(NOTE_EVERY_S)
    while True:
        noted |= ray_descendants(roots | noted, ray_dir)
        ready, _, _ = select.select([sys.stdin], [], [], next(waits, NOTE_EVERY_S[-1]))
        if ready and not os.read(sys.stdin.fileno(), 4096):  # EOF: the driver has ended
            break
    time.sleep(GRACE_S)
    live = _processes()
    left = {(pid, start) for pid, start in noted if pid in live and live[pid][1] == start}
    started_late = raylet_workers({pid for pid, _ in noted}, ray_dir)
    for pid, _ in left | ray_descendants(left, ray_dir) | started_late:
        with contextlib.suppress(OSError):  # ended meanwhile
            os.kill(pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
