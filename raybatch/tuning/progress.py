"""What a search says while it works: one line per phase and per finished trial.

Ray Tune's live table says what each trial is doing; it does not say which phase the search
is in, what the best recipe so far is, or what the search has cost so far. These lines do, on
the ``raybatch.progress`` logger (INFO): the CLI prints them on stderr whatever ``--quiet``
says (it drops only Ray's table), and :func:`raybatch.search` prints them when ``verbose`` is
set and the caller has given the logger no handler of their own.

The cost so far is what the closing lines give for the whole search: the slots the finished
runs kept busy x the wall clock from the first one's start to the last one's end (start-up,
data, probe, training, evaluations and the gaps between them), in trainings of the best
recipe so far (its time to target).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from types import SimpleNamespace
from typing import Any

from ray.tune import Callback

from raybatch import keys
from raybatch.results.cost import device_seconds, slots_used, wall_clock
from raybatch.tuning.race_record import race_seed

LOGGER = "raybatch.progress"
log = logging.getLogger(LOGGER)


@contextmanager
def printed(enabled: bool) -> Iterator[None]:
    """The progress lines on stderr for the duration (when ``enabled`` and the logger has no
    handler of the caller's)."""
    if not enabled or log.handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("raybatch: %(message)s"))
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


@contextmanager
def ray_quiet(enabled: bool) -> Iterator[None]:
    """Ray's own chatter kept off the terminal for the duration, when ``enabled`` (``--quiet``,
    ``verbose=0``): Ray Tune's experiment box and "View detailed results" lines, which it
    prints on stdout at every verbosity, and Ray's INFO log lines ("Started a local Ray
    instance", "Wrote the latest version of all result files"). Warnings and errors still
    show; raybatch's own lines (stderr) and its closing lines (printed after) are untouched."""
    if not enabled:
        yield
        return
    # Ray's handler on its "ray" logger prints every record of its children; ray.init sets
    # that logger's level back to INFO, so the handler is what filters here.
    handlers = list(logging.getLogger("ray").handlers)
    for handler in handlers:
        handler.addFilter(_warnings_and_up)
    try:
        with open(os.devnull, "w") as sink, redirect_stdout(sink):
            yield
    finally:
        for handler in handlers:
            handler.removeFilter(_warnings_and_up)


def _warnings_and_up(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


def recipe(config: dict[str, Any]) -> str:
    """``128 x 2 at 4x``: the raw knobs a line names a recipe by."""
    world = config.get(keys.WORLD_SIZE, 1)
    where = f" x {world} workers" if world and world > 1 else ""
    return (f"{config.get(keys.MICRO_BATCH_SIZE)} x {config.get(keys.ACCUMULATION_STEPS, 1)}"
            f"{where} at {config.get(keys.LR_MULTIPLIER, 1.0):.3g}x")  # fmt: skip


SILENCE_S = 15.0
"""Seconds without a line after which the search says what its running trials are doing (a
model that takes 45 s to build gave 50 s of silence)."""


class Progress(Callback):
    """A Tune callback: a line for each finished trial, with the best so far and the cost so
    far (from every finished trial Tune holds, so a resumed search counts its earlier ones),
    and a line whenever :data:`SILENCE_S` pass without one while trials run.

    Args:
        phase: What the lines are about (``search``, ``race``).
        total: Trials the phase may run (``None``: not known ahead).
        extra_s: Device seconds spent before the phase (the race's: the search's).
        clock: Seconds, monotonic (for tests).
        sessions: When each driver session started (epoch seconds: the search, each
            resume): the wall clock is counted within them, never across an interruption.
        slots: Trials the search runs at once (``None``: the most runs that overlapped).
    """

    def __init__(self, phase: str, total: int | None = None, extra_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic,
                 sessions: Sequence[float] = (), slots: int | None = None) -> None:  # fmt: skip
        self.phase = phase
        self.total = total
        self.extra_s = extra_s
        self.sessions = list(sessions)
        self.slots = slots
        self._clock = clock
        self._said_at: float | None = None
        self._started: dict[str, float] = {}  # running trial -> when this callback saw it start

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any
                       ) -> None:  # fmt: skip
        self._started[trial.trial_id] = self._clock()

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any
                          ) -> None:  # fmt: skip
        self._started.pop(trial.trial_id, None)
        self._say(self.line(trials, trial))

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any
                       ) -> None:  # fmt: skip
        self._started.pop(trial.trial_id, None)

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        """Break a silence of :data:`SILENCE_S` with what the running trials are doing."""
        now = self._clock()
        if self._said_at is None:
            self._said_at = now
        if now - self._said_at < SILENCE_S:
            return
        running = [t for t in trials if t.status == "RUNNING"]
        if running:
            self._say("still working: " + "; ".join(self._doing(t, now) for t in running[:2])
                      + (f"; {len(running) - 2} more" if len(running) > 2 else ""))  # fmt: skip

    def _doing(self, trial: Any, now: float) -> str:
        """What one running trial is doing, in a few words."""
        result = trial.last_result or {}
        trained = result.get(keys.TRAIN_S)
        name = recipe(trial.config)
        if trained is None:
            since = now - self._started.get(trial.trial_id, now)
            return f"{name} starting for {since:.0f} s (its process, data, model, memory probe)"
        metric = result.get(keys.METRIC)
        shown = f", {metric:.4g} at its last evaluation" if isinstance(metric, float) else ""
        return f"{name} training, {trained:.1f} s so far{shown}"

    def _say(self, text: str) -> None:
        self._said_at = self._clock()
        log.info(text)

    def line(self, trials: list[Any], trial: Any) -> str:
        """The line for ``trial``'s end, among ``trials``."""
        # Tune calls back before it marks the trial itself terminated: it counts as done.
        done = [t for t in trials if t.status in ("TERMINATED", "ERROR") or t is trial]
        # The race runs in the search's Tuner: its runs are counted apart, as "race run"s.
        racing = _racing(trial)
        counted = [t for t in done if _racing(t) == racing]
        phase, total = ("race run", None) if racing else (self.phase, self.total)
        result = trial.last_result or {}
        status = result.get(keys.STATUS, "error")
        if status == "running":  # its last report came before the scheduler stopped it
            status = "capped"
        reached = result.get(keys.TIME_TO_TARGET_S)
        level = (getattr(trial, "config", None) or {}).get(keys.MEET_LEVEL)
        to = "" if level is None else f" the meeting level {level:.4g}"
        what = f"{status}{to} in {reached:.2f} s" if status == "reached" and reached else status
        if status == "error":  # why, in a line; the whole traceback is in the run's log
            why = str(result.get(keys.REASON) or "").strip().splitlines()
            what = f"error{': ' + why[0] if why else ''} (traceback in search.log)"
        of = f" of {total}" if total else ""
        text = f"{phase} {len(counted)}{of}: {recipe(trial.config)}: {what}"
        # The best so far is the search's: a race run's time is one seed's, and the recipe
        # whose run is fastest on it may still lose the race.
        times = [(t.last_result.get(keys.TIME_TO_TARGET_S), t) for t in done
                 if (t.last_result or {}).get(keys.STATUS) == "reached" and not _racing(t)
                 ]  # fmt: skip
        times = [(s, t) for s, t in times if s]
        if not times:
            return text
        best_s, best = min(times, key=lambda st: st[0])
        return (f"{text} | best so far {recipe(best.config)}, {best_s:.2f} s | spent so far"
                f" {self.spent_s(done) / best_s:.1f} trainings of it")  # fmt: skip

    def spent_s(self, done: list[Any]) -> float:
        """What the finished runs cost so far, as the closing lines count it: the slots they
        kept busy x the wall clock from the first one's start to the last one's end (every
        second each held, where the runs do not say when they started)."""
        results = [t.last_result or {} for t in done]
        spans = [SimpleNamespace(started_at=r.get(keys.STARTED_AT), held_s=r.get(keys.HELD_S))
                 for r in results]  # fmt: skip
        wall = wall_clock(spans, self.sessions)
        if wall is None:
            return self.extra_s + sum(_device_s(t) for t in done)
        used = slots_used(spans)
        return self.extra_s + min(self.slots or used, used) * wall


def _racing(trial: Any) -> bool:
    """Whether a Tune trial is a confirmation run (its config carries its seed)."""
    return race_seed(trial.config) is not None


def _device_s(trial: Any) -> float:
    """What a finished trial held, counted as the closing lines count it."""
    result = trial.last_result or {}
    return device_seconds(float(result.get(keys.HELD_S) or 0.0),
                          int(trial.config.get(keys.WORLD_SIZE, 1) or 1),
                          result.get(keys.GPU_SHARE))  # fmt: skip


def say_start(left_out: Sequence[str], trials: int, in_flight: int) -> None:
    """What the user's code does that the trials will not, then the search's plan."""
    for item in left_out:
        log.info(f"not used by the search: {item}")
    log.info(f"searching: {trials} trials, {in_flight} at a time: the largest batch at a few"
             " LRs and the reference, then the batches the time model predicts fastest, then"
             " Optuna's TPE")  # fmt: skip


__all__ = ["LOGGER", "Progress", "printed", "recipe", "say_start"]
