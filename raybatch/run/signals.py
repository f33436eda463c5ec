"""SIGTERM, the way Slurm and Kubernetes stop a job, taken as Ctrl-C while a search runs; and
Ctrl-C outside Ray Tune's loop ended as an interruption (:func:`interruptible`).

Ray's core worker, started in the driver by ``ray.init``, handles SIGTERM by dumping its C++
stack and aborting (exit 134): no raybatch line, no resume command, and trials left RUNNING.
Ctrl-C already ends a search cleanly (Ray Tune stops its trials, the driver records the
interruption and says how to resume), so SIGTERM is sent on as SIGINT, to the driver alone,
while the search runs (:func:`~raybatch.cluster.connect.init_ray` keeps this handler through
``ray.init``); the handler that was there before is put back then (one installed outside
Python, as Ray's is, cannot be: the default, which also ends the process, takes its place).

A SIGTERM to the whole process group (a terminal's ``kill -- -PID``; Slurm signals every
process of a job) reaches the Ray the driver started too: its GCS and raylet end, Ray Tune's
graceful stop waits for them a minute and Ray aborts the driver, while the trials' workers,
in process groups of their own, train on as orphans. So after a SIGTERM the driver watches the
Ray it started (:class:`_SigtermWatch`): once its raylet or GCS has ended, or at a second SIGTERM,
it ends the search at once: the workers of its Ray killed, one line with the resume command,
exit 130. What finished is in the run directory (saved as each trial ended), and ``resume``
treats the rest as a driver killed mid-search.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from raybatch.cluster.orphans import workers_of
from raybatch.errors import SearchInterrupted

EXIT_INTERRUPTED = 130  # the shell's code for a process ended by SIGINT
WATCH_EVERY_S = 0.2


def _ray_heads(kinds: tuple[str, ...] | None = None) -> list[Any]:
    """The processes (``subprocess.Popen``) of the Ray this driver started, of ``kinds`` (Ray's
    process types; ``None``: all, helpers included); none when it connected to a cluster
    (whose processes a signal here never reaches) or Ray is down."""
    try:
        import ray._private.worker as ray_worker

        node: Any = ray_worker._global_node
        processes: dict[str, list[Any]] = node.all_processes if node is not None else {}
    except (ImportError, AttributeError):  # Ray's private layout moved: nothing to watch
        return []
    return [info.process for kind, infos in processes.items() for info in infos
            if kinds is None or kind in kinds]  # fmt: skip


def _of_kinds(*kinds: str) -> list[Any]:
    """:func:`_ray_heads` of Ray's process types named in its ``ray_constants`` (``kinds``:
    their constants' names, so a renamed type is missed, never guessed)."""
    try:
        from ray._private import ray_constants

        types = tuple(getattr(ray_constants, kind) for kind in kinds)
    except (ImportError, AttributeError):
        return []
    return _ray_heads(types)


def _vital() -> list[Any]:
    """The processes without which the Ray this driver started cannot answer, so Tune's
    graceful stop cannot end: its GCS and its raylet (not its helpers: a log monitor that
    ended says nothing). One ended, whatever ended it, means stopping at once."""
    return _of_kinds("PROCESS_TYPE_GCS_SERVER", "PROCESS_TYPE_RAYLET")


def _raylet_pid() -> int | None:
    raylets = _of_kinds("PROCESS_TYPE_RAYLET")
    return int(raylets[0].pid) if raylets else None


class _SigtermWatch:
    """After a SIGTERM: the graceful stop (Ctrl-C) begun, and the Ray this driver started
    watched; ended at once (:meth:`end_now`) if that Ray's own processes got the signal too, or
    at a second SIGTERM."""

    def __init__(self, lost: str) -> None:
        self.lost = lost
        self.signals = 0
        self.closing = threading.Event()  # the driver shuts its Ray down itself: not a signal's
        self.done = threading.Event()

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.signals > 1:
            self.end_now("a second SIGTERM")
        os.kill(os.getpid(), signal.SIGINT)  # Ray Tune's graceful stop, as Ctrl-C
        vital = _vital()
        if vital:
            threading.Thread(target=self._watch, args=(vital,), daemon=True).start()

    def _watch(self, heads: list[Any]) -> None:
        while not self.done.wait(WATCH_EVERY_S):
            if self.closing.is_set():
                return
            if any(p.poll() is not None for p in heads):
                self.end_now("SIGTERM reached the Ray this search started too")

    def end_now(self, why: str) -> None:
        """Kill what is left of the Ray this driver started (its trials' workers first), say
        so in one line with the resume command, and exit 130: a graceful stop cannot end."""
        raylet = _raylet_pid()
        for pid in workers_of(raylet) if raylet is not None else []:
            _kill(pid)
        for process in _ray_heads():
            if process.poll() is None:
                _kill(process.pid)
        sys.stderr.write(f"raybatch: stopped at once ({why}): {self.lost}\n")
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):  # ended meanwhile
        os.kill(pid, signal.SIGKILL)


_active: _SigtermWatch | None = None


def ray_closing() -> None:
    """The driver shuts its own Ray down now: its processes ending is not a signal's doing."""
    if _active is not None:
        _active.closing.set()


@contextmanager
def sigterm_as_interrupt(lost: str = "the trials running were lost") -> Iterator[None]:
    """Within the block, SIGTERM to this process is handled as Ctrl-C, and one that reached the
    Ray this driver started too, or a second one, ends it at once saying ``lost`` (see the
    module).

    Outside the main thread (where Python cannot set a handler) nothing changes.
    """
    global _active
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watch, outer = _SigtermWatch(lost), _active
    previous = signal.signal(signal.SIGTERM, watch.on_sigterm)
    _active = watch
    try:
        yield
    finally:
        watch.done.set()
        _active = outer
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextmanager
def interruptible(run_dir: Path) -> Iterator[None]:
    """A search's driver: SIGTERM taken as Ctrl-C, and Ctrl-C where Ray Tune's loop is not
    there to stop gracefully (before the search's Tuner runs, or while the results are
    written) ended as an interruption, one line with the resume command, never a traceback.

    Raises:
        SearchInterrupted: Ctrl-C (or SIGTERM) outside Ray Tune's loop.
    """
    lost = (f"the trials that were running are lost, what finished is saved: continue with"
            f" `raybatch resume {run_dir}`")  # fmt: skip
    with sigterm_as_interrupt(lost):
        try:
            yield
        except KeyboardInterrupt:
            raise SearchInterrupted(
                f"interrupted; what finished is saved: continue with `raybatch resume {run_dir}`"
            ) from None


@contextmanager
def sigint_given_back() -> Iterator[None]:
    """Ray Tune's ``fit()`` replaces the SIGINT handler with its graceful stop and leaves it
    there when it returns (it puts the old one back only at a first signal): a Ctrl-C, or a
    SIGTERM taken as one, while the driver then writes the run up only set a flag no loop read,
    and the run was written up as finished. The handler before the block is put back after
    it (outside the main thread nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before if before is not None else signal.default_int_handler)


@contextmanager
def interrupted_while(doing: str, run_dir: Path, resume_does: str = "") -> Iterator[None]:
    """Ctrl-C (or SIGTERM, inside :func:`interruptible`) while the driver is ``doing`` a phase
    outside Ray Tune's loop: an interruption of that phase, said with what ``resume`` does.

    Raises:
        SearchInterrupted: Naming the phase and the resume command.
    """
    try:
        yield
    except KeyboardInterrupt:
        raise SearchInterrupted(
            f"interrupted while {doing}: continue with `raybatch resume {run_dir}`{resume_does}"
        ) from None


__all__ = ["interrupted_while", "interruptible", "ray_closing", "sigint_given_back",
           "sigterm_as_interrupt"]  # fmt: skip
