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
    assert s.best_time_to_target_s == 1.0 and s.cap_s == pytest.approx(s.slack)  # the score
    assert (
        s.on_trial_result(None, _trial("b"), {keys.STATUS: "running", keys.TRAIN_S: 100.0})
        == TrialScheduler.CONTINUE
    )
    assert s.capped == {}  # 100x past the cap, and never stopped


def test_slack_below_one_is_refused_as_the_options_refuse_it() -> None:
    """The same class and words as ``SearchOptions(slack=0.9)``: an option, named."""
    from raybatch.errors import OptionError
    from raybatch.run.options import SearchOptions

    with pytest.raises(OptionError, match=r"<python>: slack: must be >= 1, got 0\.9"):
        CappingScheduler(slack=0.9)
    with pytest.raises(OptionError, match=r"level_slack: must be >= 1, got 0\.5"):
        CappingScheduler(level_slack=0.5)
    with pytest.raises(OptionError, match="slack"):
        SearchOptions(slack=0.9)


def test_a_resumed_scheduler_times_running_trials_afresh() -> None:
    """Monotonic clocks differ between processes: a pickled start time would read as a hang."""
    import pickle

    s = CappingScheduler(hang_after_s=10.0)
    assert s.guard is not None
    s.guard._since["a"] = -1e9  # long ago, in another process
    restored = pickle.loads(pickle.dumps(s))
    assert restored.guard is not None and restored.guard._since == {}
    assert restored.hang_after_s == restored.guard.after_s == 10.0


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
    import raybatch.run.hang as hang

    now = [0.0]
    monkeypatch.setattr(hang.time, "monotonic", lambda: now[0])
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


def _report(train_s: float, metric: float) -> dict[str, object]:
    return {keys.STATUS: "running", keys.TRAIN_S: train_s, keys.METRIC: metric}


def _incumbent(s: CappingScheduler) -> None:
    """A trial that reaches 0.9 at 10 s, through 0.2 at 0.5 s, 0.5 at 2 s and 0.8 at 6 s."""
    for t, m in ((0.5, 0.2), (2.0, 0.5), (6.0, 0.8)):
        s.on_trial_result(None, _trial("inc"), _report(t, m))
    s.on_trial_complete(None, _trial("inc"), {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 10.0,
                                              keys.TRAIN_S: 10.0, keys.METRIC: 0.9})  # fmt: skip


def test_a_trial_behind_the_incumbent_at_an_intermediate_level_is_stopped_early() -> None:
    """The incumbent had 0.5 at 2 s: a trial still below 0.5 at 3.4 s (> 1.5 x 2 s) cannot win,
    and is stopped long before the final cap (12 s) would stop it; one at 0.79 at 8.9 s is
    ahead of the 0.5 the incumbent had at 8.9 / 1.5 s... and behind its 0.8 at 6 s only
    from 9 s on."""
    s = CappingScheduler(slack=1.2, level_slack=1.5)
    _incumbent(s)
    # Before a third of the incumbent's 10 s, start-up noise rules: only 3x behind is stopped.
    assert s.on_trial_result(None, _trial("new"), _report(3.2, 0.25)) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("dead"), _report(1.6, 0.01)) == TrialScheduler.STOP
    assert s.on_trial_result(None, _trial("ok"), _report(8.9, 0.79)) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("slow"), _report(3.4, 0.4)) == TrialScheduler.STOP
    assert s.capped_at_level == {"dead": 1.6, "slow": 3.4}
    # Ahead of the incumbent's level at t / slack: goes on, however slowly it started.
    assert s.on_trial_result(None, _trial("ok"), _report(9.5, 0.81)) == TrialScheduler.CONTINUE


def test_without_level_slack_only_the_final_time_caps() -> None:
    s = CappingScheduler(slack=1.2, level_slack=None)
    _incumbent(s)
    assert s.on_trial_result(None, _trial("slow"), _report(11.0, 0.1)) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("slow"), _report(12.5, 0.1)) == TrialScheduler.STOP
    assert s.capped_at_level == {}


def test_level_capping_reads_a_loss_target_as_lower_is_better() -> None:
    s = CappingScheduler(level_slack=1.5, mode="min")
    for t, m in ((2.0, 1.0), (6.0, 0.6)):
        s.on_trial_result(None, _trial("inc"), _report(t, m))
    s.on_trial_complete(None, _trial("inc"), {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 8.0})
    assert s.on_trial_result(None, _trial("a"), _report(3.5, 0.9)) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("b"), _report(3.5, 1.2)) == TrialScheduler.STOP
    assert s.on_trial_result(None, _trial("c"), _report(2.5, 1.2)) == TrialScheduler.CONTINUE


def test_trials_started_together_are_capped_against_each_other_before_any_reaches() -> None:
    """No incumbent yet (the opening's first trials start together): a neighbour's time to
    target is unknown, so only a trial grossly behind it is stopped (3x, as before a third of
    an incumbent's time): 4.6 s into training, still below the 0.2 the neighbour had at 1 s
    (< 4.6 / 3); one behind by less than that goes on."""
    s = CappingScheduler(slack=1.2, level_slack=1.5)
    for t, m in ((1.0, 0.2), (2.0, 0.4), (3.0, 0.6), (4.0, 0.7)):
        assert s.on_trial_result(None, _trial("a"), _report(t, m)) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("close"), _report(4.0, 0.3)) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("b"), _report(4.6, 0.1)) == TrialScheduler.STOP
    assert s.capped_at_level == {"b": 4.6} and s.cap_s is None
    # The leader itself is never stopped by those behind it.
    assert s.on_trial_result(None, _trial("a"), _report(5.0, 0.75)) == TrialScheduler.CONTINUE


def test_on_an_emulated_packed_gpu_no_trial_is_capped_because_of_a_neighbour() -> None:
    """An emulated GPU whose step time grows with the number of trials packed on it: the same
    recipe takes 10 s alone, 20 s beside one neighbour, 30 s beside two. A lone trial reaches in
    10 s and becomes the incumbent; the packed trials, slowed by their neighbours past 1.2 x
    that, are never capped for it, and a packed time never becomes the incumbent either."""
    s = CappingScheduler(slack=1.2, level_slack=1.5)
    alone = {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 10.0, keys.TRAIN_S: 10.0}
    s.on_trial_result(None, _trial("alone"), alone)
    s.on_trial_complete(None, _trial("alone"), alone)
    for neighbours in (1, 2):
        slowdown = 1 + neighbours
        for t in range(1, 10 * slowdown):
            packed = {**_report(float(t), t / (10 * slowdown)), keys.GPU_SHARE: 0.5}
            decision = s.on_trial_result(None, _trial(f"packed{neighbours}"), packed)
            assert decision == TrialScheduler.CONTINUE
        done = {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 9.0, keys.GPU_SHARE: 0.5}
        s.on_trial_complete(None, _trial(f"packed{neighbours}"), done)
    assert s.capped == {} and s.best_time_to_target_s == 10.0
    # A lone trial is still capped against the lone incumbent.
    late = {keys.STATUS: "running", keys.TRAIN_S: 12.5, keys.METRIC: 0.5}
    assert s.on_trial_result(None, _trial("slow"), late) == TrialScheduler.STOP


def test_a_heartbeat_is_capped_at_the_final_level_but_not_judged_at_intermediate_ones() -> None:
    """A small batch's first evaluation may be far off: a heartbeat (training time, no new
    evaluation) that shows no level yet is not "behind" one; past slack x the incumbent's time
    to target it is stopped all the same."""
    s = CappingScheduler(slack=1.2, level_slack=1.5)
    _incumbent(s)
    beat = {keys.STATUS: "running", keys.TRAIN_S: 4.0, keys.METRIC: None, keys.HEARTBEAT: True}
    assert s.on_trial_result(None, _trial("small"), beat) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("small"), {**beat, keys.TRAIN_S: 12.5}) == (
        TrialScheduler.STOP
    )
    assert s.capped_at_level == {}
    # The same report as an evaluation with nothing shown is behind the incumbent's levels.
    evaluated = {**beat, keys.HEARTBEAT: False, keys.METRIC: 0.1}
    assert s.on_trial_result(None, _trial("other"), evaluated) == TrialScheduler.STOP


def test_the_hang_window_is_the_guards_one_and_none_without_it() -> None:
    """``hang_after_s`` reads the guard's window: no second copy to drift from it."""
    assert CappingScheduler().hang_after_s is None and CappingScheduler().hung == {}
    s = CappingScheduler(hang_after_s=12.0)
    assert s.guard is not None and s.hang_after_s == s.guard.after_s == 12.0
