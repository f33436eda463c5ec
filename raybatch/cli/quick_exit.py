"""The console script's end: its last line is said, then the process ends at once.

A search's verdict was printed about 2.5 s before the prompt came back (measured: one search
of the bundled digits example): Ray's shutdown waits a whole second on its autoscaler monitor,
which ignores SIGTERM once the GCS it reports to is gone, and the interpreter then spends over
a second tearing down torch and Ray's modules. Everything a command writes is on disk by then
(the run directory, the Optuna study's commits), so the command flushes its streams and logs
and ends with :func:`os._exit`. A Ray the command started (``address="local"``) ends with its
driver, as after a ``kill -9``: its processes share the driver's fate, and the watch of
:mod:`raybatch.cluster.orphans` kills what lingers. A cluster the command joined is left the
ordinary way (``ray.shutdown()`` only disconnects from it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable

from raybatch.cluster.orphans import watching


def run_then_exit(app: Callable[[], object]) -> None:
    """Run ``app`` (a Click or Typer application, which ends in ``SystemExit``) and end the
    process with its exit status without the interpreter's teardown. An exception other than
    ``SystemExit`` propagates as it would have (its traceback is the bug report)."""
    try:
        app()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if isinstance(code, str):  # sys.exit("message"): said, then status 1, as Python does
        print(code, file=sys.stderr)
        code = 1
    status = code if isinstance(code, int) else 0 if code is None else 1
    _disconnect_from_a_cluster()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(status)


def _disconnect_from_a_cluster() -> None:
    """Leave a cluster this process joined by address, as ``ray.shutdown()`` leaves it; a Ray
    of this process's own that a watch guards is left to end with it (the module's docstring);
    one without a watch is shut down."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    if not watching():  # a cluster's address, or no /proc for a watch to read: the usual way
        ray.shutdown()


__all__ = ["run_then_exit"]
