"""The search, then its race, suggested to one Tuner (raybatch/tuning/phases.py): the race waits for
every search trial, runs on the same slots, is skipped where the search's runs decided it, and
resumes from its checkpoint where it stood. Built as the driver builds it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ray.tune.search import Searcher

import raybatch
from raybatch import keys
from raybatch.tuning.options import SearchOptions
from raybatch.tuning.phases import SearchThenRace

SPACE = raybatch.load_space("digits_cnn_sgd")


def _phases(tmp_path: Path, trials: int = 3, **kw: Any) -> SearchThenRace:
    """The driver's own plan and searcher, wrapped as the driver wraps them."""
    from raybatch.examples.digits import workload
    from raybatch.metric import resolve_target
    from raybatch.run.driver import _plan

    options = SearchOptions(trials=trials, prior=False, max_concurrent=2, **kw)
    target = resolve_target("accuracy>=0.9", workload.metrics)
    plan = _plan(tmp_path, workload, SPACE, target, options)
    return SearchThenRace.for_search(plan.searcher, options, plan.cuda, plan.in_flight)


@pytest.mark.usefixtures("ray_session")
def test_the_slots_said_run_and_raced_are_the_clusters_room_or_max_concurrent_under_it(
    tmp_path: Path,
) -> None:
    """One figure for the start line ("N at a time"), Tune's max_concurrent_trials and the
    race's slots: it said the cluster's room (2) under --max-concurrent 1 while Tune ran one."""
    from raybatch.examples.digits import workload
    from raybatch.metric import resolve_target
    from raybatch.run.driver import _plan

    target = resolve_target("accuracy>=0.9", workload.metrics)
    room = 3  # the test session's Ray: 3 CPUs, one a trial
    for asked, slots in ((1, 1), (None, room), (room + 5, room)):
        options = SearchOptions(trials=2, prior=False, max_concurrent=asked)
        plan = _plan(tmp_path / str(asked), workload, SPACE, target, options)
        assert plan.in_flight == slots
        race = SearchThenRace.for_search(plan.searcher, options, False, plan.in_flight)
        assert race.at_once == min(2, slots)  # a race meets two recipes at once at most


def _ended(phases: SearchThenRace, trial_id: str, time_s: float | None) -> None:
    """A run ends: reached in ``time_s`` of training, or capped before the target."""
    result = {keys.TRIAL_ID: trial_id, keys.STATUS: "reached" if time_s else "running",
              keys.TIME_TO_TARGET_S: time_s, keys.TRAIN_S: time_s or 0.5, keys.HELD_S: 1.0,
              keys.OBJECTIVE: time_s}  # fmt: skip
    phases.on_trial_complete(trial_id, result)


def _search(phases: SearchThenRace, times: list[float | None]) -> list[dict[str, Any]]:
    configs = []
    for i, _ in enumerate(times):
        config = phases.suggest(f"s{i}")
        assert isinstance(config, dict) and keys.CANDIDATE not in config
        configs.append(config)
    return configs


@pytest.mark.usefixtures("ray_session")
def test_the_race_waits_for_every_search_trial_then_runs_side_by_side_on_fresh_seeds(
    tmp_path: Path,
) -> None:
    phases = _phases(tmp_path, zone=100.0)  # every pair inside the zone: a race
    _search(phases, [1.0, 1.05, None])
    _ended(phases, "s0", 1.0)
    _ended(phases, "s1", 1.05)
    assert phases.suggest("r0") is None  # s2 still runs: the entrants are chosen from all
    _ended(phases, "s2", None)
    first, second = phases.suggest("r0"), phases.suggest("r1")
    assert isinstance(first, dict) and isinstance(second, dict)
    assert {first[keys.SEED], second[keys.SEED]} == {1} and {
        first[keys.CANDIDATE],
        second[keys.CANDIDATE],
    } == {0, 1}
    assert phases.suggest("r2") is None and not phases.decided()
    _ended(phases, "r0", 1.1)
    _ended(phases, "r1", 1.0)
    assert phases.suggest("r2") == Searcher.FINISHED and phases.decided()
    assert [r.phase for r in phases.race_rows] == [keys.PHASE_CONFIRMATION] * 2


@pytest.mark.usefixtures("ray_session")
def test_a_lead_beyond_the_zone_in_the_search_runs_no_race_and_says_so(tmp_path: Path) -> None:
    phases = _phases(tmp_path)
    _search(phases, [1.0, 1.5, None])
    for trial_id, time_s in (("s0", 1.0), ("s1", 1.5), ("s2", None)):
        _ended(phases, trial_id, time_s)
    assert phases.suggest("r0") == Searcher.FINISHED
    assert phases.decided() and phases.decided_by_the_search and phases.race_rows == []


@pytest.mark.usefixtures("ray_session")
def test_a_race_interrupted_resumes_with_its_ended_run_kept_and_its_run_in_flight_known(
    tmp_path: Path,
) -> None:
    """Tune pickles the searcher it was given and restores its checkpoint into that copy: the
    race goes on where it stood (one run ended, one in flight, which Tune runs again under
    its own trial id), and nothing is run twice."""
    import pickle

    phases = _phases(tmp_path, zone=100.0)
    pristine = pickle.dumps(phases)  # what Tune pickled when the search started
    _search(phases, [1.0, 1.05])
    for trial_id, time_s in (("s0", 1.0), ("s1", 1.05), ("s2", None)):
        if trial_id == "s2":
            assert isinstance(phases.suggest(trial_id), dict)
        _ended(phases, trial_id, time_s)
    assert isinstance(phases.suggest("r0"), dict) and isinstance(phases.suggest("r1"), dict)
    _ended(phases, "r0", 1.1)
    phases.save(str(tmp_path / "searcher.pkl"))

    restored: SearchThenRace = pickle.loads(pristine)
    restored.restore(str(tmp_path / "searcher.pkl"))
    assert restored.search_ended and len(restored.race_rows) == 1 and not restored.decided()
    assert restored.suggest("r2") is None  # r1 is in flight: no third run
    _ended(restored, "r1", 1.0)
    assert restored.suggest("r2") == Searcher.FINISHED and restored.decided()
    assert len(restored.race_rows) == 2
    assert restored.race is not None and restored.race.record is not None
    assert restored.race.record.record is restored.search.record  # one study, relocatable


@pytest.mark.usefixtures("ray_session")
def test_no_confirmation_ends_with_the_search(tmp_path: Path) -> None:
    phases = _phases(tmp_path, confirm_seeds=0)
    _search(phases, [1.0, 1.05, None])
    for trial_id, time_s in (("s0", 1.0), ("s1", 1.05), ("s2", None)):
        _ended(phases, trial_id, time_s)
    assert phases.suggest("r0") == Searcher.FINISHED and phases.decided()
    assert not phases.decided_by_the_search


@pytest.mark.usefixtures("ray_session")
def test_paused_search_trials_leave_their_slot_and_one_stopped_paused_ends_on_its_last_report(
    tmp_path: Path,
) -> None:
    """Where the scheduler pauses (the driver's default), the search bounds its trials at once
    itself, paused ones not counted (Tune's max_concurrent_trials counts them: every slot held
    by a paused trial, nothing would run); a paused trial stopped for good is told with no
    result (Tune's stop_trial), and its row is its last report's: capped, not errored."""
    from raybatch.examples.digits import workload
    from raybatch.metric import resolve_target
    from raybatch.run.driver import _plan

    options = SearchOptions(trials=4, prior=False, max_concurrent=2)
    target = resolve_target("accuracy>=0.9", workload.metrics)
    plan = _plan(tmp_path, workload, SPACE, target, options)
    phases = SearchThenRace.for_search(plan.searcher, options, plan.cuda, plan.in_flight,
                                       limit=plan.in_flight)  # fmt: skip
    assert all(isinstance(phases.suggest(f"s{i}"), dict) for i in range(2))
    assert phases.suggest("s2") is None  # two run: the limit
    last = {keys.TRIAL_ID: "s0", keys.STATUS: "running", keys.TRAIN_S: 0.4, keys.METRIC: 0.3,
            keys.HELD_S: 1.0}  # fmt: skip
    phases.on_trial_result("s0", last)
    phases.on_pause("s0")
    phases.on_pause("s0")  # told twice (a wrapping searcher passes it on too): one pause
    assert isinstance(phases.suggest("s2"), dict)  # its slot is free
    assert phases.suggest("s3") is None
    phases.on_trial_complete("s0")  # stopped while paused: no result from Tune
    assert phases.ended["s0"].status.value == "capped"
    assert phases.ended["s0"].train_s == pytest.approx(0.4)
    assert phases.suggest("s3") is None  # s1 and s2 run
    _ended(phases, "s1", 2.0)
    assert isinstance(phases.suggest("s3"), dict)


@pytest.mark.usefixtures("ray_session")
def test_an_interruption_counts_the_trials_that_ended_and_one_in_the_race_says_the_race(
    tmp_path: Path,
) -> None:
    """What the driver says when Tune stopped early: the trials that ended, not those launched
    (it once said 3 where 1 had ended), and a race cut short is no verdict."""
    from raybatch.errors import SearchInterrupted

    phases = _phases(tmp_path, zone=100.0)
    _search(phases, [1.0, 1.05])
    _ended(phases, "s0", 1.0)
    said = r"search interrupted in the opening after 1 of 3 trials.* resume "
    with pytest.raises(SearchInterrupted, match=said):
        phases.ended_or_interrupted(None, tmp_path, [])
    _ended(phases, "s1", 1.05)
    assert isinstance(phases.suggest("s2"), dict)
    _ended(phases, "s2", None)
    assert isinstance(phases.suggest("r0"), dict)
    with pytest.raises(SearchInterrupted, match="confirmation was interrupted before its verdict"):
        phases.ended_or_interrupted(None, tmp_path, [])


@pytest.mark.usefixtures("ray_session")
def test_the_race_meets_at_the_level_the_leaders_search_curve_had_at_half_its_time(
    tmp_path: Path,
) -> None:
    """The search trials' evaluations are kept as curves (heartbeats left out); the race's
    two runs carry the level the leader's curve had at half its time to target, and train
    to it (``meet_level``); the curves survive the checkpoint."""
    import pickle

    phases = _phases(tmp_path, zone=100.0)
    pristine = pickle.dumps(phases)  # what Tune pickled when the search started
    _search(phases, [1.0, 1.05, None])
    for trial_id, time_s in (("s0", 1.0), ("s1", 1.05)):
        for quarter in (1, 2, 3):
            trained = time_s * quarter / 4
            evaluation = {keys.TRIAL_ID: trial_id, keys.STATUS: "running",
                          keys.TRAIN_S: trained, keys.METRIC: 0.2 * quarter}  # fmt: skip
            phases.on_trial_result(trial_id, evaluation)
            heartbeat = {**evaluation, keys.HEARTBEAT: True, keys.METRIC: 0.9}
            phases.on_trial_result(trial_id, heartbeat)  # repeats the last: not on the curve
    phases.save(str(tmp_path / "phases.pkl"))
    again: SearchThenRace = pickle.loads(pristine)
    again.restore(str(tmp_path / "phases.pkl"))
    for trial_id, time_s in (("s0", 1.0), ("s1", 1.05), ("s2", None)):
        _ended(again, trial_id, time_s)
    first, second = again.suggest("r0"), again.suggest("r1")
    assert isinstance(first, dict) and isinstance(second, dict)
    assert first[keys.MEET_LEVEL] == second[keys.MEET_LEVEL] == pytest.approx(0.4)


@pytest.mark.usefixtures("ray_session")
def test_a_search_trial_tune_ended_without_telling_is_told_before_tune_asks_for_trials(
    tmp_path: Path,
) -> None:
    """Ray Tune can set a trial TERMINATED without telling the searcher (its last result came
    while it was saving a checkpoint: ``_schedule_trial_stop`` first, then ``stop_trial``
    returns early). A resumed search whose saved state held such a trial waited for it: Tune
    blocked asking for trials for up to 600 s at a time. The step's callback tells it, at the
    step's start, with Tune's last result of it; the race then starts, and telling again
    changes nothing."""
    from types import SimpleNamespace

    from raybatch.tuning.untold import TellUntold

    phases = _phases(tmp_path, zone=100.0)  # every pair inside the zone: a race
    _search(phases, [1.0, 1.05, None])
    _ended(phases, "s0", 1.0)
    _ended(phases, "s1", 1.05)
    assert phases.suggest("r0") is None and phases.waits_for("s2")  # s2 untold
    last = {keys.TRIAL_ID: "s2", keys.STATUS: "capped", keys.TRAIN_S: 2.0, keys.HELD_S: 2.0,
            keys.OBJECTIVE: 100.0, "config": {keys.MICRO_BATCH_SIZE: 64}}  # fmt: skip
    trials = [SimpleNamespace(trial_id=t, status="TERMINATED", last_result=last)
              for t in ("s0", "s1", "s2")]  # fmt: skip
    never_ran = [SimpleNamespace(trial_id="s2", status="TERMINATED", last_result={})]
    TellUntold(phases).on_step_begin(0, never_ran)  # ended before it reported: not told here
    assert phases.waits_for("s2")
    watch = TellUntold(phases)
    for _ in range(2):
        watch.on_step_begin(0, trials)
    assert not phases.waits_for("s2") and phases.ended["s2"].train_s == 2.0
    first, second = phases.suggest("r0"), phases.suggest("r1")
    assert isinstance(first, dict) and isinstance(second, dict)  # the race goes on
    assert phases.waits_for("r0") and not phases.waits_for("nobody")
