"""The trial clock, the sample marks, the target check and the statuses, in one object.

raybatch's own loop and a user's own loop both report through a :class:`TrialReporter`:

    with TrialReporter(raybatch.Target(0.97), eval_every_samples=1024, max_time_s=60) as run:
        for batch in loader:
            ...  # your step
            if run.add(samples=len(batch), steps=1, loss=loss.item()):
                break
            if run.eval_due:
                with run.evaluating():  # kept out of the objective
                    accuracy = evaluate(model)
                if run.report(accuracy):
                    break

The objective is *training* time to target (``docs/search.md``): evaluations run at
raybatch's cadence, not the user's, so they are timed apart (``eval_s``). On CUDA,
``synchronize`` runs at marks only, so small launch-bound batches pay no device sync per step.
"""

from __future__ import annotations

import gc
import math
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from raybatch import keys
from raybatch.errors import Issue, OptionError, first_line
from raybatch.memory.probe import is_out_of_memory, release_memory
from raybatch.metric import Target
from raybatch.status import TrialStatus, objective_value

ReportFn = Callable[[dict[str, Any]], None]


def _tune_report(metrics: dict[str, Any]) -> None:
    from ray import tune

    tune.report(metrics)


HEARTBEATS = 32
"""Reports between marks per time cap, at least: a trial capped at ``slack x`` the incumbent is
stopped within ``max_time_s / 32`` of training past its cap (1.9 s at the CLI's 60 s)..."""
HEARTBEAT_MAX_S = 5.0
"""...and within 5 s whatever the cap: a cap of hours must not let a trial run minutes past a
cap of seconds. A report every 5 s costs one device sync and one Tune result."""


TIME_MARK_RATIO = 3**0.5
"""Training-time marks are this far apart (a factor): two between rungs a factor 3 apart, so
each rung is judged within ``sqrt(3)`` x its time (:mod:`raybatch.run.rungs`)."""
NEAR_MARK_RATIO = 1.15
"""Near the target the time marks are this far apart (a factor): a time to target is read at
the first evaluation past the crossing, so marks ``sqrt(3)`` apart overstated it by up to 73 %
(the real benchmark's times sat on the marks); near the target the whole validation set is read
(:mod:`raybatch.trial.validation`), and each evaluation there sets the next at most 15 % later."""
TIME_MARKS_BELOW_CAP = 10
"""The first time mark is the cap / ``sqrt(3)^10`` (= cap / 243): below the lowest rung before
any trial has reached (the cap / 81), and below B/9 wherever B lies above the cap / 27."""


def time_marks(max_time_s: float) -> list[float]:
    """Evaluation marks on training time, geometric up to the time cap: the equal-time rungs
    (:mod:`raybatch.run.rungs`) need an evaluation near each, whatever the batch size, where a
    sample mark (a quarter epoch) may come only after the first rungs have passed."""
    return [max_time_s / TIME_MARK_RATIO**k for k in range(TIME_MARKS_BELOW_CAP, 0, -1)]


def heartbeat_for(max_time_s: float) -> float:
    """The longest a trial trains between two reports (:data:`HEARTBEATS`,
    :data:`HEARTBEAT_MAX_S`)."""
    return min(max_time_s / HEARTBEATS, HEARTBEAT_MAX_S)


class TrialReporter:
    """Clock, sample marks, target and budgets of one trial; reports to Ray Tune.

    Args:
        target: The value to reach (a float means ``Target(value)``, higher is better).
        eval_every_samples: Evaluate each time this many more training samples have been
            seen — the same for every batch size, so all are judged at the same points.
        max_time_s: Cap on training time (evaluation excluded); past it the trial is
            ``censored``.
        max_samples: Optional sample budget; past it the trial is ``censored``.
        divergence_factor: A loss above this multiple of the first loss is ``diverged``.
        report_fn: Where reports go (default ``ray.tune.report``; Ray Train workers pass
            ``ray.train.report``).
        synchronize: Called before every clock read at a mark (``torch.cuda.synchronize`` on
            CUDA) and at a heartbeat; never at other steps.
        extra: Called at each report for device figures (peak memory, GPU utilisation).
        heartbeat_s: Between marks, report at least once per this many seconds of training
            (default: :func:`heartbeat_for` ``max_time_s``), so that a scheduler can
            cap a trial whose next mark is far off (a small batch, a slow recipe): the
            capping rule reads ``train_s``, and it can act only on a report.
        check_budgets_between_marks: Check the time and sample caps at every :meth:`add`
            (default). Data-parallel workers turn it off: there every decision to stop must be
            agreed by all workers, which costs a collective, so caps are checked at marks only.
        eval_at_s: Training times at which an evaluation is also due (:func:`time_marks`),
            besides the sample marks; read on the host clock between marks, so no device sync.
            Only where budgets are checked between marks.
    """

    def __init__(
        self,
        target: Target | float,
        *,
        eval_every_samples: int,
        max_time_s: float,
        max_samples: int | None = None,
        divergence_factor: float = 10.0,
        report_fn: ReportFn | None = None,
        synchronize: Callable[[], None] | None = None,
        extra: Callable[[], dict[str, Any]] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        check_budgets_between_marks: bool = True,
        heartbeat_s: float | None = None,
        eval_at_s: Sequence[float] = (),
    ) -> None:
        issues = [Issue(name, f"must be positive, got {value}")
                  for name, value in (("eval_every_samples", eval_every_samples),
                                      ("max_time_s", max_time_s)) if value <= 0]  # fmt: skip
        if issues:
            raise OptionError(issues)
        self.target = target if isinstance(target, Target) else Target(float(target))
        self.eval_every_samples = eval_every_samples
        self.max_time_s = max_time_s
        self.max_samples = max_samples
        self.divergence_factor = divergence_factor
        self._report_fn = report_fn or _tune_report
        self._synchronize = synchronize
        self._extra = extra
        self._clock = clock
        self.check_budgets_between_marks = check_budgets_between_marks
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else heartbeat_for(max_time_s)
        self._reported_train_s = 0.0
        self._time_marks = sorted(float(t) for t in eval_at_s)
        self._time_mark_due = False
        self._near_ratio: float | None = None  # set once near the target (:meth:`near_target`)
        self._timed = bool(self._time_marks)  # evaluations on training time, not the user's

        self.status = TrialStatus.RUNNING
        self.reason = ""
        self.samples_seen = 0
        self.steps = 0
        self.next_mark = eval_every_samples
        self.last_mark = 0
        self.metric: float | None = None
        self.loss: float | None = None
        self.initial_loss: float | None = None
        self.time_to_target_s: float | None = None
        self.elapsed_to_target_s: float | None = None
        self.samples_to_target: int | None = None
        self._start: float | None = None
        self.held_since = time.perf_counter()
        """When the trial began holding its device (the wrapper sets its own entry): the
        origin of ``held_s``, a plain wall clock, never synchronised."""
        self.startup_s: float | None = None
        """Its process's start-up charged to this trial (the wrapper sets it: the first trial in
        a process has it; ``None``: not measured)."""
        self._eval_s = 0.0
        self._data_wait_s = 0.0
        self.reports: int = 0
        self.error_traceback: str | None = None
        self.values: dict[str, float] = {}
        # A loop of the user's own evaluates what it evaluates; raybatch's reads an early
        # subset far from the target and says so (raybatch.trial.validation).
        self.notes: dict[str, Any] = {keys.EVAL_WHOLE: True}
        self.at_target: Callable[[], dict[str, Any]] | None = None
        """Run once the target is reached, before the final report, which carries what it
        returns (the search's time model); its time counts as evaluation, never in the
        objective, and its failure is a note, never the trial's."""

    def near_target(self, ratio: float = NEAR_MARK_RATIO) -> None:
        """The trial is near its target: from the next report on, each evaluation sets the
        next at most ``ratio`` x its training time later (:data:`NEAR_MARK_RATIO`). Only where
        the reporter keeps time marks (a cadence the user chose is kept as given)."""
        if self._timed:
            self._near_ratio = ratio

    def note(self, key: str, value: Any) -> None:
        """Carry ``key: value`` in every report from now on (e.g. the probe's measured peak)."""
        self.notes[key] = value

    # ------------------------------------------------------------------ clock

    def start(self) -> TrialReporter:
        """Start the clock: call right before the first training step."""
        self._start = self._now()
        return self

    @property
    def started(self) -> bool:
        """Whether the clock runs: training has begun."""
        return self._start is not None

    def _now(self, synchronize: bool = True) -> float:
        if synchronize and self._synchronize is not None:
            self._synchronize()
        return self._clock()

    @property
    def elapsed_s(self) -> float:
        """Training + evaluation time since :meth:`start`."""
        if self._start is None:
            return 0.0
        return self._now() - self._start

    @property
    def eval_s(self) -> float:
        """Time spent inside :meth:`evaluating` so far."""
        return self._eval_s

    @property
    def train_s(self) -> float:
        """Training time since :meth:`start`: the elapsed time less the evaluations."""
        return max(self.elapsed_s - self._eval_s, 0.0)

    def step_s(self) -> float:
        """Training seconds per optimizer step so far (0 before the first)."""
        return self.train_s / self.steps if self.steps else 0.0

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """Time an evaluation: it counts in ``elapsed_s`` and ``eval_s``, never in the objective."""
        start = self._now()
        try:
            yield
        finally:
            self._eval_s += self._now() - start

    def add_data_wait(self, seconds: float) -> None:
        """Time spent waiting for the next batch from the input pipeline."""
        self._data_wait_s += seconds

    # ------------------------------------------------------------------ progress

    @property
    def stopped(self) -> bool:
        return self.status.terminal

    @property
    def eval_due(self) -> bool:
        """A sample mark, or a training-time mark, has been passed since the last evaluation."""
        return not self.stopped and (self.samples_seen >= self.next_mark or self._time_mark_due)

    def add(self, samples: int, steps: int = 0, loss: float | None = None) -> bool:
        """Count training progress; check the loss and the budgets. True once stopped.

        Call it at optimizer-step boundaries: ``loss`` is the step's (mean) loss, or ``None``
        when the loop reads its loss only at marks (then pass it to :meth:`check_loss`).
        Between marks the time cap is checked against the host clock, without synchronising.
        """
        self.samples_seen += samples
        self.steps += steps
        if loss is not None:
            self.check_loss(loss)
        if not self.stopped and not self.eval_due and self.check_budgets_between_marks:
            train_s = self._check_budgets(synchronize=False)
            if self._time_marks and train_s >= self._time_marks[0]:
                self._time_mark_due = not self.stopped
                return self.stopped
            if not self.stopped and train_s - self._reported_train_s >= self.heartbeat_s:
                self._emit(heartbeat=True)  # the scheduler can cap between evaluations
        return self.stopped

    def check_loss(self, loss: float) -> bool:
        """Stop as ``diverged`` on a NaN/Inf loss or one past ``divergence_factor`` x the first."""
        self.loss = float(loss)
        if self.stopped:
            return True
        if not math.isfinite(self.loss):
            self.finish(TrialStatus.DIVERGED, f"loss is {self.loss} at step {self.steps}")
        elif self.initial_loss is None:
            self.initial_loss = self.loss
        elif self.loss > self.divergence_factor * max(self.initial_loss, 1e-12):
            self.finish(
                TrialStatus.DIVERGED,
                f"loss {self.loss:.4g} exceeds {self.divergence_factor:g} x the initial"
                f" {self.initial_loss:.4g} at step {self.steps}",
            )
        return self.stopped

    def _check_budgets(self, synchronize: bool = True) -> float:
        """Stop on an exhausted time or sample budget; the training time it read."""
        train_s = 0.0
        if self._start is not None:
            train_s = self._now(synchronize) - self._start - self._eval_s
        if train_s > self.max_time_s:
            self.finish(
                TrialStatus.CENSORED,
                f"time cap of {self.max_time_s:g} s of training reached at {self.samples_seen}"
                f" samples without reaching {self.target.metric} {self.target.value:g}",
            )
        elif self.max_samples is not None and self.samples_seen >= self.max_samples:
            self.finish(
                TrialStatus.CENSORED,
                f"sample budget of {self.max_samples} spent without reaching"
                f" {self.target.metric} {self.target.value:g}",
            )
        return train_s

    # ------------------------------------------------------------------ reports

    def report(
        self,
        metric: float,
        samples: int | None = None,
        steps: int | None = None,
        values: Mapping[str, float] | None = None,
    ) -> bool:
        """Report an evaluation; stop on the target or an exhausted budget. True once stopped.

        ``samples``/``steps`` (totals so far) are for custom loops that count themselves.
        ``values`` are all the validation metrics of this evaluation, reported as
        ``val_<name>`` (``metric`` is the target's among them; without ``values``, it alone).
        """
        if self.stopped:
            return True
        named = {self.target.metric: metric} if values is None else values
        self.values = {str(k): float(v) for k, v in named.items()}
        if samples is not None:
            self.samples_seen = samples
        if steps is not None:
            self.steps = steps
        self.metric = float(metric)
        if not math.isfinite(self.metric):
            self.finish(TrialStatus.DIVERGED, f"validation metric is {self.metric}")
            return True
        while self.next_mark <= self.samples_seen:
            self.last_mark = self.next_mark
            self.next_mark += self.eval_every_samples
        self._time_mark_due = False
        if self.target.reached(self.metric):
            self.elapsed_to_target_s = self.elapsed_s
            self.time_to_target_s = max(self.elapsed_to_target_s - self._eval_s, 0.0)
            self.samples_to_target = self.samples_seen
            self.status = TrialStatus.REACHED
            self.reason = (
                f"{self.target.metric} {self.metric:.4g} reached {self.target.value:g} after"
                f" {self.samples_seen} samples in {self.time_to_target_s:.3f} s of training"
            )
            self._measure_at_target()
            self._emit()
            return True
        trained = self._check_budgets()  # the clock read once: the cap, and the marks passed
        self._time_marks = [t for t in self._time_marks if t > trained]
        if self._near_ratio is not None and trained > 0:
            self._time_marks = sorted({*self._time_marks, trained * self._near_ratio})
        if not self.stopped:
            self._emit()
        return self.stopped

    def _measure_at_target(self) -> None:
        if self.at_target is None:
            return
        with self.evaluating():
            try:
                self.notes.update(self.at_target())
            except Exception as exc:  # the trial reached its target: that stands
                self.notes[keys.TIME_MODEL_ERROR] = f"{type(exc).__name__}: {first_line(exc)}"
            finally:  # it holds the model and optimizer: the trial's memory is freed after
                self.at_target = None

    def finish(self, status: TrialStatus, reason: str, traceback: str | None = None) -> None:
        """End the trial with a terminal status and send the final report (once).

        ``traceback`` (for ``error``) travels in the final report, so the driver can keep it in
        the run's log even when the trial ran on another node.
        """
        if self.stopped or not status.terminal:
            return
        self.status = status
        self.reason = reason
        self.error_traceback = traceback
        self._emit()

    def fail(self, exc: BaseException, during: str = "") -> None:
        """End the trial for an exception: ``infeasible_memory`` for an OOM, else ``error``."""
        text = first_line(exc)
        if is_out_of_memory(exc):
            self.finish(TrialStatus.INFEASIBLE_MEMORY, f"out of memory {during}: {text}".strip())
            return
        where = f" ({during})" if during else ""
        self.finish(
            TrialStatus.ERROR,
            f"{type(exc).__name__}: {text}{where}",
            "".join(traceback.format_exception(exc)),
        )

    def metrics(self) -> dict[str, Any]:
        """The fields of a report (see :mod:`raybatch.keys`)."""
        elapsed = self.elapsed_s
        train_s = max(elapsed - self._eval_s, 0.0)
        out: dict[str, Any] = {
            keys.STATUS: self.status.value,
            keys.REASON: self.reason,
            keys.METRIC: self.metric,
            keys.LOSS: self.loss,
            keys.ELAPSED_S: elapsed,
            keys.TRAIN_S: train_s,
            keys.EVAL_S: self._eval_s,
            keys.HELD_S: (held := time.perf_counter() - self.held_since),
            keys.STARTED_AT: time.time() - held,
            keys.STARTUP_S: self.startup_s,
            keys.SAMPLES_SEEN: self.samples_seen,
            keys.STEPS: self.steps,
            keys.EVAL_MARK: self.last_mark,
            keys.TIME_TO_TARGET_S: self.time_to_target_s,
            keys.ELAPSED_TO_TARGET_S: self.elapsed_to_target_s,
            keys.SAMPLES_TO_TARGET: self.samples_to_target,
            keys.THROUGHPUT: self.samples_seen / train_s if train_s > 0 else 0.0,
            keys.DATA_WAIT_FRACTION: self._data_wait_s / train_s if train_s > 0 else 0.0,
            keys.OBJECTIVE: objective_value(self.status, self.time_to_target_s, self.max_time_s),
        }
        for name, value in self.values.items():
            out[keys.VALIDATION_PREFIX + name] = value
        out.update(self.notes)
        if self.error_traceback is not None:
            out[keys.ERROR_TRACEBACK] = self.error_traceback
        if self._extra is not None:
            out.update(self._extra())
        return out

    def close(self) -> None:
        """Release what ``extra`` holds (e.g. an NVML sampling thread), if it can be closed."""
        close = getattr(self._extra, "close", None)
        if close is not None:
            close()

    def _emit(self, heartbeat: bool = False) -> None:
        self.reports += 1
        out = {**self.metrics(), keys.HEARTBEAT: heartbeat}
        self._reported_train_s = float(out[keys.TRAIN_S])
        self._report_fn(out)

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> TrialReporter:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """End the trial with a reason whatever happened inside; the search goes on.

        An out-of-memory error becomes ``infeasible_memory``, any other exception ``error``
        (both are swallowed, reported, and memory is released); a loop that ends without a
        verdict is ``censored``. ``KeyboardInterrupt`` and other non-``Exception`` errors
        propagate.
        """
        if exc is None:
            self.finish(TrialStatus.CENSORED, "training ended before the target was reached")
            return False
        if not isinstance(exc, Exception):
            return False

        self.fail(exc, "during training")
        del exc, tb
        gc.collect()
        release_memory()
        return True
