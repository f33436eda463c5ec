"""One trial's progress, verdict and reports, as its training loop tells them.

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

The reporter decides; each of its parts holds one job: the clock (:mod:`~raybatch.trial.clock`:
training time, the device synchronised at marks only), the cadence (:mod:`~raybatch.trial.cadence`:
when an evaluation or a heartbeat is due), the limits (:mod:`~raybatch.trial.limits`: why a trial
stops), the tally (:mod:`~raybatch.trial.tally`: what it counted and read) and the channel
(:mod:`~raybatch.trial.channel`: where reports go, and what travels with them).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from raybatch import keys
from raybatch.errors import Issue, OptionError
from raybatch.memory.probe import release_memory
from raybatch.metric import Target
from raybatch.status import TrialStatus
from raybatch.trial.cadence import NEAR_MARK_RATIO, Cadence
from raybatch.trial.channel import ReportChannel, ReportFn
from raybatch.trial.clock import TrialClock
from raybatch.trial.limits import TrialLimits, failure
from raybatch.trial.tally import TrialTally


def _refuse_nonpositive(**values: float) -> None:
    """One error that names every setting that is not positive."""
    issues = [Issue(name, f"must be positive, got {v}") for name, v in values.items() if v <= 0]
    if issues:
        raise OptionError(issues)


@dataclass(frozen=True)
class ReporterOptions:
    """The reporter's rarely set knobs: a trial's wrapper sets them, a custom loop seldom does.

    Attributes:
        divergence_factor: A loss above this multiple of the first loss is ``diverged``.
        extra: Called at each report for device figures (peak memory, GPU utilisation);
            closed by :meth:`TrialReporter.close` where it can be.
        check_budgets_between_marks: Check the time and sample caps at every
            :meth:`TrialReporter.add` (default). Data-parallel workers turn it off: there every
            decision to stop must be agreed by all workers, which costs a collective, so caps
            are checked at marks only.
        heartbeat_s: Between marks, report at least once per this many seconds of training
            (default: :func:`~raybatch.trial.cadence.heartbeat_for` ``max_time_s``), so
            that a scheduler can cap a trial whose next mark is far off: the capping rule
            reads ``train_s``, and it can act only on a report.
        eval_at_s: Training times at which an evaluation is also due
            (:func:`~raybatch.trial.cadence.time_marks`); the sample marks are then a
            backstop, counted from the last evaluation. Read on the host clock between marks,
            so no device sync. Only where budgets are checked between marks.
        pause_at_s: Training times at which a scheduler may pause the trial (its rungs): the
            first evaluation past one saves the trial's state, whatever the save costs
            (:class:`~raybatch.trial.pause.Saver`), so that it goes on from there.
    """

    divergence_factor: float = 10.0
    extra: Callable[[], dict[str, Any]] | None = None
    check_budgets_between_marks: bool = True
    heartbeat_s: float | None = None
    eval_at_s: Sequence[float] = ()
    pause_at_s: Sequence[float] = ()


class TrialReporter:
    """One trial's progress and verdict, told to Ray Tune; its parts hold the rest: the
    :attr:`clock`, the :attr:`cadence`, the :attr:`limits`, the :attr:`tally` and the report
    :attr:`channel`.

    Args:
        target: The value to reach (a float means ``Target(value)``, higher is better).
        eval_every_samples: Evaluate each time this many more training samples have been
            seen: a fixed grid, the same for every batch size; beside ``eval_at_s`` time
            marks, counted from the last evaluation (:class:`~raybatch.trial.cadence.Cadence`).
        max_time_s: Cap on training time (evaluation excluded); past it, ``censored``.
        max_samples: Optional sample budget; past it, ``censored``.
        report_fn: Where reports go (:class:`~raybatch.trial.channel.ReportChannel`; default
            ``ray.tune.report``).
        clock: The trial's clock (default ``TrialClock()``: the host's, never synchronised;
            on CUDA ``TrialClock(synchronize=...)`` waits for the device at marks).
        options: The rarely set knobs (:class:`ReporterOptions`).
    """

    def __init__(
        self,
        target: Target | float,
        *,
        eval_every_samples: int,
        max_time_s: float,
        max_samples: int | None = None,
        report_fn: ReportFn | None = None,
        clock: TrialClock | None = None,
        options: ReporterOptions | None = None,
    ) -> None:
        _refuse_nonpositive(eval_every_samples=eval_every_samples, max_time_s=max_time_s)
        self.options = options if options is not None else ReporterOptions()
        target = target if isinstance(target, Target) else Target(float(target))
        self.limits = TrialLimits(target, max_time_s, max_samples, self.options.divergence_factor)
        self.clock = clock if clock is not None else TrialClock()
        self.cadence = Cadence(eval_every_samples, max_time_s, self.options.heartbeat_s,
                               self.options.eval_at_s)  # fmt: skip
        self.channel = ReportChannel(report_fn, self.options.extra)
        self.tally = TrialTally()
        self.status = TrialStatus.RUNNING
        self.reason = ""
        self.error_traceback: str | None = None
        self.at_target: Callable[[], dict[str, Any]] | None = None
        """Run once the target is reached, before the final report, which carries what it
        returns (the search's time model); its time counts as evaluation, never in training."""

    @property
    def target(self) -> Target:
        return self.limits.target

    def near_target(self, ratio: float = NEAR_MARK_RATIO) -> None:
        """The trial is near its target: evaluate more often (:meth:`Cadence.near_target`)."""
        self.cadence.near_target(ratio)

    def note(self, key: str, value: Any) -> None:
        """Carry ``key: value`` in every report from now on (e.g. the probe's measured peak)."""
        self.channel.notes[key] = value

    def start(self) -> TrialReporter:
        """Start the clock: call right before the first training step."""
        self.clock.start()
        return self

    @property
    def started(self) -> bool:
        """Whether the clock runs: training has begun."""
        return self.clock.started

    def step_s(self) -> float:
        """Training seconds per optimizer step so far (0 before the first)."""
        return self.clock.train_s / self.tally.steps if self.tally.steps else 0.0

    def evaluating(self) -> AbstractContextManager[None]:
        """Time an evaluation: it counts in ``elapsed_s`` and ``eval_s``, never in the objective."""
        return self.clock.evaluating()

    def add_data_wait(self, seconds: float) -> None:
        """Time spent waiting for the next batch from the input pipeline."""
        self.clock.add_data_wait(seconds)

    @property
    def stopped(self) -> bool:
        return self.status.terminal

    @property
    def eval_due(self) -> bool:
        """A sample mark, or a training-time mark, has been passed since the last evaluation."""
        return not self.stopped and self.cadence.due(self.tally.samples_seen)

    def add(self, samples: int, steps: int = 0, loss: float | None = None) -> bool:
        """Count training progress; check the loss and the budgets. True once stopped.

        Call it at optimizer-step boundaries; ``loss`` is the step's, or ``None`` where the loop
        reads it at marks only (:meth:`check_loss`). Between marks, no device sync.
        """
        self.tally.samples_seen += samples
        self.tally.steps += steps
        if loss is not None:
            self.check_loss(loss)
        if not self.stopped and not self.eval_due and self.options.check_budgets_between_marks:
            train_s = self._check_budgets(synchronize=False)
            if self.cadence.time_mark_passed(train_s):  # due unless stopped (:attr:`eval_due`)
                return self.stopped
            if not self.stopped and self.cadence.heartbeat_due(train_s):
                self._emit(heartbeat=True)  # the scheduler can cap between evaluations
        return self.stopped

    def check_loss(self, loss: float) -> bool:
        """Stop as ``diverged`` on a NaN/Inf loss or one past ``divergence_factor`` x the first."""
        tally = self.tally
        tally.loss = float(loss)
        if self.stopped:
            return True
        if (
            reason := self.limits.diverged(tally.loss, tally.initial_loss, tally.steps)
        ) is not None:
            self.finish(TrialStatus.DIVERGED, reason)
        elif tally.initial_loss is None:
            tally.initial_loss = tally.loss
        return self.stopped

    def _check_budgets(self, synchronize: bool = True) -> float:
        """Stop on an exhausted time or sample budget; the training time it read."""
        train_s = self.clock.train_s_now(synchronize)
        if (reason := self.limits.spent(train_s, self.tally.samples_seen)) is not None:
            self.finish(TrialStatus.CENSORED, reason)
        return train_s

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
        tally = self.tally
        named = {self.target.metric: metric} if values is None else values
        tally.values = {str(k): float(v) for k, v in named.items()}
        tally.samples_seen = tally.samples_seen if samples is None else samples
        tally.steps = tally.steps if steps is None else steps
        tally.metric = float(metric)
        if not math.isfinite(tally.metric):
            self.finish(TrialStatus.DIVERGED, f"validation metric is {tally.metric}")
            return True
        self.cadence.passed(tally.samples_seen)
        if self.target.reached(tally.metric):
            tally.elapsed_to_target_s = self.clock.elapsed_s
            tally.time_to_target_s = max(tally.elapsed_to_target_s - self.clock.eval_s, 0.0)
            tally.samples_to_target = tally.samples_seen
            self.status = TrialStatus.REACHED
            self.reason = self.limits.reached(tally.metric, tally.samples_seen,
                                              tally.time_to_target_s)  # fmt: skip
            self._measure_at_target()
            self._emit()
            return True
        self.cadence.trained(self._check_budgets())  # one clock reading: the cap, the marks
        if not self.stopped:
            self._emit()
        return self.stopped

    def _measure_at_target(self) -> None:
        # It holds the model and optimizer: let go of it, so the trial's memory is freed after.
        measure, self.at_target = self.at_target, None
        if measure is not None:
            with self.evaluating():  # off the objective's clock
                self.channel.carry_at_target(measure)

    def finish(self, status: TrialStatus, reason: str, traceback: str | None = None) -> None:
        """End the trial with a terminal status and send the final report (once); a traceback
        travels in it, so the run's log keeps it though the trial ran on another node."""
        if self.stopped or not status.terminal:
            return
        self.status = status
        self.reason = reason
        self.error_traceback = traceback
        self._emit()

    def fail(self, exc: BaseException, during: str = "") -> None:
        """End the trial for an exception: ``infeasible_memory`` for an OOM, else ``error``."""
        self.finish(*failure(exc, during))

    def metrics(self) -> dict[str, Any]:
        """The fields of a report (see :mod:`raybatch.keys`)."""
        clock = self.clock.figures()  # elapsed, training, evaluation and held seconds; start-up
        out: dict[str, Any] = {
            keys.STATUS: self.status.value,
            keys.REASON: self.reason,
            **clock,
            **self.tally.fields(clock[keys.TRAIN_S], self.clock.data_wait_s),
            keys.EVAL_MARK: self.cadence.last_mark,
            keys.OBJECTIVE: self.limits.objective(self.status, self.tally.time_to_target_s),
        }
        return self.channel.beside(out, self.error_traceback)

    def close(self) -> None:
        """Release what ``extra`` holds (e.g. an NVML sampling thread), if it can be closed."""
        self.channel.close()

    def _emit(self, heartbeat: bool = False) -> None:
        self.tally.reports += 1
        out = {**self.metrics(), keys.HEARTBEAT: heartbeat}
        self.cadence.reported(float(out[keys.TRAIN_S]))
        # An evaluation that goes on may be where the trial is paused: its state goes along.
        self.channel.send(out, not heartbeat and not self.stopped, self.clock)

    def state(self) -> dict[str, Any]:
        """What a paused trial's reporter keeps: its counts, last values, marks and clock."""
        return {**self.tally.kept(), "cadence": dict(vars(self.cadence)),
                "clock": self.clock.state()}  # fmt: skip

    def restore(self, state: dict[str, Any]) -> None:
        """Go on from :meth:`state`: call before :meth:`start`, which starts the clock from the
        saved readings. Read whole before anything is set: a state it cannot read changes
        nothing."""
        kept = {name: state[name] for name in TrialTally.KEPT}
        cadence = dict(state["cadence"])
        self.clock.resume(state["clock"])  # whole or not at all
        vars(self.tally).update(kept)
        vars(self.cadence).update(cadence)

    def __enter__(self) -> TrialReporter:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """End the trial with a reason whatever happened inside; the search goes on: an OOM is
        ``infeasible_memory``, any other ``Exception`` is ``error`` (both swallowed, reported,
        memory released), a loop ended without a verdict ``censored``; the rest propagates."""
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


__all__ = ["ReporterOptions", "TrialReporter"]
