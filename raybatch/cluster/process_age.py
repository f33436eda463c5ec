"""A trial's process, reused: the start-up its first trial is charged, and Tune's wait for it.

Tune reuses a trial's process for the next trial of the same resources
(:data:`raybatch.tuning.warm.REUSE_ACTORS`), so the process's start-up (unpickling the
trainable, which imports raybatch, torch and the workload) is paid once per process, not once
per trial, but it is still device time the search held: the first trial run in a process is
charged from when the process first imported raybatch (``raybatch._lazy.IMPORTED_AT``), every later
one from its own start. Not from the process's own start: Ray starts idle workers ahead of use,
and one may wait unused for minutes before it is given a trial. A process that first ran one of
raybatch's own Ray tasks (the time model, a device reading) has paid its start-up there:
:func:`charged_to_task` marks it, so its first trial is charged from its own start.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from raybatch._lazy import IMPORTED_AT

REUSE_WAIT_S = 60
"""How long Tune may wait for a stopped trial's cleanup (data-loader workers, a CUDA sync)
before it reuses the process for the next trial. Past it Tune fails that next trial, which is
not the recipe's fault; its own default, 2 s, is too short for a GPU trial."""

_charged = False

F = TypeVar("F", bound=Callable[..., Any])


def start_trial() -> tuple[float, float | None]:
    """A trial starts in this process: when it began to hold its device, on
    ``time.perf_counter``'s clock (see the module's docstring), and the process's start-up
    charged to it (``None``: the process's first trial had it); Tune's reuse wait is set."""
    global _charged
    # Read by Ray's FunctionTrainable.reset_config, in this process, when it is reused.
    os.environ.setdefault("TUNE_FUNCTION_THREAD_TIMEOUT_S", str(REUSE_WAIT_S))
    now = time.perf_counter()
    if _charged:
        return now, None
    _charged = True
    since = min(now, IMPORTED_AT)
    return since, now - since


def charged_to_task(function: F) -> F:
    """``function`` as one of raybatch's own Ray tasks: the process's start-up is charged to it
    (a trial later run in the same process is charged from its own start)."""

    @functools.wraps(function)
    def task(*args: Any, **kwargs: Any) -> Any:
        global _charged
        _charged = True
        return function(*args, **kwargs)

    return task  # type: ignore[return-value]


__all__ = ["REUSE_WAIT_S", "charged_to_task", "start_trial"]
