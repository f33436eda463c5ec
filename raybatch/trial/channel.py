"""Where a trial's reports go, and what each carries beside the trial's own figures.

A report goes to Ray Tune (``tune.report``) or, from a Ray Train worker, to Ray Train; one at an
evaluation where the trial may be paused goes with the trial's saved state, Tune's checkpoint.
Reporting is timed as evaluation, never as training (:mod:`raybatch.trial.clock`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from raybatch import keys
from raybatch.errors import first_line
from raybatch.trial.clock import TrialClock
from raybatch.trial.pause import Saver

ReportFn = Callable[[dict[str, Any]], None]


def _tune_report(metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
    from ray import tune

    if checkpoint_dir is None:
        tune.report(metrics)
    else:  # Tune keeps it in the trial's storage; a paused or resumed trial goes on from it
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(checkpoint_dir))


class ReportChannel:
    """Where a trial's reports go, and what each carries beside the trial's own figures: its
    notes (what was evaluated, the probe's peak, the time model) and the device's (``extra``).

    Args:
        report_fn: Where reports go (default ``ray.tune.report``; Ray Train workers pass
            ``ray.train.report``).
        extra: Called at each report for device figures (:class:`ReporterOptions`).
    """

    def __init__(
        self, report_fn: ReportFn | None, extra: Callable[[], dict[str, Any]] | None
    ) -> None:
        self.report_fn = report_fn or _tune_report
        self.extra = extra
        self.saver: Saver | None = None
        """Set by a loop that can go on from a checkpoint (raybatch's own, in one process),
        where reports go to Tune: an evaluation's report carries the state it saves."""
        self.report_with_state: Callable[[dict[str, Any], str], None] = _tune_report
        """Where a report goes with the directory of a saved state (Tune's checkpoint)."""
        # A loop of the user's own evaluates what it evaluates; raybatch's reads an early
        # subset far from the target and says so (raybatch.trial.validation). Whether the LR
        # still ramps up is unknown (None) until a loop says (raybatch's does, at each mark).
        self.notes: dict[str, Any] = {keys.EVAL_WHOLE: True, keys.WARMING_UP: None}

    def carry_at_target(self, measure: Callable[[], dict[str, Any]]) -> None:
        """Carry what ``measure`` returns from now on; its failure is a note, never the trial's:
        the trial reached its target, and that stands."""
        try:
            self.notes.update(measure())
        except Exception as exc:
            self.notes[keys.TIME_MODEL_ERROR] = f"{type(exc).__name__}: {first_line(exc)}"

    def beside(self, fields: dict[str, Any], traceback: str | None) -> dict[str, Any]:
        """``fields``, then the notes, the traceback (of an ``error``) and the device's figures."""
        out = {**fields, **self.notes}
        if traceback is not None:
            out[keys.ERROR_TRACEBACK] = traceback
        if self.extra is not None:
            out.update(self.extra())
        return out

    def send(self, report: dict[str, Any], evaluation: bool, clock: TrialClock) -> None:
        """Send ``report``; an evaluation's goes with the trial's saved state where a saver
        is set and due (the report's training time decides). Reporting (at an evaluation, or
        anywhere on a CPU), saving, and Tune's copy of the save are timed as evaluation: no
        training, never in the objective (Ray Train's report waits for its controller's poll,
        which had entered a data-parallel trial's time to target). A heartbeat on a device is
        not: the device trains on its queued steps while the host reports."""
        train_s = float(report[keys.TRAIN_S])
        if not (evaluation and self.saver is not None and self.saver.due(train_s)):
            # The device idle (after an evaluation, or a CPU): no training while it reports; a
            # heartbeat on a device trains on its queued steps meanwhile.
            idle = evaluation or clock.synchronize is None
            with clock.idle() if idle else nullcontext():
                self.report_fn(report)
            return
        with clock.evaluating():
            started = time.perf_counter()
            try:
                self.report_with_state(report, self.saver.save(train_s))
            finally:
                self.saver.close()
                self.saver.cost_s = time.perf_counter() - started

    def close(self) -> None:
        """Release what ``extra`` holds (e.g. an NVML sampling thread), if it can be closed."""
        close = getattr(self.extra, "close", None)
        if close is not None:
            close()


__all__ = ["ReportChannel", "ReportFn"]
