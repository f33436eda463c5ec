"""Paused trials and their promotions (raybatch/tuning/promotion.py, through the capping scheduler
built as the driver builds it: ``for_time_cap`` with ``pause=True`` and its slots said)."""

from __future__ import annotations

from types import SimpleNamespace

from ray.tune.schedulers import TrialScheduler

from raybatch import keys
from raybatch.tuning.phases import _capped_reason
from raybatch.tuning.promotion import Promotions
from raybatch.tuning.rungs import RungRule
from raybatch.tuning.scheduler import CappingScheduler


def _scheduler(slots: int = 2) -> CappingScheduler:
    """As the driver builds it for a 27 s time cap: rungs at 1/3, 1, 3 and 9 s before any trial
    has reached the target."""
    s = CappingScheduler.for_time_cap(27.0, None, pause=True)
    s.slots = slots
    return s


def _trial(name: str) -> SimpleNamespace:
    return SimpleNamespace(trial_id=name)


def _report(s: CappingScheduler, name: str, train_s: float, metric: float,
            warming: bool | None = None) -> str:  # fmt: skip
    result = {keys.STATUS: "running", keys.TRAIN_S: train_s, keys.METRIC: metric,
              keys.WARMING_UP: warming}  # fmt: skip
    return str(s.on_trial_result(None, _trial(name), result))


def _reached(s: CappingScheduler) -> None:
    """A trial that reaches 0.9 at 9 s through 0.4 at 1 s and 0.7 at 3 s: rungs at 1, 3, 9 s."""
    for t, m in ((1.0, 0.4), (3.0, 0.7)):
        _report(s, "inc", t, m)
    reached = {keys.STATUS: "reached", keys.TRAIN_S: 9.0, keys.METRIC: 0.9,
               keys.TIME_TO_TARGET_S: 9.0}  # fmt: skip
    s.on_trial_result(None, _trial("inc"), reached)
    s.on_trial_complete(None, _trial("inc"), {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 9.0})


def test_a_trial_behind_at_a_rung_below_the_top_is_paused_not_stopped() -> None:
    s = _scheduler()
    _reached(s)
    assert s.rungs() == [1.0, 3.0, 9.0]
    assert _report(s, "slow", 1.0, 0.1) == TrialScheduler.PAUSE
    assert s.promotions.paused == {"slow": 1.0}
    assert "slow" not in s.capped  # a pause is not a verdict yet


def test_a_paused_trial_goes_on_before_new_trials_once_the_curves_since_put_it_in_the_top_third(
) -> None:  # fmt: skip
    s = _scheduler()
    _reached(s)
    _report(s, "slow", 1.0, 0.1)
    assert s.next_to_run(pending=True, running=0) == (None, False)  # 0.1 against 0.4: behind
    for name in ("w1", "w2", "w3"):  # three more trials, further behind at the same rung
        assert _report(s, name, 1.0, 0.05) == TrialScheduler.PAUSE
    assert s.next_to_run(pending=True, running=1) == ("slow", False)  # ahead of a new trial
    s.promotions.resumed("slow")
    assert "slow" not in s.promotions.paused
    # Not judged again at the rung it was promoted from (it may resume from a save before it).
    assert _report(s, "slow", 1.2, 0.12) == TrialScheduler.CONTINUE
    assert "slow" not in s.capped_at_rung  # running again: its pause is no reason any more


def test_a_trial_chosen_to_go_on_but_stopped_before_it_reports_ends_capped_at_its_rung() -> None:
    """Tune may stop a trial the scheduler chose to resume before it runs again (the search's
    end): its row still says the rung it was paused at, not the slack cap it never reached."""
    s = _scheduler()
    _reached(s)
    _report(s, "slow", 1.0, 0.1)
    s.promotions.resumed("slow")
    s.on_trial_remove(None, _trial("slow"))
    assert s.capped_at_rung == {"slow": 1.0}


def test_the_top_rung_stops_a_trial_behind_it_for_good() -> None:
    s = _scheduler()
    _reached(s)
    for t, m in ((1.0, 0.4), (3.0, 0.7)):
        assert _report(s, "late", t, m) == TrialScheduler.CONTINUE  # level with the best
    assert _report(s, "late", 9.0, 0.8) == TrialScheduler.STOP  # 0.8 where the best had 0.9
    assert s.capped == {"late": 9.0} and not s.promotions.paused


def test_before_a_reach_one_alone_at_a_rung_waits_and_the_furthest_goes_on_when_nothing_is_new(
) -> None:  # fmt: skip
    """Successive halving's rounds: the first trial at a rung waits for eta curves there while
    new trials can run; with none to run, the trial paused furthest goes on (a search with
    no reach yet never ends on paused trials)."""
    s = _scheduler(slots=2)
    assert s.rungs()[:2] == [1 / 3, 1.0]
    _report(s, "a", 0.2, 0.1)
    assert _report(s, "a", 0.4, 0.2) == TrialScheduler.PAUSE  # alone at the 1/3 s rung
    _report(s, "b", 0.2, 0.15)
    assert _report(s, "b", 0.4, 0.3) == TrialScheduler.PAUSE  # two of the three it waits for
    assert s.next_to_run(pending=True, running=0) == (None, False)  # a new trial first
    assert s.next_to_run(pending=False, running=2) == (None, False)  # no free slot
    assert s.next_to_run(pending=False, running=1) == ("b", False)  # the best at the rung
    # A third curve at the rung: the top third of three goes on, ahead of new trials.
    _report(s, "c", 0.2, 0.05)
    assert _report(s, "c", 0.4, 0.1) == TrialScheduler.PAUSE
    assert s.next_to_run(pending=True, running=0) == ("b", False)


def test_before_a_reach_a_trial_ahead_past_the_guess_of_b_yields_its_slot_once(
) -> None:  # fmt: skip
    """The guess of ``B`` (9 s for a 27 s cap) is the top of the rungs before a reach; from
    there to the time cap is a search's dearest stretch, so it is taken last: a trial ahead at
    every rung pauses once past it, new trials go first (even one behind it), and it goes on as
    the leader only when none waits, not paused there again. Once a trial has reached, the
    pause is judged at its rung like any other: behind the one that reached, it is stopped."""
    for reach in (False, True):
        s = _scheduler(slots=1)
        _report(s, "a", 0.2, 0.1)
        assert _report(s, "a", 0.4, 0.2) == TrialScheduler.PAUSE  # alone at the 1/3 s rung
        assert s.next_to_run(pending=False, running=0) == ("a", False)  # the leader
        s.promotions.resumed("a")
        for t, m in ((1.2, 0.4), (3.5, 0.6)):
            assert _report(s, "a", t, m) == TrialScheduler.CONTINUE
        assert _report(s, "a", 9.5, 0.8) == TrialScheduler.PAUSE
        assert s.promotions.paused == {"a": 9.0} and s.capped_at_rung == {"a": 9.0}
        assert s.next_to_run(pending=True, running=0) == (None, False)  # the new trials first
        if reach:
            _reached(s)  # 0.9 at 9 s, where "a" had 0.8
            assert s.next_to_run(pending=False, running=0) == (None, True)
            s.on_trial_remove(None, _trial("a"))  # Tune's stop_trial: capped, and says why
            reason = _capped_reason({keys.TRIAL_ID: "a", keys.TRAIN_S: 9.5}, s)
            assert "to go on last, and not taken on" in reason
            continue
        _report(s, "b", 0.2, 0.05)
        assert _report(s, "b", 9.5, 0.7) == TrialScheduler.PAUSE  # behind "a" from 1/3 s on
        # Ahead of "b" at 9 s, "a" is still not promoted before the new trials.
        assert s.next_to_run(pending=True, running=0) == (None, False)
        assert s.next_to_run(pending=False, running=0) == ("a", False)
        s.promotions.resumed("a")
        assert _report(s, "a", 12.0, 0.85) == TrialScheduler.CONTINUE
    plain = CappingScheduler.for_time_cap(27.0, None)  # no pauses (the plugin's default)
    unruled = CappingScheduler.for_time_cap(
        27.0, None, pause=True, rungs=RungRule(zone=None)
    )  # no rungs
    for t, m in ((0.2, 0.1), (0.4, 0.2), (1.2, 0.4), (3.5, 0.6), (9.5, 0.8)):
        assert _report(plain, "a", t, m) == TrialScheduler.CONTINUE
        assert _report(unruled, "a", t, m) == TrialScheduler.CONTINUE


def test_a_trial_paused_at_the_guess_of_b_does_not_yield_again_once_it_goes_on() -> None:
    """First to the guess's rung, a trial waits there for others (successive halving's
    rounds); gone on from there as the leader, it has given its slot once: no second pause."""
    s = _scheduler(slots=1)
    for peer in ("w1", "w2"):  # two peers at the rungs below the guess's, behind
        for t, m in ((0.2, 0.05), (3.5, 0.3)):
            _report(s, peer, t, m)
    _report(s, "a", 0.2, 0.1)
    assert _report(s, "a", 9.2, 0.8) == TrialScheduler.PAUSE  # alone at the 9 s rung: waits
    assert s.promotions.paused["a"] == 9.0 and "a" not in s.promotions.yielded
    assert s.next_to_run(pending=False, running=0) == ("a", False)
    s.promotions.resumed("a")
    assert _report(s, "a", 10.0, 0.82) == TrialScheduler.CONTINUE


def test_paused_trials_are_ranked_at_the_rung_they_were_paused_at_not_at_their_last_level(
) -> None:  # fmt: skip
    """x trained on to 0.9 s before the 1/3 s rung judged it, and shows 0.6 there; y, paused
    at 0.4 s with 0.3, was ahead at 1/3 s (0.28 against 0.2): with nothing new to run, y goes
    on. Ranked by the level each got to, the one that trained longest went on whatever it
    showed at equal time."""
    s = _scheduler(slots=1)
    assert _report(s, "x", 0.2, 0.1) == TrialScheduler.CONTINUE
    assert _report(s, "x", 0.9, 0.6) == TrialScheduler.PAUSE
    assert _report(s, "y", 0.2, 0.25) == TrialScheduler.CONTINUE
    assert _report(s, "y", 0.4, 0.3) == TrialScheduler.PAUSE
    assert s.next_to_run(pending=False, running=0) == ("y", False)


def test_the_leader_that_goes_on_with_nothing_new_to_run_does_not_wait_at_its_next_rungs(
) -> None:  # fmt: skip
    """Before a reach, a trial alone at a rung waits there for others; the furthest paused
    trial that goes on because nothing new will come (the searcher waits for a reach) is not
    paused again at each rung it is first to: it trains on until a curve beats it."""
    s = _scheduler(slots=1)
    _report(s, "a", 0.2, 0.1)
    assert _report(s, "a", 0.4, 0.2) == TrialScheduler.PAUSE  # alone at the 1/3 s rung
    assert s.next_to_run(pending=False, running=0) == ("a", False)
    s.promotions.resumed("a")
    for t, m in ((1.2, 0.4), (3.5, 0.6)):  # first past the 1 s and 3 s rungs, alone
        assert _report(s, "a", t, m) == TrialScheduler.CONTINUE
    s.on_trial_complete(None, _trial("a"), {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 5.0})
    assert not s.promotions.leads("a")


def test_paused_trials_no_rung_passes_are_stopped_once_nothing_runs_and_end_capped_at_their_rung(
) -> None:  # fmt: skip
    s = _scheduler()
    _reached(s)
    _report(s, "slow", 1.0, 0.1)
    assert s.next_to_run(pending=False, running=1) == (None, False)  # another may still pass it
    assert s.next_to_run(pending=False, running=0) == (None, True)  # nothing will
    s.on_trial_remove(None, _trial("slow"))  # Tune's stop_trial of a paused trial
    assert s.capped == {"slow": 1.0} and s.capped_at_rung == {"slow": 1.0}
    assert not s.promotions.paused


def test_a_trial_paused_once_b_is_measured_goes_on_only_when_its_rung_passes_it() -> None:
    """Within the hedged zone at the 1 s rung (0.3 against the best's 0.4) but behind: paused
    once ``B`` was measured, it is not taken back when no new trial waits (the search's last
    trial asked, every pause would be); the same pause at a rung tied to the guess is."""
    s = _scheduler()
    _reached(s)
    assert _report(s, "close", 1.0, 0.3) == TrialScheduler.PAUSE
    assert s.next_to_run(pending=False, running=1) == (None, False)
    assert s.next_to_run(pending=False, running=0) == (None, True)
    guess = _scheduler()
    for name, m in (("a", 0.3), ("b", 0.28), ("c", 0.27)):
        _report(guess, name, 0.4, m)  # the 1/3 s rung: b and c behind a, c within the zone
    guess.promotions.resumed("a")
    assert "c" in guess.promotions.guessed
    assert guess.next_to_run(pending=False, running=1)[0] in ("b", "c")


def _leaders_and_pauses(s: CappingScheduler) -> None:
    """Before a reach: two leaders (l1, l2) go on alone from the 1/3 s rung to 3.5 s; y, level
    with them to 1 s, is paused behind them at the 3 s rung, within its hedged zone (0.63 at
    3 s, where they had 0.61 at 3 s / 1.45); x is paused behind at the 1 s rung, within its
    zone too (0.29, where the best had 0.23 at 1 s / 1.9). Both pauses are tied to the guess."""
    for leader in ("l1", "l2"):
        _report(s, leader, 0.2, 0.1)
        assert _report(s, leader, 0.5, 0.11) == TrialScheduler.PAUSE  # first at 1/3 s: waits
        assert s.next_to_run(pending=False, running=0) == (leader, False)  # goes on, leading
        s.promotions.resumed(leader)
        for t, m in ((1.2, 0.5), (3.5, 0.8)):
            assert _report(s, leader, t, m) == TrialScheduler.CONTINUE
    _report(s, "y", 0.2, 0.1)
    assert _report(s, "y", 1.1, 0.45) == TrialScheduler.CONTINUE  # the best at 1/3 s and 1 s
    assert _report(s, "y", 3.2, 0.65) == TrialScheduler.PAUSE
    _report(s, "x", 0.2, 0.1)
    assert _report(s, "x", 1.1, 0.31) == TrialScheduler.PAUSE
    assert s.promotions.paused == {"y": 3.0, "x": 1.0}
    assert {"x", "y"} <= s.promotions.guessed


def test_before_a_reach_the_hedge_takes_back_a_cheap_pause_not_one_at_the_guess_top_rungs(
) -> None:  # fmt: skip
    """With nothing new to run, the hedge takes back a pause within its zone; from the guess's
    two top rungs on (3 and 9 s for a 27 s cap) a trial goes on as the leader only, once no
    cheaper pause is within its zone: the cheap pause is taken back before the dear one that
    got further (the furthest went first)."""
    s = _scheduler()
    _leaders_and_pauses(s)
    assert s.next_to_run(pending=True, running=0) == (None, False)  # new trials first
    assert s.next_to_run(pending=False, running=1) == ("x", False)  # not y, though further
    s.promotions.resumed("x")
    assert not s.promotions.leads("x")
    assert s.next_to_run(pending=False, running=1) == ("y", False)  # as the leader
    assert s.promotions.leads("y")


def test_a_trial_paused_in_its_warmup_goes_on_once_no_new_trial_waits() -> None:
    """Judged in its LR warmup (its curve there says how long its ramp is, not how fast it
    trains), a pause is taken back once the search has started every new trial."""
    s = _scheduler()
    _reached(s)
    assert _report(s, "warm", 1.0, 0.05, warming=True) == TrialScheduler.PAUSE
    assert s.next_to_run(pending=True, running=0) == (None, False)
    assert s.next_to_run(pending=False, running=0) == ("warm", False)


def test_a_trial_paused_below_every_rung_a_reach_set_is_judged_at_the_lowest() -> None:
    """Before the first reach the rungs are tied to a guess and go lower; a pause at such a
    rung is taken back to be judged where the rungs are once the optimum's time is known."""
    s = _scheduler()
    for name, m in (("a", 0.3), ("b", 0.2), ("c", 0.1)):
        _report(s, name, 0.2, m / 2)
        _report(s, name, 0.4, m)  # the 1/3 s rung: c is behind the two before it
    assert s.next_to_run(pending=True, running=0) == ("a", False)  # the top third: a
    s.promotions.resumed("a")
    s.promotions.resumed("b")  # went on, say, when nothing was new
    assert s.next_to_run(pending=True, running=0) == (None, False)  # c: behind at its rung
    _reached(s)  # rungs now 1, 3, 9 s
    assert s.next_to_run(pending=True, running=0) == (None, False)  # new trials first
    assert s.next_to_run(pending=False, running=1) == ("c", False)


def test_the_choice_promotes_first_then_runs_new_trials_then_hedges_then_deepens() -> None:
    p = Promotions()
    p.pause("x", 1.0, guessed=True)
    p.pause("y", 3.0, guessed=True)
    never, always = (lambda _t: False), (lambda _t: True)
    level = {"x": 0.5, "y": 0.2}.get
    assert p.choose(always, never, level, pending=True, running=2, reached=True) == ("y", False)
    assert p.choose(never, always, level, pending=True, running=0, reached=True) == (None, False)
    assert p.choose(never, always, level, pending=False, running=0, reached=True) == ("y", False)
    assert p.choose(never, never, level, pending=False, running=0, reached=False) == ("y", False)
    assert p.choose(never, never, level, False, running=1, reached=False, slots=1) == (None, False)
    assert p.choose(never, never, level, pending=False, running=0, reached=True) == (None, True)
    p.resumed("y")
    assert p.exempt_up_to("y") == 3.0 and p.exempt_up_to("x") == -1.0


def test_a_paused_trial_tune_restores_after_a_restart_goes_on_and_its_searcher_is_told() -> None:
    """Tune restores a paused trial as pending after the driver restarts (its saved state):
    the scheduler, unpickled with the run, takes its first report as the trial going on (not
    judged again at the rung it was paused at) and tells the searcher, as Ray's hooks do."""
    import pickle

    s = _scheduler()
    _reached(s)
    _report(s, "slow", 1.0, 0.1)
    restored: CappingScheduler = pickle.loads(pickle.dumps(s))
    assert restored.promotions.paused == {"slow": 1.0}
    told: list[tuple[str, str]] = []
    searcher = SimpleNamespace(on_unpause=lambda t: told.append(("on_unpause", t)))
    controller = SimpleNamespace(search_alg=SimpleNamespace(searcher=searcher))
    result = {keys.STATUS: "running", keys.TRAIN_S: 1.1, keys.METRIC: 0.12}
    assert restored.on_trial_result(controller, _trial("slow"), result) == TrialScheduler.CONTINUE
    assert not restored.promotions.paused and told == [("on_unpause", "slow")]
