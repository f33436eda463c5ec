"""The hang guard: a running trial silent for longer than it could be is stopped by the driver.

A trial reports at every evaluation mark and checks its own time cap as it trains, so one that
has not reported for longer than the cap (plus a grace for start-up and one evaluation) is
stuck inside a step (a collective that never completes, a data loader that deadlocked, a
blocking call) and will never report again: no result-driven rule can stop it. Ray Tune asks
its scheduler which trial to run at every step of its loop; there
:class:`~raybatch.tuning.scheduler.CappingScheduler` has this guard stop any trial silent for
longer than ``after_s``, recording it as ``censored`` with the reason, and the search goes on.
(Silence, not age: evaluation time is outside the cap, so a healthy trial's total age may
exceed it.) Start-up is timed apart: before its first report a trial also has
``startup_s`` (its worker, model, data and probe), so a slow ``build_model`` is not taken for
a hang, and the window after it need not be wide enough for one.
"""

from __future__ import annotations

import time
from typing import Any

from raybatch import keys
from raybatch.status import HANG_STARTUP_S, TrialStatus


class HangGuard:
    """Stops trials silent for longer than ``after_s`` wall seconds, plus ``startup_s`` before
    a trial's first report (two windows for a data-parallel trial still waiting for its
    workers: :func:`placement_allowance`).

    Attributes:
        hung: Tune trial -> the seconds it had been silent when it was stopped.
    """

    def __init__(self, after_s: float, startup_s: float = HANG_STARTUP_S) -> None:
        self.after_s = after_s
        self.startup_s = startup_s
        self.hung: dict[str, float] = {}
        self._since: dict[str, float] = {}  # running trial -> when it last reported

    def __getstate__(self) -> dict[str, Any]:
        # Monotonic times mean nothing in another process: a resumed search times afresh.
        return {**self.__dict__, "_since": {}}

    def alive(self, trial_id: str) -> None:
        """``trial_id`` reported: its window starts again."""
        self._since[trial_id] = time.monotonic()

    def stop_hung(self, tune_controller: Any) -> None:
        """Stop every running trial silent for longer than its window, saying why in its last
        result (the searcher and the result grid read it)."""
        now = time.monotonic()
        for trial in tune_controller.get_trials():
            if trial.status != "RUNNING":
                self._since.pop(trial.trial_id, None)
                continue
            since = self._since.setdefault(trial.trial_id, now)
            if now - since <= self.window_s(trial):
                continue
            waited = now - since
            self.hung[trial.trial_id] = waited
            trial.run_metadata.last_result = {
                **trial.last_result,
                keys.STATUS: TrialStatus.CENSORED.value,
                keys.REASON: f"hung: no report for {waited:.0f} s with no end in sight"
                " (the trial checks its time cap as it trains, so a step never returned);"
                " stopped by the driver",
            }
            tune_controller.stop_trial(trial)

    def window_s(self, trial: Any) -> float:
        """The silence after which ``trial`` counts as hung: ``after_s`` (twice for a
        data-parallel trial waiting for its workers), plus ``startup_s`` until it reports."""
        window = self.after_s * placement_allowance(trial)
        return window if has_reported(trial) else window + self.startup_s


def has_reported(trial: Any) -> bool:
    """Whether raybatch's trial has reported: Tune fills a trial's last result with its own
    fields (trial id, pid, host) as soon as the actor starts, so only raybatch's status says."""
    return keys.STATUS in (getattr(trial, "last_result", None) or {})


def placement_allowance(trial: Any) -> float:
    """How many hang windows a trial may stay silent: two for a data-parallel trial that has
    not reported yet, which may first wait for its workers' GPUs (the searcher launches it only
    when they fit beside the other data-parallel trials, but packed single trials may still
    hold them until they end, within one trial's time cap); one otherwise. A data-parallel
    trial reports as soon as its workers are placed (:data:`~raybatch.keys.WORKERS_PLACED`),
    so from then on its clock is a single trial's."""
    config = getattr(trial, "config", None) or {}
    return 2.0 if not has_reported(trial) and config.get(keys.WORLD_SIZE, 1) > 1 else 1.0


__all__ = ["HangGuard", "has_reported", "placement_allowance"]
