"""A trial's clock: training time, with evaluations and the input pipeline's waits timed apart.

The objective is *training* time to target (``docs/search.md``): evaluations run at raybatch's
cadence, not the user's, so they are timed apart (``eval_s``) and never count in ``train_s``.
On CUDA the host queues work long before the device has done it, so a reading at a mark first
runs ``synchronize`` (``torch.cuda.synchronize``); between marks the time cap is read on the
host clock alone (:meth:`TrialClock.train_s_now` with ``synchronize=False``), so small
launch-bound batches pay no device sync per step. ``held_since`` is a plain wall clock, never
synchronised: what holding the device cost, start-up included, not what training took.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from raybatch import keys


class TrialClock:
    """Training, evaluation and data-wait seconds of one trial, and how long it held its device.

    Args:
        synchronize: Called before a synchronised reading (``torch.cuda.synchronize`` on
            CUDA), so the clock stops when the device has done the work, not when the host
            has queued it.
        clock: The seconds counter read (data-parallel workers pass one agreed by all ranks).
    """

    def __init__(
        self,
        synchronize: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.synchronize = synchronize
        self.clock = clock
        self._start: float | None = None
        self._eval_s = 0.0
        self._data_wait_s = 0.0
        self._resumed_elapsed_s = 0.0  # a resumed trial's training and evaluation so far
        self._held_before_s = 0.0  # a resumed trial's held seconds in its earlier processes
        self._startup_before_s = 0.0  # the start-up charged to its first process, if any
        self.held_since = time.perf_counter()
        """When the trial began holding its device (the wrapper sets its own entry): the
        origin of ``held_s``, a plain wall clock, never synchronised."""
        self.startup_s: float | None = None
        """Its process's start-up charged to this trial (the wrapper sets it: the first trial in
        a process has it; ``None``: not measured)."""

    def start(self) -> TrialClock:
        """Start the clock: right before the first training step (a resumed trial's clock goes
        on from the readings it was saved with: :meth:`resume`)."""
        self._start = self.now() - self._resumed_elapsed_s
        return self

    def state(self) -> dict[str, float]:
        """The readings a paused trial keeps (a synchronised reading): it goes on from them,
        its held seconds included (a trial the scheduler paused and resumed held its device in
        each of its processes; its report's span ends when it last held it and is as long as
        all of them: :func:`raybatch.results.cost.wall_clock` clips it to its session)."""
        return {"elapsed_s": self.elapsed_s, "eval_s": self._eval_s,
                "data_wait_s": self._data_wait_s, "held_s": self.held_s,
                "startup_s": self.startup_s or 0.0}  # fmt: skip

    def resume(self, state: dict[str, float]) -> None:
        """Go on from a paused trial's readings (:meth:`state`): its training and evaluation
        seconds count on from where they were, once :meth:`start` starts it again."""
        elapsed, eval_s, waited = (float(state[k]) for k in ("elapsed_s", "eval_s", "data_wait_s"))
        self._resumed_elapsed_s, self._eval_s, self._data_wait_s = elapsed, eval_s, waited
        self._held_before_s = float(state.get("held_s", 0.0))
        self._startup_before_s = float(state.get("startup_s", 0.0))

    @property
    def held_s(self) -> float:
        """Wall seconds the trial has held its device, in this process and those before it."""
        return time.perf_counter() - self.held_since + self._held_before_s

    @property
    def started(self) -> bool:
        """Whether the clock runs: training has begun."""
        return self._start is not None

    def now(self, synchronize: bool = True) -> float:
        """The clock's reading, after the device has caught up unless ``synchronize`` is off."""
        if synchronize and self.synchronize is not None:
            self.synchronize()
        return self.clock()

    @property
    def elapsed_s(self) -> float:
        """Training + evaluation time since :meth:`start` (a synchronised reading)."""
        if self._start is None:
            return 0.0
        return self.now() - self._start

    @property
    def eval_s(self) -> float:
        """Time spent inside :meth:`evaluating` so far."""
        return self._eval_s

    @property
    def train_s(self) -> float:
        """Training time since :meth:`start`: the elapsed time less the evaluations."""
        return max(self.elapsed_s - self._eval_s, 0.0)

    def train_s_now(self, synchronize: bool) -> float:
        """Training time for the budget check (0 before :meth:`start`); between marks read
        with ``synchronize=False``, on the host clock alone."""
        if self._start is None:
            return 0.0
        return self.now(synchronize) - self._start - self._eval_s

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """Time an evaluation: it counts in ``elapsed_s`` and ``eval_s``, never in ``train_s``."""
        start = self.now()
        try:
            yield
        finally:
            self._eval_s += self.now() - start

    @contextmanager
    def idle(self) -> Iterator[None]:
        """Time host work while the device has nothing queued (a report after an evaluation,
        or anywhere on a CPU): as an evaluation, never in ``train_s``, read on the host clock
        alone (there is nothing to wait for)."""
        start = self.now(synchronize=False)
        try:
            yield
        finally:
            self._eval_s += self.now(synchronize=False) - start

    def add_data_wait(self, seconds: float) -> None:
        """Time spent waiting for the next batch from the input pipeline."""
        self._data_wait_s += seconds

    @property
    def data_wait_s(self) -> float:
        """Time spent waiting on the input pipeline so far."""
        return self._data_wait_s

    def figures(self) -> dict[str, Any]:
        """The clock's fields of a report: one synchronised reading, and the held time."""
        elapsed = self.elapsed_s
        held = self.held_s
        return {
            keys.ELAPSED_S: elapsed,
            keys.TRAIN_S: max(elapsed - self._eval_s, 0.0),
            keys.EVAL_S: self._eval_s,
            keys.HELD_S: held,
            keys.STARTED_AT: time.time() - held,
            keys.STARTUP_S: self._startup_before_s or self.startup_s,  # its first process's
        }


__all__ = ["TrialClock"]
