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
        s.on_trial_result(None, _trial("a"), {keys.STATUS: "running", keys.ELAPSED_S: 1e6})
        == TrialScheduler.CONTINUE
    )
    assert s.cap_s is None


def test_trials_past_slack_times_the_incumbent_are_stopped() -> None:
    s = CappingScheduler(slack=1.2)
    s.on_trial_result(None, _trial("fast"), {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 10.0})
    assert s.cap_s == pytest.approx(12.0)
    ok = {keys.STATUS: "running", keys.ELAPSED_S: 11.9}
    slow = {keys.STATUS: "running", keys.ELAPSED_S: 12.1}
    assert s.on_trial_result(None, _trial("b"), ok) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("c"), slow) == TrialScheduler.STOP
    assert s.capped == {"c": 12.1}
    s.on_trial_complete(None, _trial("d"), {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 5.0})
    assert s.cap_s == pytest.approx(6.0)  # a better incumbent tightens the cap


def test_disabled_capping_keeps_score_but_never_stops() -> None:
    s = CappingScheduler(enabled=False)
    s.on_trial_result(None, _trial("a"), {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 1.0})
    assert (
        s.on_trial_result(None, _trial("b"), {keys.STATUS: "running", keys.ELAPSED_S: 100.0})
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
