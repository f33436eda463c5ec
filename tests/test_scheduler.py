"""Adaptive capping, driven directly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ray.tune.schedulers import TrialScheduler

from raybatch import keys
from raybatch.run.scheduler import CappingScheduler


def _trial(name: str) -> SimpleNamespace:
    return SimpleNamespace(trial_id=name)


def test_no_cap_until_a_trial_reaches_the_target() -> None:
    s = CappingScheduler(slack=1.2)
    assert (
        s.on_trial_result(None, _trial("a"), {keys.STATUS: "running", keys.TRAIN_S: 1e6})
        == TrialScheduler.CONTINUE
    )
    assert s.cap_s is None


def test_trials_past_slack_times_the_incumbent_are_stopped() -> None:
    s = CappingScheduler(slack=1.2)
    s.on_trial_result(None, _trial("fast"), {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 10.0})
    assert s.cap_s == pytest.approx(12.0)
    ok = {keys.STATUS: "running", keys.TRAIN_S: 11.9}
    slow = {keys.STATUS: "running", keys.TRAIN_S: 12.1}
    assert s.on_trial_result(None, _trial("b"), ok) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("c"), slow) == TrialScheduler.STOP
    assert s.capped == {"c": 12.1}
    s.on_trial_complete(None, _trial("d"), {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 5.0})
    assert s.cap_s == pytest.approx(6.0)  # a better incumbent tightens the cap


def test_disabled_capping_keeps_score_but_never_stops() -> None:
    s = CappingScheduler(enabled=False)
    s.on_trial_result(None, _trial("a"), {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 1.0})
    assert (
        s.on_trial_result(None, _trial("b"), {keys.STATUS: "running", keys.TRAIN_S: 100.0})
        == TrialScheduler.CONTINUE
    )


def test_slack_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="slack must be >= 1"):
        CappingScheduler(slack=0.9)


def test_a_resumed_scheduler_times_running_trials_afresh() -> None:
    """Monotonic clocks differ between processes: a pickled start time would read as a hang."""
    import pickle

    s = CappingScheduler(hang_after_s=10.0)
    s._running_since["a"] = -1e9  # long ago, in another process
    restored = pickle.loads(pickle.dumps(s))
    assert restored._running_since == {} and restored.hang_after_s == 10.0


def test_capping_counts_training_time_not_evaluation() -> None:
    """The cap is on the objective's clock: a trial slow only because it evaluated goes on."""
    s = CappingScheduler(slack=1.2)
    s.on_trial_result(None, _trial("fast"), {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 10.0})
    evaluating = {keys.STATUS: "running", keys.ELAPSED_S: 30.0, keys.TRAIN_S: 11.0}
    assert s.on_trial_result(None, _trial("b"), evaluating) == TrialScheduler.CONTINUE
    assert s.capped == {}


class _Controller:
    def __init__(self, *trials: SimpleNamespace) -> None:
        self.trials = list(trials)
        self.stopped: list[str] = []

    def get_trials(self) -> list[SimpleNamespace]:
        return self.trials

    def stop_trial(self, trial: SimpleNamespace) -> None:
        self.stopped.append(trial.trial_id)
        trial.status = "TERMINATED"


def _running(name: str) -> SimpleNamespace:
    return SimpleNamespace(
        trial_id=name, status="RUNNING", last_result={}, run_metadata=SimpleNamespace()
    )


def test_a_trial_that_keeps_reporting_is_not_hung_however_long_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Evaluations are outside the time cap, so a healthy trial may outlive it; silence, not
    age, is what marks a trial as stuck in a step."""
    import raybatch.run.scheduler as scheduler

    now = [0.0]
    monkeypatch.setattr(scheduler.time, "monotonic", lambda: now[0])
    s = CappingScheduler(hang_after_s=10.0)
    talking, silent = _running("talking"), _running("silent")
    controller = _Controller(talking, silent)
    s.choose_trial_to_run(controller)  # both first seen at t=0
    for t in range(2, 30, 2):
        now[0] = float(t)
        s.on_trial_result(controller, talking, {keys.STATUS: "running", keys.TRAIN_S: t / 2})
        s.choose_trial_to_run(controller)
    assert controller.stopped == ["silent"]
    assert set(s.hung) == {"silent"}
    assert silent.run_metadata.last_result[keys.REASON].startswith("hung: no report for")
