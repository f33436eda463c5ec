"""Adaptive capping, driven directly."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from ray.tune.schedulers import TrialScheduler

from raybatch import keys
from raybatch.tuning.rungs import RungRule
from raybatch.tuning.scheduler import CappingScheduler


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
    from raybatch.tuning.options import SearchOptions

    with pytest.raises(OptionError, match=r"<python>: slack: must be >= 1, got 0\.9"):
        CappingScheduler(slack=0.9)
    with pytest.raises(OptionError, match=r"zone: must be >= 0 or None, got -0\.5"):
        CappingScheduler(rungs=RungRule(zone=-0.5))
    with pytest.raises(OptionError, match=r"mode: must be 'max' or 'min', got 'up'"):
        CappingScheduler(mode="up")
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
    assert restored.guard.after_s == 10.0


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
    import raybatch.tuning.hang as hang

    now = [0.0]
    monkeypatch.setattr(hang.time, "monotonic", lambda: now[0])
    s = CappingScheduler(hang_after_s=10.0)
    talking, silent = _running("talking"), _running("silent")
    silent.last_result = {keys.STATUS: "running", keys.TRAIN_S: 0.5}  # reported once, then not
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


def _curve(s: CappingScheduler, name: str, points: tuple[tuple[float, float], ...]) -> None:
    """Trial ``name`` reports its evaluations, ``(training seconds, metric)`` in order."""
    for t, m in points:
        s.on_trial_result(None, _trial(name), _report(t, m))


def _incumbent(s: CappingScheduler) -> None:
    """A trial that reaches 0.9 at 9 s, through 0.1 at 0.25 s, 0.4 at 1 s and 0.7 at 3 s: the
    rungs are then at 1, 3 and 9 s."""
    _curve(s, "inc", ((0.25, 0.1), (1.0, 0.4), (3.0, 0.7)))
    s.on_trial_complete(None, _trial("inc"), {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 9.0,
                                              keys.TRAIN_S: 9.0, keys.METRIC: 0.9})  # fmt: skip


def test_the_rungs_are_tied_to_the_fastest_time_to_target() -> None:
    s = CappingScheduler(rungs=RungRule(horizon_s=30.0))
    # The guess, before: one rung further down (it is only a bound).
    assert s.rungs() == pytest.approx([30 / 27, 30 / 9, 30 / 3, 30.0])
    _incumbent(s)  # B = 9 s: the two grid points at or below 9 / sqrt(3), then B
    assert s.rungs() == pytest.approx([30 / 27, 30 / 9, 9.0])
    assert CappingScheduler(rungs=RungRule(zone=None, horizon_s=30.0)).rungs() == []
    assert CappingScheduler().rungs() == []  # no guess and no reach: nothing to tie them to


def test_the_rungs_stay_on_their_grid_while_the_fastest_time_moves() -> None:
    """Only the top rung follows B: the ones below sit on the grid the guess started, so a
    rung a trial was judged at before a reach is where it stays."""
    s = CappingScheduler(rungs=RungRule(horizon_s=30.0))
    grids = ((9.0, [30 / 27, 30 / 9]), (7.0, [30 / 27, 30 / 9]), (4.0, [30 / 81, 30 / 27]))
    for best, below in grids:
        s.judge.record(best)
        assert s.rungs() == pytest.approx([*below, best])


def test_every_rung_below_the_top_is_one_of_the_trials_own_time_marks() -> None:
    """The grid is the time cap's (``for_time_cap``), and every trial evaluates at the cap's
    time marks: a rung below B is judged at an evaluation on it, not at the first one past
    (the launch names B, and the grid rungs under the cap's lowest mark where B is that
    small: ``Launches.rung_marks``)."""
    from raybatch.trial.cadence import time_marks

    marks = time_marks(15.0)
    for best in (1.3, 2.23, 5.8, 12.0):
        s = CappingScheduler.for_time_cap(15.0)
        s.judge.record(best)
        for rung in s.rungs()[:-1]:
            assert any(math.isclose(rung, m, rel_tol=1e-9) for m in marks), (best, rung)


def test_before_a_reach_a_curve_far_ahead_of_the_guess_adds_the_grid_rung_under_it() -> None:
    """A 27 s cap guesses rungs at 1/3 .. 9 s; a curve half way to 0.9 in 0.18 s of training
    extrapolates to about 0.4 s: the grid rung under it (1/9 s, the cap's lowest time mark)
    is added, the one under that (1/27 s, where no trial evaluates) is not."""
    s = CappingScheduler.for_time_cap(27.0, None, rungs=RungRule(target=0.9))
    assert s.rungs() == pytest.approx([1 / 3, 1.0, 3.0, 9.0])
    _curve(s, "d", ((0.12, 0.1), (0.3, 0.6)))
    assert s.rungs() == pytest.approx([1 / 9, 1 / 3, 1.0, 3.0, 9.0])
    blind = CappingScheduler.for_time_cap(27.0, None)  # no target told: the guess alone
    _curve(blind, "d", ((0.12, 0.1), (0.3, 0.6)))
    assert blind.rungs() == pytest.approx([1 / 3, 1.0, 3.0, 9.0])


def test_a_rung_added_below_does_not_judge_a_trial_already_judged_at_a_later_one() -> None:
    """Trial a passed the 1/3 s rung beside b and c; it was behind them at 1/9 s, a rung that
    did not exist then. Once a fast curve adds it, a is not judged there after the fact (a
    near-optimal recipe with a large LR was so paused at 129 s for 20 s it had trained)."""
    s = CappingScheduler.for_time_cap(27.0, None, rungs=RungRule(target=0.9, hedge=0.0))
    for name, first in (("b", 0.3), ("c", 0.3), ("a", 0.28)):
        _curve(s, name, ((0.1, first), (0.4, 0.31 if name == "a" else 0.3)))
    assert "a" not in s.capped_at_rung
    _curve(s, "d", ((0.12, 0.1), (0.3, 0.6)))
    assert s.rungs()[0] == pytest.approx(1 / 9)
    assert s.on_trial_result(None, _trial("a"), _report(0.6, 0.32)) == TrialScheduler.CONTINUE


def test_a_trial_outside_the_zone_and_below_the_top_third_is_stopped_at_a_rung() -> None:
    """At the 1 s rung the incumbent had 0.4, and 0.36 at 1/1.1 s: a trial showing 0.2 there is
    more than 10 % slower to its level and ranks below the top third: stopped at that rung,
    long before the final cap (10.8 s) would have stopped it."""
    s = CappingScheduler(slack=1.2, rungs=RungRule(zone=0.1, hedge=0.0))
    _incumbent(s)
    assert s.on_trial_result(None, _trial("slow"), _report(1.2, 0.2)) == TrialScheduler.STOP
    assert s.capped_at_rung == {"slow": 1.0} and s.capped == {"slow": 1.2}


def test_a_trial_within_the_zone_goes_on_whatever_its_rank() -> None:
    """0.38 at the 1 s rung: below the incumbent's 0.4 (last of two), but above the 0.36 the
    incumbent had at 1/1.1 s: within 10 %, so it goes on (the hedge against early ranks)."""
    s = CappingScheduler(slack=1.2, rungs=RungRule(zone=0.1, hedge=0.0))
    _incumbent(s)
    assert s.on_trial_result(None, _trial("close"), _report(1.05, 0.38)) == TrialScheduler.CONTINUE
    # The same trial with no zone at all is judged by its rank alone: stopped.
    strict = CappingScheduler(slack=1.2, rungs=RungRule(zone=0.0, hedge=0.0))
    _incumbent(strict)
    assert strict.on_trial_result(None, _trial("close"), _report(1.05, 0.38)) == (
        TrialScheduler.STOP
    )


def test_a_trial_in_the_top_third_goes_on_outside_the_zone() -> None:
    """ASHA's rule: 0.45 at 1 s is more than 10 % behind the best curve (0.464 at 1/1.1 s),
    but in the top third of the four trials that got to the rung (0.1, 0.3, 0.45, 0.5)."""
    s = CappingScheduler(rungs=RungRule(zone=0.1, hedge=0.0, horizon_s=9.0))
    for name, value in (("x", 0.5), ("y", 0.3), ("z", 0.1)):
        s.on_trial_result(None, _trial(name), _report(0.5, 0.6 * value))
        s.on_trial_result(None, _trial(name), _report(1.0, value))
    assert s.on_trial_result(None, _trial("w"), _report(1.0, 0.45)) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("v"), _report(1.0, 0.2)) == TrialScheduler.STOP


def test_at_b_itself_only_the_zone_passes_a_trial_not_the_top_third() -> None:
    """At ``B`` the incumbent has reached (0.9 at 9 s, 0.87 at 9 s / 1.1); a trial not there
    yet can only tie it. 0.8 is outside the zone, though in the top third of the curves at
    9 s (three others that did not reach, 0.5-0.6): stopped at the rung, not run on to
    slack x B. Within the zone (0.88), it goes on."""
    s = CappingScheduler(slack=1.2, rungs=RungRule(zone=0.1, hedge=0.0))
    _curve(s, "inc", ((0.25, 0.1), (1.0, 0.4), (3.0, 0.7)))
    reached = {keys.STATUS: "reached", keys.TRAIN_S: 9.0, keys.METRIC: 0.9,
               keys.TIME_TO_TARGET_S: 9.0}  # fmt: skip
    s.on_trial_result(None, _trial("inc"), reached)
    assert s.rungs() == pytest.approx([1.0, 3.0, 9.0])
    for name, at_b in (("p1", 0.6), ("p2", 0.55), ("p3", 0.5)):
        _curve(s, name, ((0.25, 0.1), (1.0, 0.4), (3.0, 0.7), (9.0, at_b)))
    level = ((0.25, 0.1), (1.0, 0.4), (3.0, 0.7))
    _curve(s, "top_third", level)
    assert s.on_trial_result(None, _trial("top_third"), _report(9.0, 0.8)) == TrialScheduler.STOP
    assert s.capped_at_rung["top_third"] == 9.0
    _curve(s, "close", level)
    verdict = s.on_trial_result(None, _trial("close"), _report(9.0, 0.88))
    assert verdict == TrialScheduler.CONTINUE


def test_the_zone_is_wider_at_earlier_rungs_so_a_slow_starter_goes_on() -> None:
    """A large-LR recipe starts slowly and catches up: at the 1 s rung (B/9) it shows 0.25, the
    level the incumbent had at about 0.6 s (0.1 at 0.25 s, 0.4 at 1 s): 1.7x slower to it,
    inside the hedged zone there (1.1 x 3^0.5 = 1.9x), so it goes on; without the hedge (1.1x
    at every rung) the same curve is stopped there."""
    from raybatch.tuning.rungs import hedged_zone

    assert hedged_zone(0.1, 3.0, 2, 0.25) == pytest.approx(1.1 * 3**0.5 - 1)
    assert hedged_zone(0.1, 3.0, 0, 0.25) == pytest.approx(0.1)
    hedged, flat = (
        CappingScheduler(rungs=RungRule(zone=0.1, hedge=0.25)),
        CappingScheduler(rungs=RungRule(zone=0.1, hedge=0.0)),
    )
    for s in (hedged, flat):
        _incumbent(s)
    slow = _report(1.05, 0.25)
    assert hedged.on_trial_result(None, _trial("slow"), slow) == TrialScheduler.CONTINUE
    assert flat.on_trial_result(None, _trial("slow"), slow) == TrialScheduler.STOP


def _neighbour(s: CappingScheduler) -> None:
    """A trial running beside, not yet at the target: 0.1 at 0.25 s, 0.4 at 1 s, 0.55 at 2 s
    and 0.7 at 3 s (no trial has reached: the rungs are the guess's)."""
    _curve(s, "beside", ((0.25, 0.1), (1.0, 0.4), (2.0, 0.55), (3.0, 0.7)))


def test_a_rung_reached_in_warmup_is_judged_at_the_first_evaluation_past_it() -> None:
    """Before any trial has reached, a larger batch's LR ramp is not judged: mid-warmup its
    curve shows the ramp, not the recipe (a real search stopped nine of twelve trials at chance
    accuracy, most mid-warmup). The same slow curve (0.2 at 1.2 s, 0.25 at 2 s) beside the same
    neighbour, once saying nothing of a warmup and once still warming up at 1.2 s: the first is
    stopped at the 1 s rung; the second is not judged there, but at 2 s, its first evaluation
    past the warmup, against the neighbour's curve at 2 s (0.55): 0.25 is far behind."""
    warm = CappingScheduler(rungs=RungRule(zone=0.1, hedge=0.0, horizon_s=9.0))
    warming = CappingScheduler(rungs=RungRule(zone=0.1, hedge=0.0, horizon_s=9.0))
    for s in (warm, warming):
        _neighbour(s)
    assert warm.on_trial_result(None, _trial("t"), _report(1.2, 0.2)) == TrialScheduler.STOP
    curve = [(1.2, 0.2, True, TrialScheduler.CONTINUE), (2.0, 0.25, False, TrialScheduler.STOP)]
    for t, value, flag, verdict in curve:
        said = {**_report(t, value), keys.WARMING_UP: flag}
        assert warming.on_trial_result(None, _trial("t"), said) == verdict, t
    assert warming.capped_at_rung == {"t": 2.0} and warm.capped_at_rung == {"t": 1.0}


def test_a_trial_within_the_zone_past_its_warmup_goes_on_and_is_not_judged_there_again(
) -> None:  # fmt: skip
    """Past its warmup at 2 s with 0.53 (its neighbour had 0.55 at 2 s, 0.52 at 2/1.1 s):
    within the zone, it goes on. A far faster trial then runs beside (0.95 at 2 s): judged
    again at 2 s, 0.53 would be stopped; its next evaluation (2.5 s, before the 3 s rung) is
    not, and it goes on."""
    s = CappingScheduler(rungs=RungRule(zone=0.1, hedge=0.0, horizon_s=9.0))
    _neighbour(s)
    for t, value, flag in ((1.2, 0.2, True), (2.0, 0.53, False)):
        said = {**_report(t, value), keys.WARMING_UP: flag}
        assert s.on_trial_result(None, _trial("t"), said) == TrialScheduler.CONTINUE, t
    _curve(s, "fast", ((1.0, 0.8), (2.0, 0.95), (2.6, 0.97)))
    said = {**_report(2.5, 0.6), keys.WARMING_UP: False}
    assert s.on_trial_result(None, _trial("t"), said) == TrialScheduler.CONTINUE
    assert "t" not in s.capped_at_rung and s.judge.warm_judged == {"t"}


def test_a_trial_still_warming_up_when_the_first_trial_reaches_is_judged_at_every_rung(
) -> None:  # fmt: skip
    """Spared at the guess's rungs while warming up (0.05 at 1.2 s, beside a neighbour), a
    trial is judged at the new 1 s rung once a trial reaches the target in 9 s: still warming
    at 1.5 s with 0.06, where the others had 0.4 at 1 s, it is stopped there."""
    s = CappingScheduler(rungs=RungRule(zone=0.1, hedge=0.0, horizon_s=9.0))
    _neighbour(s)
    said = {**_report(1.2, 0.05), keys.WARMING_UP: True}
    assert s.on_trial_result(None, _trial("t"), said) == TrialScheduler.CONTINUE
    _incumbent(s)
    said = {**_report(1.5, 0.06), keys.WARMING_UP: True}
    assert s.on_trial_result(None, _trial("t"), said) == TrialScheduler.STOP
    assert s.capped_at_rung == {"t": 1.0}


def test_a_trial_warm_before_the_first_reach_is_judged_there_once_not_on_its_ramp() -> None:
    """Its warmup over at 2 s (0.56) where no other curve had got that far (its neighbour's
    ends at 1 s), a trial's judgment past the warmup is still owed when a trial reaches the
    target in 9 s: at 2.5 s (0.66) it is judged at 2 s against the incumbent's 0.55 there and
    goes on; the 1 s rung, inside its warmup, does not judge it on its ramp's 0.05."""
    s = CappingScheduler(rungs=RungRule(zone=0.1, hedge=0.0, horizon_s=9.0))
    _curve(s, "beside", ((0.25, 0.1), (1.0, 0.4)))
    for t, value, flag in ((1.2, 0.05, True), (2.0, 0.56, False)):
        said = {**_report(t, value), keys.WARMING_UP: flag}
        assert s.on_trial_result(None, _trial("t"), said) == TrialScheduler.CONTINUE, t
    assert s.judge.warm_judged == set()  # nothing to judge it against at 2 s yet
    _incumbent(s)
    said = {**_report(2.5, 0.66), keys.WARMING_UP: False}
    assert s.on_trial_result(None, _trial("t"), said) == TrialScheduler.CONTINUE
    assert "t" not in s.capped_at_rung and s.judge.warm_judged == {"t"}


def test_a_trial_judged_past_its_warmup_before_the_first_reach_is_not_judged_on_its_ramp_after(
) -> None:  # fmt: skip
    """Judged once past its warmup at 2 s (0.56, its neighbour 0.55) before any trial reached,
    a trial is ahead of the incumbent that then reaches in 9 s (0.55 at 2 s, 0.625 at 2.5 s):
    at 2.5 s with 0.66 it goes on. The 1 s rung, inside the warmup its judgment covered, does
    not judge it on its ramp's 0.05."""
    s = CappingScheduler(rungs=RungRule(zone=0.1, hedge=0.0, horizon_s=9.0))
    _neighbour(s)
    for t, value, flag in ((1.2, 0.05, True), (2.0, 0.56, False)):
        said = {**_report(t, value), keys.WARMING_UP: flag}
        assert s.on_trial_result(None, _trial("t"), said) == TrialScheduler.CONTINUE, t
    _incumbent(s)
    said = {**_report(2.5, 0.66), keys.WARMING_UP: False}
    assert s.on_trial_result(None, _trial("t"), said) == TrialScheduler.CONTINUE
    assert "t" not in s.capped_at_rung


def test_before_any_reaches_a_recipe_that_diverges_after_a_long_warmup_is_stopped_there(
) -> None:  # fmt: skip
    """No incumbent (the guess 9 s: rungs at 1/9 .. 3 s), and a trial warming up until 4 s,
    past the highest rung, then at chance accuracy (its LR diverged once the ramp was over):
    judged at 4 s against its running neighbour (0.8 there), it is stopped, instead of running
    at chance to its time cap (a real search: two such trials ran their 15 s cap at 0.1)."""
    s = CappingScheduler(slack=1.2, rungs=RungRule(zone=0.1, horizon_s=9.0))
    _curve(s, "ahead", ((0.5, 0.3), (2.0, 0.6), (4.0, 0.8), (4.5, 0.82)))
    for t, value, flag, verdict in ((1.5, 0.1, True, TrialScheduler.CONTINUE),
                                    (3.5, 0.1, True, TrialScheduler.CONTINUE),
                                    (4.2, 0.1, False, TrialScheduler.STOP)):  # fmt: skip
        said = {**_report(t, value), keys.WARMING_UP: flag}
        assert s.on_trial_result(None, _trial("t"), said) == verdict, t
    assert s.capped_at_rung == {"t": 4.2} and s.cap_s is None


def test_once_a_trial_has_reached_every_rung_judges_a_trial_still_warming_up() -> None:
    """Once a trial has reached the target in 9 s, a trial whose warmup lasts past 1 s (a large
    batch at a large LR) is judged at the 1 s rung like any other: 0.05 there, where the
    incumbent had 0.4, stops it (spared there, such trials each held a third of the
    incumbent's training: a real tabular search stopped 7 of 12 at the B/3 rung). Before any
    trial has reached, no rung judges a trial in its warmup."""
    s = CappingScheduler(rungs=RungRule(zone=0.1, hedge=0.0))
    _incumbent(s)
    said = {**_report(1.2, 0.05), keys.WARMING_UP: True}
    assert s.on_trial_result(None, _trial("t"), said) == TrialScheduler.STOP
    assert s.capped_at_rung == {"t": 1.0}
    # The 3 s rung too: 0.38 at 1.2 s is within the zone at 1 s (the incumbent had 0.36 at
    # 1/1.1 s), then 0.3 at 3.3 s (its best so far 0.38), still warming, where the incumbent
    # had 0.7 at 3 s.
    for t, value, verdict in (
        (1.2, 0.38, TrialScheduler.CONTINUE),
        (3.3, 0.3, TrialScheduler.STOP),
    ):
        said = {**_report(t, value), keys.WARMING_UP: True}
        assert s.on_trial_result(None, _trial("u"), said) == verdict, t
    assert s.capped_at_rung["u"] == 3.0

    guessing = CappingScheduler(rungs=RungRule(zone=0.1, hedge=0.0, horizon_s=9.0))
    _curve(guessing, "ahead", ((0.25, 0.1), (1.0, 0.4), (3.0, 0.7)))
    for t, value in ((1.2, 0.05), (3.3, 0.3)):
        said = {**_report(t, value), keys.WARMING_UP: True}
        assert guessing.on_trial_result(None, _trial("t"), said) == TrialScheduler.CONTINUE
    assert guessing.capped_at_rung == {}


def test_a_lone_trial_goes_on_as_the_first_at_every_rung() -> None:
    """No other curve reached the rung: the first trial there always goes on (only its own
    time cap, or a later incumbent's, stops it)."""
    s = CappingScheduler(rungs=RungRule(zone=0.1, hedge=0.0, horizon_s=9.0))
    for t in (0.5, 1.5, 4.0, 8.5):
        assert s.on_trial_result(None, _trial("alone"), _report(t, 0.01)) == (
            TrialScheduler.CONTINUE
        )
    assert s.capped == {}


def test_trials_started_together_are_judged_against_each_other_before_any_reaches() -> None:
    """No incumbent yet (the opening's trials start together): the rungs are tied to the
    guess (9 s: rungs at 1/9, 1/3, 1, 3 s), and a trial is judged against its neighbour's curve
    at the same training time, from the neighbour's first evaluation on (0.4 s: nothing to
    compare with at the first two rungs); the leader is never stopped by those behind it."""
    s = CappingScheduler(slack=1.2, rungs=RungRule(zone=0.1, hedge=0.0, horizon_s=9.0))
    assert s.on_trial_result(None, _trial("a"), _report(0.4, 0.3)) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("a"), _report(1.2, 0.6)) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("b"), _report(1.2, 0.2)) == TrialScheduler.STOP
    assert s.capped_at_rung == {"b": pytest.approx(1.0)} and s.cap_s is None
    assert s.on_trial_result(None, _trial("a"), _report(3.5, 0.75)) == TrialScheduler.CONTINUE


def test_before_any_reaches_only_running_neighbours_judge_so_the_best_running_curve_goes_on(
) -> None:  # fmt: skip
    """Judged against every curve seen, ended ones included, each trial can fall behind one at
    some rung while early curves cross, and with no incumbent all of them were stopped (a
    real search: six trials, four at a time, none reached). Before any reaches, a trial is
    judged against the trials running beside it; after, against every curve seen."""
    s = CappingScheduler(slack=1.2, rungs=RungRule(zone=0.1, hedge=0.0, horizon_s=9.0))
    _curve(s, "gone", ((0.4, 0.3), (1.2, 0.6)))
    s.on_trial_complete(None, _trial("gone"), {keys.STATUS: "running", keys.TRAIN_S: 1.2})
    # Far behind the ended curve at the 1 s rung, but nothing running is ahead: it goes on.
    assert s.on_trial_result(None, _trial("b"), _report(1.2, 0.2)) == TrialScheduler.CONTINUE
    assert s.capped_at_rung == {}
    _incumbent(s)  # once a trial has reached, every curve seen judges
    assert s.on_trial_result(None, _trial("c"), _report(1.2, 0.2)) == TrialScheduler.STOP


def test_before_any_reaches_a_lone_trial_is_judged_against_a_curve_that_ran_its_whole_cap(
) -> None:  # fmt: skip
    """One slot (one GPU): nothing runs beside a trial. A curve that ran to its own time cap
    short of the target judges it: behind a recipe that could not reach, it cannot either (a
    real search ran six of twelve trials to their cap). One stopped at a rung does not."""
    s = CappingScheduler(slack=1.2, rungs=RungRule(zone=0.1, hedge=0.0, horizon_s=9.0))
    _curve(s, "ran_out", ((0.4, 0.3), (1.2, 0.6), (9.0, 0.85)))
    s.on_trial_complete(None, _trial("ran_out"), {keys.STATUS: "censored", keys.TRAIN_S: 9.0})
    assert s.on_trial_result(None, _trial("ahead"), _report(1.2, 0.62)) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("behind"), _report(1.2, 0.2)) == TrialScheduler.STOP
    assert s.capped_at_rung == {"behind": pytest.approx(1.0)}
    # The trial stopped there is no yardstick for the next: only a curve that ran its cap is.
    s.on_trial_complete(None, _trial("ahead"), {keys.STATUS: "running", keys.TRAIN_S: 1.2})
    s.on_trial_complete(None, _trial("behind"), {keys.STATUS: "capped", keys.TRAIN_S: 1.2})
    assert s.on_trial_result(None, _trial("next"), _report(1.2, 0.58)) == TrialScheduler.CONTINUE


def test_without_a_zone_only_the_final_time_caps() -> None:
    s = CappingScheduler(slack=1.2, rungs=RungRule(zone=None))
    _incumbent(s)
    assert s.on_trial_result(None, _trial("slow"), _report(10.0, 0.1)) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("slow"), _report(11.0, 0.1)) == TrialScheduler.STOP
    assert s.capped_at_rung == {}


def test_rungs_read_a_loss_target_as_lower_is_better() -> None:
    s = CappingScheduler(mode="min", rungs=RungRule(zone=0.1, hedge=0.0))
    _curve(s, "inc", ((1.0, 1.0), (3.0, 0.6)))
    s.on_trial_complete(None, _trial("inc"), {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 9.0})
    assert s.on_trial_result(None, _trial("a"), _report(3.2, 0.58)) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("b"), _report(3.2, 1.2)) == TrialScheduler.STOP


def test_a_faster_incumbent_moves_the_rungs_earlier() -> None:
    """A trial alone at the rungs of a 27 s guess goes on (nothing to compare with); once a
    9 s incumbent has reached, the rungs it had got to first are judged against that curve."""
    s = CappingScheduler(rungs=RungRule(zone=0.1, hedge=0.0, horizon_s=27.0))
    assert s.on_trial_result(None, _trial("late"), _report(3.5, 0.3)) == TrialScheduler.CONTINUE
    _incumbent(s)
    assert s.on_trial_result(None, _trial("late"), _report(3.6, 0.31)) == TrialScheduler.STOP
    assert s.capped_at_rung == {"late": 1.0}


def test_on_an_emulated_packed_gpu_no_trial_is_capped_because_of_a_neighbour() -> None:
    """An emulated GPU whose step time grows with the number of trials packed on it: the same
    recipe takes 10 s alone, 20 s beside one neighbour, 30 s beside two. A lone trial reaches in
    10 s and becomes the incumbent; the packed trials, slowed by their neighbours past 1.2 x
    that, are never capped for it, and a packed time never becomes the incumbent either."""
    s = CappingScheduler(slack=1.2)
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


def test_a_heartbeat_is_capped_at_the_final_time_but_not_judged_at_rungs() -> None:
    """A small batch's first evaluation may be far off: a heartbeat (training time, no new
    evaluation) that shows no level yet is not behind at a rung; past slack x the incumbent's
    time to target it is stopped all the same."""
    s = CappingScheduler(slack=1.2)
    _incumbent(s)
    beat = {keys.STATUS: "running", keys.TRAIN_S: 4.0, keys.METRIC: None, keys.HEARTBEAT: True}
    assert s.on_trial_result(None, _trial("small"), beat) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, _trial("small"), {**beat, keys.TRAIN_S: 11.0}) == (
        TrialScheduler.STOP
    )
    assert s.capped_at_rung == {}
    # The same report as an evaluation with next to nothing shown is behind at the rungs.
    evaluated = {**beat, keys.HEARTBEAT: False, keys.METRIC: 0.01}
    assert s.on_trial_result(None, _trial("other"), evaluated) == TrialScheduler.STOP


def test_a_hang_guard_is_there_only_with_a_window_and_holds_it() -> None:
    """``hang_after_s`` is the guard's window: no second copy to drift from it."""
    assert CappingScheduler().guard is None and CappingScheduler().hung == {}
    s = CappingScheduler(hang_after_s=12.0)
    assert s.guard is not None and s.guard.after_s == 12.0


def test_a_pickled_scheduler_resumes_with_its_curves_b_and_one_set_of_pauses() -> None:
    """Tune pickles the scheduler with the experiment: the restored one judges with the curves
    and ``B`` it had, and its judge reads the very pauses the scheduler keeps (not a copy)."""
    import pickle

    s = CappingScheduler(rungs=RungRule(zone=0.1, hedge=0.0, horizon_s=9.0))
    s.judge.record(2.0)
    assert s.on_trial_result(None, _trial("a"), _report(0.4, 0.3)) == TrialScheduler.CONTINUE
    restored = pickle.loads(pickle.dumps(s))
    assert restored.best_time_to_target_s == 2.0 and set(restored.judge.trajectories) == {"a"}
    assert restored.judge.promotions is restored.promotions
