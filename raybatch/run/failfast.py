"""Stop a search early when its trials fail for a reason no recipe will change.

A workload that cannot be built in a Ray worker (a missing package, a file that is not there,
a bug in ``build_model``) fails in every trial the same way; running the rest of the budget
only repeats the failure. :class:`FailFast` watches the trials' failures — an ``error`` status
that a trial reported (:meth:`~raybatch.trial.reporting.TrialReporter.fail`) or an exception
that escaped into Ray (the trainable could not even be unpickled) — and stops the experiment
once ``after`` failures share one cause (exception type and first line) while no trial has
ended any other way. A failure that depends on the recipe (an OOM, a NaN: other statuses; or an
error some other trial did not hit) never stops the search.

Every failure's traceback is appended to the run's log (``search.log``), not printed: the
terminal gets one message from :class:`~raybatch.errors.TrialsFailedError`.

It is a Ray Tune ``Callback`` (to see errors and results) and a ``Stopper`` (whose
``stop_all`` ends the experiment): pass the same object to ``RunConfig(callbacks=[ff],
stop=ff)``.
"""

from __future__ import annotations

import io
import logging
import pickle
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ray.tune import Callback, Stopper

from raybatch import keys
from raybatch.errors import first_line
from raybatch.run.signals import ray_closing
from raybatch.status import WORKLOAD_RAN, TrialStatus

FAIL_FAST_AFTER = 3
"""Identical failures, with no trial ending any other way, that stop the search. Ray retries a
trial whose worker died, so one broken trial can count up to ``max_failures + 1`` times."""


@dataclass(frozen=True)
class Failure:
    """One failed trial (or one failed attempt of it).

    Attributes:
        trial: Ray Tune's trial name.
        cause: ``ExceptionType: first line of its message``.
        config: The raw knobs the trial ran (for the message).
    """

    trial: str
    cause: str
    config: dict[str, Any]


_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): (.+)$")
_RAY_WRAPPERS = ("RayTaskError", "RayActorError", "ActorDiedError", "TuneError", "RaySystemError")


def _read(path: str | None) -> bytes:
    try:
        return Path(path).read_bytes() if path else b""
    except OSError:
        return b""


def _cause_of_error(trial: Any) -> tuple[str, str]:
    """``(cause, traceback)`` of an exception that escaped into Ray Tune.

    Read from the trial's local error files, which Tune writes before it calls back. Ray's
    wrappers (a task error, an actor that died while its class was unpickled) are looked
    through: the cause is the innermost ``SomeError: message`` of the text.
    """
    text = _read(trial.error_file).decode("utf-8", "replace")
    text = text[text.rfind("Failure # ") :] if "Failure # " in text else text
    inner = None
    raw = _read(trial.pickled_error_file)
    if raw:
        try:
            error = pickle.loads(raw)
            inner = getattr(error, "cause", None) or error
        except Exception:  # an exception class the driver cannot rebuild: use the text
            inner = None
    if isinstance(inner, BaseException) and type(inner).__name__ not in _RAY_WRAPPERS:
        return f"{type(inner).__name__}: {first_line(inner)}", text or repr(inner)
    for line in reversed(text.splitlines()):
        match = _EXCEPTION_LINE.match(line.strip())
        if match and match.group(1).rpartition(".")[2] not in _RAY_WRAPPERS:
            return f"{match.group(1).rpartition('.')[2]}: {match.group(2)}", text
    if isinstance(inner, BaseException):
        return f"{type(inner).__name__}: {first_line(inner)}", text
    return "the trial's worker failed (no error text)", text


_ENDED_WELL = frozenset(s.value for s in TrialStatus if s.terminal and s is not TrialStatus.ERROR)
"""Statuses that show the workload itself works (a trainable reporting none is ignored)."""


@dataclass
class _FailureTally:
    failures: list[Failure] = field(default_factory=list)
    healthy: int = 0
    tripped: Failure | None = None


_WATCHES: dict[str, _FailureTally] = {}
"""The state of each run's watcher, by log path. Ray Tune pickles its callbacks into the
experiment state and a restored Tuner runs the unpickled copy: both must see one state."""


class FailFast(Callback, Stopper):
    """Ray Tune callback and stopper: see the module docstring.

    Creating one starts a fresh watch for its log path (a resumed search starts counting
    again: the user may have fixed the workload in between), seeded with ``healthy``.

    Args:
        log_path: Where every failure's traceback is appended.
        after: Identical failures, with no healthy trial, that stop the search.
        healthy: Trials that already ended other than in ``error`` (a resumed search's):
            with one, the workload is known to work and no failure stops the search.
    """

    def __init__(self, log_path: Path, after: int = FAIL_FAST_AFTER, healthy: int = 0) -> None:
        self.log_path = log_path
        self.after = after
        _WATCHES[str(log_path)] = _FailureTally(healthy=healthy)

    def __getstate__(self) -> dict[str, Any]:
        return {"log_path": self.log_path, "after": self.after}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def _watch(self) -> _FailureTally:
        return _WATCHES.setdefault(str(self.log_path), _FailureTally())

    @property
    def failures(self) -> list[Failure]:
        return self._watch.failures

    @property
    def tripped(self) -> Failure | None:
        """The first of the identical failures that stopped the search, if it stopped."""
        return self._watch.tripped

    # ------------------------------------------------------------------ Callback

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        status = result.get(keys.STATUS)
        if status == TrialStatus.ERROR.value:
            self._failed(trial, str(result.get(keys.REASON)), result.get(keys.ERROR_TRACEBACK))
        elif status in WORKLOAD_RAN:  # a trainable reporting no status is ignored
            self._watch.healthy += 1

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        cause, text = _cause_of_error(trial)
        self._failed(trial, cause, text)

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.on_trial_error(iteration, trials, trial, **info)

    # ------------------------------------------------------------------ Stopper

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.tripped is not None

    # ------------------------------------------------------------------ state

    def _failed(self, trial: Any, cause: str, traceback: str | None) -> None:
        config = {k: trial.config.get(k) for k in keys.RAW_KNOBS if k in trial.config}
        failure = Failure(str(trial), cause, config)
        self.failures.append(failure)
        self._log(failure, traceback)
        same = [f for f in self.failures if f.cause == cause]
        watch = self._watch
        if watch.tripped is None and watch.healthy == 0 and len(same) >= self.after:
            watch.tripped = same[0]

    def _log(self, failure: Failure, traceback: str | None) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self.log_path.open("a", encoding="utf-8") as f:
            f.write(f"=== {stamp} trial {failure.trial} {failure.config} failed: {failure.cause}\n")
            f.write((traceback or "(no traceback)").rstrip() + "\n\n")

    def summary(self) -> str:
        """What the user reads when the search stopped: cause, trial, log."""
        first = self.tripped or (self.failures[0] if self.failures else None)
        if first is None:
            return "no trial failed"
        same = [f for f in self.failures if f.cause == first.cause]
        trials = len({f.trial for f in same})
        attempts = "" if trials == len(same) else f" ({len(same)} attempts, Ray's retries included)"
        knobs = ", ".join(f"{k}={v}" for k, v in first.config.items())
        return "\n".join(
            [
                f"the search stopped early: {trials} trial(s){attempts} failed with the same"
                f" error and none got further: {first.cause}",
                f"first failure: trial {first.trial} ({knobs})",
                f"full tracebacks: {self.log_path}",
                "fix the cause (the workload, or the environment of the workers) and start the"
                " search again",
            ]
        )


RAY_ERROR_THREAD = "ray_listen_error_messages"
"""The driver thread in which Ray prints errors its workers publish (an actor whose class could
not be unpickled, a worker that died), whatever ``log_to_driver`` says."""


class _Divert(io.TextIOBase):
    """A stream that sends what Ray's error thread writes to a log, the rest through."""

    def __init__(self, stream: TextIO, log: TextIO) -> None:
        self._stream = stream
        self._log = log
        self.everything = False  # set while Ray shuts down: it flushes held-back errors

    def write(self, text: str) -> int:
        if self.everything or threading.current_thread().name == RAY_ERROR_THREAD:
            self._log.write(text)
            self._log.flush()
            return len(text)
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._stream.encoding


TUNE_STATE_LOGGER = "ray.tune.execution.experiment_state"
"""Ray Tune's logger of experiment-state saving: a save that races a trial being stopped (a
file gone while it is copied) is logged with a full traceback, and a failed search's user saw
it under the one-line error. The run's log keeps such records; the search says how many."""


class _Counting(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes records to the run's log and counts the errors among them."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self.errors = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.errors += 1
        super().emit(record)


class Diverted:
    """What :func:`ray_errors_to` yields: :meth:`shutdown_ray` ends Ray with nothing printed;
    :attr:`tune_state_errors` counts the failed saves of Tune's state sent to the log."""

    def __init__(self, streams: tuple[_Divert, _Divert], handler: _Counting) -> None:
        self._streams = streams
        self._handler = handler

    @property
    def tune_state_errors(self) -> int:
        return self._handler.errors

    def shutdown_ray(self) -> None:
        """Shut down the Ray this search started, its last worker errors sent to the log.

        Trials still starting when fail-fast stops the search fail after it; Ray holds some of
        their errors back (to deduplicate them) and prints them while shutting down, from
        whichever thread shuts it down.
        """
        import ray

        ray_closing()  # its processes ending now is not a SIGTERM's doing
        for stream in self._streams:
            stream.everything = True
        try:
            ray.shutdown()
        finally:
            for stream in self._streams:
                stream.everything = False


@contextmanager
def ray_errors_to(log_path: Path) -> Iterator[Diverted]:
    """While inside, the worker errors Ray prints on the driver go to ``log_path`` instead.

    Ray's own thread prints each failed worker's traceback to the terminal; a search whose
    every trial fails would print thousands of such lines. The run's log keeps them all.
    """
    with log_path.open("a", encoding="utf-8") as log:
        saved = sys.stdout, sys.stderr
        streams = _Divert(saved[0], log), _Divert(saved[1], log)
        tune_state = logging.getLogger(TUNE_STATE_LOGGER)
        handler, propagated = _Counting(log), tune_state.propagate
        tune_state.addHandler(handler)
        tune_state.propagate = False
        sys.stdout, sys.stderr = streams
        try:
            yield Diverted(streams, handler)
        finally:
            sys.stdout, sys.stderr = saved
            tune_state.removeHandler(handler)
            tune_state.propagate = propagated
