"""Adaptive capping: stop a trial that can no longer beat the best time to target.

The analogue of adaptive capping in algorithm configuration (ParamILS, Hutter et al. 2009;
SMAC; irace reports 20-45% of the effort saved): once some trial has reached the target in
``T*`` seconds of training, any running trial whose training time (``train_s``, the clock of
the objective: evaluations excluded) passes ``slack x T*`` cannot win, so it is stopped. The
default slack of 1.2 leaves room for timing noise, as SMAC's does. A capped trial is censored
data at its cap; the searcher records it as ``capped`` with the PAR-10 penalty.

It also guards against **hung** trials. A trial reports at every evaluation mark and checks its
own time cap as it trains, so one that has not reported for longer than the cap (plus a grace
for start-up and one evaluation) is stuck inside a step (a collective that never completes, a
data loader that deadlocked, a blocking call) and will never report again: no result-driven
rule can stop it. Ray Tune asks the scheduler which trial to run at every step of its loop, so
there the scheduler stops any trial silent for longer than ``hang_after_s``, recording it as
``censored`` with the reason, and the search goes on. (Silence, not age: evaluation time is
outside the cap, so a healthy trial's total age may exceed it.)
"""

from __future__ import annotations

import time
from typing import Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from raybatch import keys
from raybatch.trial.status import TrialStatus

DEFAULT_SLACK = 1.2


class CappingScheduler(FIFOScheduler):
    """A FIFO scheduler that stops trials slower than ``slack`` x the incumbent's time.

    Args:
        slack: Multiple of the best time to target past which a trial is stopped.
        enabled: ``False`` keeps the bookkeeping but never stops (for comparisons).
        hang_after_s: Wall seconds without a report (or, before the first, since the trial
            started) after which a running trial counts as hung and is stopped (``None``:
            never). Set it well past the trial's own time cap plus its start-up (model build,
            probe, data loading), which the trial clock excludes.
    """

    def __init__(
        self, slack: float = DEFAULT_SLACK, enabled: bool = True, hang_after_s: float | None = None
    ) -> None:
        if slack < 1.0:
            raise ValueError(f"slack must be >= 1, got {slack}")
        super().__init__()
        self.slack = slack
        self.enabled = enabled
        self.hang_after_s = hang_after_s
        self.best_time_to_target_s: float | None = None
        self.capped: dict[str, float] = {}
        self.hung: dict[str, float] = {}
        self._running_since: dict[str, float] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Monotonic times mean nothing in another process: a resumed search times afresh.
        state = self.__dict__.copy()
        state["_running_since"] = {}
        return state

    @property
    def cap_s(self) -> float | None:
        """The training time past which a running trial is stopped (None before any success)."""
        if self.best_time_to_target_s is None:
            return None
        return self.slack * self.best_time_to_target_s

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        if self.hang_after_s is not None:
            self._running_since[trial.trial_id] = time.monotonic()  # it is alive: re-arm
        if result.get(keys.STATUS) == TrialStatus.REACHED.value:
            self._record(result.get(keys.TIME_TO_TARGET_S))
            return TrialScheduler.CONTINUE
        cap = self.cap_s
        trained = result.get(keys.TRAIN_S)
        running = result.get(keys.STATUS) == TrialStatus.RUNNING.value
        if self.enabled and running and cap is not None and trained is not None and trained > cap:
            self.capped[trial.trial_id] = float(trained)
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        """Ray Tune's per-step hook: stop hung trials, then choose as FIFO does."""
        if self.hang_after_s is not None:
            self._stop_hung(tune_controller)
        return super().choose_trial_to_run(tune_controller)

    def _stop_hung(self, tune_controller: Any) -> None:
        assert self.hang_after_s is not None
        now = time.monotonic()
        for trial in tune_controller.get_trials():
            if trial.status != "RUNNING":
                self._running_since.pop(trial.trial_id, None)
                continue
            since = self._running_since.setdefault(trial.trial_id, now)
            if now - since <= self.hang_after_s:
                continue
            waited = now - since
            self.hung[trial.trial_id] = waited
            # The searcher and the result grid read the trial's last result: make it say why.
            trial.run_metadata.last_result = {
                **trial.last_result,
                keys.STATUS: TrialStatus.CENSORED.value,
                keys.REASON: f"hung: no report for {waited:.0f} s with no end in sight"
                " (the trial checks its time cap as it trains, so a step never returned);"
                " stopped by the driver",
            }
            tune_controller.stop_trial(trial)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        if result and result.get(keys.STATUS) == TrialStatus.REACHED.value:
            self._record(result.get(keys.TIME_TO_TARGET_S))

    def _record(self, time_to_target_s: float | None) -> None:
        if time_to_target_s is None:
            return
        if self.best_time_to_target_s is None or time_to_target_s < self.best_time_to_target_s:
            self.best_time_to_target_s = float(time_to_target_s)

    def debug_string(self) -> str:
        cap = "none yet" if self.cap_s is None else f"{self.cap_s:.3f} s"
        return (
            f"CappingScheduler: cap {cap}, {len(self.capped)} trials capped, {len(self.hung)} hung"
        )
