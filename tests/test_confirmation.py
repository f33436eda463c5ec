"""The confirmation's race (:class:`raybatch.tuning.confirmation.Race`), driven round by round as
the driver drives it, with the rows a round returns; the verdict's comparisons and the cost."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from ray.tune.schedulers import TrialScheduler
from ray.tune.search import Searcher

import raybatch
from raybatch import Target, keys
from raybatch.provenance import Provenance, SearchCost
from raybatch.results.cost import search_cost, wall_clock
from raybatch.results.rows import TrialRow
from raybatch.results.selection import choose_winner
from raybatch.status import TrialStatus
from raybatch.tuning.confirmation import Race, RaceSearcher
from raybatch.tuning.race_record import RaceRecord
from raybatch.tuning.rungs import RungRule, Trajectory
from raybatch.tuning.scheduler import CappingScheduler
from raybatch.tuning.study import SearchStudy

SPACE = raybatch.load_space("digits_cnn_sgd")
A = (64, 1, 4.0)
B = (128, 1, 2.0)
C = (32, 1, 2.0)
MAX_BATCH = (256, 1, 1.0)
SLACK = 1.2
PENALTY = 100.0


def _row(knobs: tuple[int, int, float], phase: str, time_s: float | None, seed: int,
         status: TrialStatus | None = None, train_s: float | None = None,
         held_s: float | None = None, **figures: float) -> TrialRow:  # fmt: skip
    micro, accumulation, multiplier = knobs
    reached = time_s is not None
    status = status or (TrialStatus.REACHED if reached else TrialStatus.CENSORED)
    return TrialRow.of(
        SPACE.derive(micro, accumulation, 1, multiplier), phase, f"{phase}-{knobs}-{seed}", status,
        time_to_target_s=time_s, train_s=train_s if train_s is not None else time_s,
        held_s=held_s, seed=seed, **figures,
    )  # fmt: skip


def _search(*runs: tuple[tuple[int, int, float], float | None]) -> list[TrialRow]:
    return [_row(k, keys.PHASE_SEARCH, t, seed=0) for k, t in runs]


def _knobs(row: TrialRow) -> tuple[int, int, float]:
    return row.micro_batch_size, row.accumulation_steps, row.lr_multiplier


class _Trial:
    """What the scheduler reads of a Tune trial: its id and config (a race run's carries its
    seed: the cap is the first run on that seed to reach)."""

    def __init__(self, trial_id: str, config: dict[str, Any] | None = None) -> None:
        self.trial_id = trial_id
        self.config = config or {}


def _run(scheduler: CappingScheduler, trial: _Trial, time_s: float | None,
         searcher: RaceSearcher | None = None) -> dict[str, Any]:  # fmt: skip
    """One confirmation run as Tune drives it: a report every 0.05 s of training (1000
    samples a second, the metric rising to 0.97 at ``time_s``), to the shipped searcher and
    scheduler, until the run reaches ``time_s`` (``None``: never) or is stopped."""
    trained = 0.0
    while True:
        trained = round(trained + 0.05, 2)
        reached = time_s is not None and trained >= time_s
        status = TrialStatus.REACHED if reached else TrialStatus.RUNNING
        result = {keys.TRIAL_ID: trial.trial_id, keys.STATUS: status.value,
                  keys.TRAIN_S: trained, keys.HELD_S: trained + 0.5,
                  keys.TIME_TO_TARGET_S: time_s if reached else None,
                  keys.SAMPLES_SEEN: round(trained * 1000),
                  keys.METRIC: 0.97 * min(trained / (time_s or 20.0), 1.0)}  # fmt: skip
        if searcher is not None:
            searcher.on_trial_result(trial.trial_id, result)
        decision = scheduler.on_trial_result(None, trial, result)
        if reached:
            return {**result, keys.OBJECTIVE: time_s}
        if decision == TrialScheduler.STOP:
            return {**result, keys.STATUS: TrialStatus.CAPPED.value, keys.OBJECTIVE: PENALTY}
        if trained > 10:
            return {**result, keys.STATUS: TrialStatus.CENSORED.value, keys.OBJECTIVE: PENALTY}


Rounds = list[tuple[int, list[tuple[int, int, float]]]]


def _play(race: Race, times: dict[tuple[int, int, float], dict[int, float | None]],
          record: RaceRecord | None = None) -> Rounds:  # fmt: skip
    """Run the race as the driver does: the shipped :class:`RaceSearcher` suggests each run in
    order and the shipped :class:`CappingScheduler` caps it; the rounds, as (seed, recipes)."""
    scheduler = CappingScheduler(SLACK, rungs=RungRule(zone=None))
    searcher = RaceSearcher(race, PENALTY, record=record)
    for n in itertools.count():
        config = searcher.suggest(f"t{n}")
        if config == Searcher.FINISHED:
            break
        assert isinstance(config, dict)
        assert searcher.suggest("next") is None  # one run at a time: the cap needs the leader
        trial = _Trial(f"t{n}", config)
        knobs = (config[keys.MICRO_BATCH_SIZE], config[keys.ACCUMULATION_STEPS],
                 config[keys.LR_MULTIPLIER])  # fmt: skip
        result = _run(scheduler, trial, times[knobs][config[keys.SEED]], searcher)
        scheduler.on_trial_complete(None, trial, result)
        searcher.on_trial_complete(trial.trial_id, result)
    rounds: dict[int, list[tuple[int, int, float]]] = {}
    for row in searcher.rows:
        assert row.phase == keys.PHASE_CONFIRMATION and row.seed is not None
        rounds.setdefault(row.seed, []).append(_knobs(row))
    return list(rounds.items())


def test_a_lead_beyond_the_noise_in_the_search_runs_no_race() -> None:
    """The search's runs are the first evidence: A 1.0 against B 1.5 (B 1.5x slower, past the
    10 % zone) is decided there, and A wins on its search run with no confirmation run."""
    rows = _search((A, 1.0), (B, 1.5), (C, 2.0))
    race = Race(rows, top=2, seeds=[1, 2], slack=SLACK)
    assert race.next_round() is None and _play(race, {}) == []
    best = choose_winner(Target(0.97), race.rows, confirmed=True)
    assert best is not None and best.config.micro_batch_size == 64


def test_two_agreeing_pairs_end_the_race_after_one_round_the_challenger_capped() -> None:
    """The search's run is the first pair (A 1.0 against B 1.05: within noise, so a race); on
    seed 1 A again reaches first and B cannot reach by 1.2x A's time: one round, one training
    and 1.2 of a cap."""
    rows = _search((A, 1.0), (B, 1.05), (C, 2.0))
    race = Race(rows, top=2, seeds=[1, 2], slack=SLACK)
    rounds = _play(race, {A: {1: 1.0}, B: {1: 1.6}})
    assert rounds == [(1, [A, B])]
    best = choose_winner(Target(0.97), race.rows, confirmed=True)
    assert best is not None and (best.config.micro_batch_size, best.config.lr_multiplier) == (64, 4)
    assert best.provenance.time_to_target_s_runs == [1.0, 1.0]
    cost = race.rows[-1]
    assert cost.status is TrialStatus.CAPPED
    assert 1.2 < cost.train_s <= 1.25  # stopped at its first report past 1.2x A's time on seed 1


def test_each_race_run_is_a_trial_of_the_study_beside_the_search_s(tmp_path: Any) -> None:
    """optuna-dashboard shows the race: each run is one trial of ``<study>-confirmation`` in the
    run's database, with its recipe's search parameters, its seed, its curve, and its time to
    target where it reached (COMPLETE), PRUNED where the leader's slack capped it."""
    import pickle

    import optuna

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    record = SearchStudy(url, "raybatch")
    rows = _search((A, 1.0), (B, 1.05), (C, 2.0))
    for row in rows:  # the search's trials, as the searcher records them
        trial = record.ask()
        trial.suggest_int(keys.MICRO_BATCH_SIZE, 16, 256, log=True)
        assert trial.params[keys.MICRO_BATCH_SIZE] > 0 and row.config is not None
        record.launched(trial, row.config.to_dict(), row.trial_id)
        record.finish(trial.number, TrialStatus.REACHED, row.time_to_target_s or 0, 0.0, None)
    race = Race(rows, top=2, seeds=[1, 2], slack=SLACK)
    race_record = RaceRecord(record)  # as SearchThenRace builds it
    race_record.start()
    assert _play(race, {A: {1: 1.0}, B: {1: 1.6}}, race_record) == [(1, [A, B])]
    runs = optuna.load_study(study_name="raybatch-confirmation", storage=url).trials
    searched = {t.user_attrs["tune_trial_id"]: t.params for t in record.study.trials}
    assert [r.state.name for r in runs] == ["COMPLETE", "PRUNED"]
    assert runs[0].value == 1.0 and runs[1].value is None
    assert [r.params for r in runs] == [searched[rows[0].trial_id], searched[rows[1].trial_id]]
    assert [r.user_attrs["seed"] for r in runs] == [1, 1]
    assert [r.user_attrs["status"] for r in runs] == ["reached", "capped"]
    assert max(runs[0].intermediate_values) == 1000 and runs[0].intermediate_values[1000] == 0.97
    assert 1200 <= max(runs[1].intermediate_values) <= 1250  # stopped past 1.2x A's time
    # A resumed search runs its race again: the study beside holds that race, not both.
    race_record = pickle.loads(pickle.dumps(race_record))  # Tune pickles the race's searcher
    assert race_record._study is None and race_record.record.storage_url == url  # reopened
    race_record.start()
    _play(Race(rows, top=2, seeds=[1, 2], slack=SLACK), {A: {1: 1.0}, B: {1: 1.6}}, race_record)
    again = optuna.load_study(study_name="raybatch-confirmation", storage=url).trials
    assert len(again) == 2


def test_pairs_that_disagree_within_the_zone_end_the_race_within_noise() -> None:
    """Search: A 1.0, B 1.05; seed 1: A 1.1, B 1.0 (B reaches within its cap): the pairs
    disagree and their median ratio (1.05 and 0.91: 0.98) is within noise: it ends there."""
    rows = _search((A, 1.0), (B, 1.05))
    race = Race(rows, top=2, seeds=[1, 2, 3], slack=SLACK)
    rounds = _play(race, {A: {1: 1.1}, B: {1: 1.0}})
    assert len(rounds) == 1
    best = choose_winner(Target(0.97), race.rows, confirmed=True)
    runner_up = best.provenance.runner_up if best is not None else None
    assert runner_up is not None and runner_up.within_noise is True


def test_a_split_outside_the_indifference_zone_runs_one_more_seed() -> None:
    """Search: A 1.0, B 1.08 (within the zone: a race); seed 1: B 1.0, A 1.4 (ratio 0.71):
    median 0.88, outside the zone and the pairs disagree: seed 2 decides (A 1.0, B 2.0)."""
    rows = _search((A, 1.0), (B, 1.08))
    race = Race(rows, top=2, seeds=[1, 2, 3], slack=SLACK)
    rounds = _play(race, {A: {1: 1.4, 2: 1.0}, B: {1: 1.0, 2: 2.0}})
    assert [seed for seed, _ in rounds] == [1, 2]
    best = choose_winner(Target(0.97), race.rows, confirmed=True)
    assert best is not None and best.config.micro_batch_size == 64


def test_each_round_is_capped_against_its_own_leader_not_an_earlier_seed() -> None:
    """Seed 2 is a slow seed for both (A 3.0, B 3.3): the race's scheduler forgets seed 1's
    times (1.5 and 1.0), so neither run is capped at 1.2x an earlier seed's time; A reaches
    within 1.2x B's time on its own seed."""
    rows = _search((A, 1.0), (B, 1.05))
    race = Race(rows, top=2, seeds=[1, 2], slack=SLACK)
    _play(race, {A: {1: 1.5, 2: 3.0}, B: {1: 1.0, 2: 3.3}})
    second = [r for r in race.rows if r.seed == 2]
    assert sorted((r.time_to_target_s or 0, r.status.value) for r in second) == [
        (3.0, "reached"), (3.3, "reached")]  # fmt: skip


def test_a_leader_that_misses_drops_out_and_the_next_candidate_enters() -> None:
    """A misses the target on seed 1 (censored at its cap): it is out; with three candidates
    allowed, C races B from the next seed on."""
    rows = _search((A, 1.0), (B, 1.05), (C, 1.08))
    race = Race(rows, top=3, seeds=[1, 2, 3], slack=SLACK)
    rounds = _play(race, {A: {1: None}, B: {1: 1.5, 2: 1.5}, C: {2: 1.7}})
    assert rounds == [(1, [A, B]), (2, [B, C])]
    best = choose_winner(Target(0.97), race.rows, confirmed=True)
    assert best is not None and best.config.micro_batch_size == 128


def test_the_only_recipe_that_reached_is_not_run_again_unless_it_was_the_one_asked_for() -> None:
    """Every other recipe was stopped behind it: a run again on a fresh seed would cost a whole
    training (the other slot idle) and could only take the search's one answer away."""
    rows = _search((A, 1.0), (B, None))
    race = Race(rows, top=2, seeds=[1, 2], slack=SLACK)
    assert race.next_round() is None and [e for e, _ in race.standing()] == [race.entrants[0]]
    assert Race(rows, top=2, seeds=[], slack=SLACK).next_round() is None
    asked = Race(rows, top=1, seeds=[1, 2], slack=SLACK)  # one candidate asked: run once more
    assert _play(asked, {A: {1: 1.1}}) == [(1, [A])]
    # Its search run packed beside neighbours judges nothing: it runs once more, alone.
    packed = [dataclasses.replace(r, gpu_share=0.5) for r in rows]
    assert _play(Race(packed, top=2, seeds=[1, 2], slack=SLACK), {A: {1: 1.1}}) == [(1, [A])]
    best = choose_winner(Target(0.97), rows, confirmed=True)
    assert best is not None and best.config.micro_batch_size == A[0]


def test_a_candidate_left_alone_mid_race_runs_before_it_wins() -> None:
    """Both of the first round's recipes miss on its seed: the third, left alone, has no
    confirmation run to judge it (a race's verdict reads them), so it runs on the next seed."""
    C = (256, 1, 1.0)
    rows = _search((A, 1.0), (B, 1.05), (C, 1.08))
    race = Race(rows, top=3, seeds=[1, 2], slack=SLACK)
    rounds = _play(race, {A: {1: None}, B: {1: None}, C: {2: 1.1}})
    assert rounds == [(1, [A, B]), (2, [C])]
    best = choose_winner(Target(0.97), race.rows, confirmed=True)
    assert best is not None and best.config.micro_batch_size == C[0]


def test_the_verdict_compares_with_the_largest_batch_as_a_bound_when_it_was_capped() -> None:
    """The largest batch at the rule's LR was capped at 2.5 s in the search, at 2x it reached
    in 1.6 s: "at least 2.5x slower" and "1.6x slower" than the winner's 1.0 s."""
    capped = _row(MAX_BATCH, keys.PHASE_SEARCH, None, 0, TrialStatus.CAPPED, train_s=2.5)
    tuned = _row((256, 1, 2.0), keys.PHASE_SEARCH, 1.6, 0)
    rows = [capped, tuned, *_search((A, 1.0), (B, 1.5))]
    rows.append(_row(A, keys.PHASE_CONFIRMATION, 1.0, 1))
    rows.append(_row(B, keys.PHASE_CONFIRMATION, None, 1, TrialStatus.CAPPED, train_s=1.2))
    baseline = {"micro_batch_size": 256, "accumulation_steps": 1, "world_size": 1}
    best = choose_winner(Target(0.97), rows, confirmed=True,
                         measured_on=Provenance(baseline_point=baseline))  # fmt: skip
    assert best is not None
    compared = best.provenance.compared or {}
    assert compared["max_batch"].bound == "at_least"
    assert compared["max_batch"].ratio == pytest.approx(2.5)
    assert compared["max_batch_tuned"].bound == "measured"
    assert compared["max_batch_tuned"].ratio == pytest.approx(1.6)


def test_the_cost_counts_every_device_second_in_trainings_of_the_winner() -> None:
    """Held seconds (start-up, data, probe, evaluation, the time model measured in a trial)
    count, not only the training; pre-screened configs never ran and cost nothing."""
    rows = [
        _row(A, keys.PHASE_SEARCH, 1.0, 0, held_s=4.0),
        _row(B, keys.PHASE_SEARCH, None, 0, TrialStatus.CAPPED, train_s=1.2, held_s=3.0),
        _row(A, keys.PHASE_CONFIRMATION, 1.0, 1, held_s=4.0),
        TrialRow.of(SPACE.derive(256), keys.PHASE_PRESCREEN, "p", TrialStatus.PRESCREENED_OUT),
    ]
    cost = search_cost(rows, unit_s=1.0)
    assert cost.trainings == pytest.approx(11.0) and cost.trainings_train == pytest.approx(3.2)
    assert cost.runs == 3
    assert "11.0 trainings" in cost.sentence()
    with pytest.raises(ValueError, match="positive"):
        search_cost(rows, unit_s=0.0)


def test_what_the_user_paid_is_slots_times_the_wall_clock_less_a_start_per_slot() -> None:
    """Two slots from the first run's start (t=0) to the last one's end (t=10): 20 s paid, the
    gaps and the idle slot included, though the runs held 13 s; the first run of each slot's
    process carries its start-up (2 s and 1.5 s), a fixed cost left out of the warm figure;
    a later process's start-up (the third) is not."""
    rows = [
        _row(A, keys.PHASE_SEARCH, 1.0, 0, held_s=4.0, started_at=100.0, startup_s=2.0),
        _row(B, keys.PHASE_SEARCH, 1.5, 0, held_s=3.0, started_at=100.5, startup_s=1.5),
        _row(A, keys.PHASE_CONFIRMATION, 1.0, 1, held_s=6.0, started_at=104.0, startup_s=1.0),
    ]
    cost = search_cost(rows, unit_s=2.0, slots=2)
    assert cost.wall_s == pytest.approx(10.0) and cost.slots == 2
    assert cost.trainings_wall == pytest.approx(10.0)
    assert cost.startup_s == pytest.approx(3.5)
    assert cost.trainings_wall_warm == pytest.approx(8.25)
    assert cost.trainings == pytest.approx(6.5)  # the held seconds, beside it
    said = cost.sentence()
    assert said.startswith("this search cost 10.0 trainings") and "2 slot(s) x 10 s" in said
    assert "8.2 less one process start per slot" in said and "start-up, which" not in said
    # A recipe that trains in a second: the start-ups are most of what was paid, and said so.
    quick = search_cost(rows, unit_s=0.1, slots=2)
    quick = SearchCost(quick.device_s, quick.train_s, quick.unit_s, quick.runs, quick.wall_s,
                       quick.slots, startup_s=12.0)  # fmt: skip
    assert "most of it the processes' start-up, which a longer training pays once" in (
        quick.sentence()
    )
    # Rows that do not say when they ran (written before it was recorded): no wall figure.
    old = search_cost([_row(A, keys.PHASE_SEARCH, 1.0, 0, held_s=4.0)], unit_s=2.0, slots=2)
    assert old.wall_s is None and old.trainings_wall is None
    assert old.sentence().startswith("this search cost 2.0 trainings")
    assert SearchCost.from_dict(cost.to_dict()) == cost
    # Without saying the slots, they are the most runs that held their devices at once.
    assert search_cost(rows, unit_s=2.0).slots == 2


def test_the_wall_clock_is_counted_within_driver_sessions_not_across_an_interruption() -> None:
    """A search ran from t=100 to t=110, was interrupted, and resumed at t=1000 (a day later,
    or a minute): its cost is the two sessions' wall clocks, 10 s and 5 s, not the 910 s from
    the first run's start to the last one's end. Without sessions recorded (a study written
    before they were), one session, as before."""
    rows = [
        _row(A, keys.PHASE_SEARCH, 1.0, 0, held_s=4.0, started_at=100.0),
        _row(B, keys.PHASE_SEARCH, 1.5, 0, held_s=6.0, started_at=104.0),
        _row(A, keys.PHASE_CONFIRMATION, 1.0, 1, held_s=3.0, started_at=1002.0),
        _row(B, keys.PHASE_CONFIRMATION, 1.5, 1, held_s=2.0, started_at=1005.0),
    ]
    assert wall_clock(rows, sessions=[99.0, 1000.0]) == pytest.approx(10.0 + 5.0)
    assert wall_clock(rows) == pytest.approx(907.0)
    cost = search_cost(rows, unit_s=1.0, slots=1, sessions=[99.0, 1000.0])
    assert cost.wall_s == pytest.approx(15.0) and cost.trainings_wall == pytest.approx(15.0)
    # A session in which no run ended (killed at once) adds nothing.
    assert wall_clock(rows, sessions=[99.0, 500.0, 1000.0]) == pytest.approx(15.0)


def test_a_run_resumed_across_sessions_counts_from_its_sessions_start() -> None:
    """A run paused and resumed reports one span as long as all its processes held it, ending
    at its end: resumed after an interruption, it reaches back before its session began, and
    counts from that session's start, not across the interruption."""
    rows = [
        _row(A, keys.PHASE_SEARCH, 1.0, 0, held_s=10.0, started_at=100.0),
        _row(B, keys.PHASE_SEARCH, 1.5, 0, held_s=8.0, started_at=998.0),  # ends at 1006
        _row(A, keys.PHASE_CONFIRMATION, 1.0, 1, held_s=3.0, started_at=1002.0),
    ]
    assert wall_clock(rows, sessions=[99.0, 1000.0]) == pytest.approx(10.0 + 6.0)


def test_a_process_start_counts_what_only_a_processs_first_run_pays_before_its_clock() -> None:
    """A process's first run held 4 s before its clock started (its 1.5 s start-up, then the
    first imports its training made and the data it built); a later run held 0.25 s there (its
    own model built): the process's start is 4 - 0.25 = 3.75 s, not the 1.5 s it was charged.
    A first run that paid nothing more than its start-up is charged that start-up."""
    rows = [
        _row(A, keys.PHASE_SEARCH, 1.0, 0, held_s=6.0, elapsed_s=2.0, started_at=100.0,
             startup_s=1.5),
        _row(B, keys.PHASE_SEARCH, 1.5, 0, held_s=3.0, elapsed_s=2.0, started_at=100.2,
             startup_s=1.0),
        _row(A, keys.PHASE_SEARCH, 1.0, 0, held_s=2.25, elapsed_s=2.0, started_at=106.0),
        _row(B, keys.PHASE_SEARCH, 1.0, 0, held_s=2.25, elapsed_s=2.0, started_at=103.2),
    ]  # fmt: skip
    cost = search_cost(rows, unit_s=2.0, slots=2)
    assert cost.startup_s == pytest.approx(3.75 + 1.0)


def test_a_packed_search_run_is_no_pair_of_the_race() -> None:
    """A search run packed beside neighbours ran at their pace: it does not judge its recipe
    (the confirmation's lone runs do), so a fast packed run cannot carry a recipe through."""
    packed = dataclasses.replace(_row(A, keys.PHASE_SEARCH, 0.5, 0), gpu_share=0.5)
    confirmed = [_row(k, keys.PHASE_CONFIRMATION, t, seed)
                 for seed in (1, 2) for k, t in ((A, 1.3), (B, 1.0))]  # fmt: skip
    rows = [packed, _row(B, keys.PHASE_SEARCH, 1.0, 0), *confirmed]
    best = choose_winner(Target(0.97), rows, confirmed=True)
    assert best is not None and best.config.micro_batch_size == 128
    assert best.provenance.time_to_target_s_runs == [1.0, 1.0, 1.0]


def test_trials_take_a_whole_gpu_unless_packing_is_asked_for() -> None:
    """Packing is an opt-in (``gpus_per_trial="auto"``): by default a GPU cluster's trials run
    alone on their GPUs, so their times compare."""
    from raybatch.cluster.hardware import ClusterView, NodeView

    gpu_node = NodeView("n", "10.0.0.2", 8, 2)
    assert ClusterView((gpu_node,)).gpus_per_trial(None) == 1
    assert ClusterView((gpu_node,)).gpus_per_trial("auto") == "auto"
    assert ClusterView((NodeView("c", "10.0.0.3", 8, 0),)).gpus_per_trial(None) == 0


def test_recipes_whose_search_runs_were_packed_still_race() -> None:
    """Packed search runs judge nothing, but their recipes enter the race on their search
    times and are measured alone from the first round on."""
    rows = [dataclasses.replace(r, gpu_share=0.5) for r in _search((A, 1.0), (B, 1.5))]
    race = Race(rows, top=2, seeds=[1, 2], slack=SLACK)
    rounds = _play(race, {A: {1: 1.0, 2: 1.0}, B: {1: 1.5, 2: 1.5}})
    assert rounds[0][1] == [A, B]
    best = choose_winner(Target(0.97), race.rows, confirmed=True)
    assert best is not None and best.config.micro_batch_size == 64


def test_a_recipe_run_twice_on_the_search_seed_is_one_pair() -> None:
    """Two search rows of A on the search's seed pair once with B's (at their median): one
    pair is no decision, so the race still runs a round."""
    rows = _search((A, 1.0), (A, 1.1), (B, 1.08))
    race = Race(rows, top=2, seeds=[1, 2], slack=SLACK)
    from raybatch.results.selection import compare_paired

    paired = compare_paired(race.judged(rows[0]), race.judged(rows[2]))
    assert paired is not None and paired.pairs == 1
    assert race.next_round() is not None


def test_a_rival_capped_in_the_race_is_compared_from_its_search_run_not_a_stand_in() -> None:
    """The largest batch at its best LR raced and was capped on seed 1: the verdict says its
    search run's 1.5x, not the 100x stand-in a missed run has inside the paired ratio."""
    tuned = (256, 1, 2.0)
    capped = _row(tuned, keys.PHASE_CONFIRMATION, None, 1, TrialStatus.CAPPED, train_s=1.2)
    rows = [*_search((A, 1.0), (tuned, 1.5)), _row(A, keys.PHASE_CONFIRMATION, 1.0, 1), capped]
    baseline = {"micro_batch_size": 256, "accumulation_steps": 1, "world_size": 1}
    best = choose_winner(Target(0.97), rows, confirmed=True,
                         measured_on=Provenance(baseline_point=baseline))  # fmt: skip
    assert best is not None
    compared = (best.provenance.compared or {})["max_batch_tuned"]
    assert compared.bound == "measured" and compared.ratio == pytest.approx(1.5)


def test_data_parallel_and_packed_trials_are_charged_for_the_devices_they_held() -> None:
    dp = TrialRow.of(SPACE.derive(64, 1, 4), keys.PHASE_SEARCH, "dp", TrialStatus.REACHED,
                     held_s=10.0)  # fmt: skip
    packed = dataclasses.replace(_row(A, keys.PHASE_SEARCH, 1.0, 0, held_s=10.0), gpu_share=0.25)
    assert search_cost([dp, packed], unit_s=1.0).device_s == pytest.approx(42.5)


def test_a_run_tune_errors_without_telling_the_searcher_does_not_stall_the_race() -> None:
    """Ray Tune fails a trial whose reused process could not be reset without calling the
    searcher; told by the step-end callback, the race goes on (the run is a miss), and a
    second telling changes nothing."""
    from types import SimpleNamespace

    from raybatch.tuning.untold import TellUntold

    race = Race(_search((A, 1.0), (B, 1.05)), top=2, seeds=[1, 2], slack=SLACK)
    searcher = RaceSearcher(race, PENALTY)
    assert isinstance(searcher.suggest("t0"), dict)
    assert searcher.suggest("t1") is None  # waiting on t0, which Tune errored silently
    watch = TellUntold(searcher)
    for _ in range(2):
        watch.on_step_end(0, [SimpleNamespace(trial_id="t0", status="ERROR")])
    assert [r.status for r in searcher.rows] == [TrialStatus.ERROR]
    assert isinstance(searcher.suggest("t1"), dict)  # the race goes on


def test_on_two_slots_a_round_runs_side_by_side_the_later_capped_at_the_first_to_reach() -> None:
    """Two slots: both runs of the round are suggested at once (each on a slot of its own);
    the first to reach (B, 1.0 s) sets the cap, and A, still short of the target at 1.2 s, is
    stopped there; the next round waits for both runs of this one."""
    race = Race(_search((A, 1.0), (B, 1.05)), top=2, seeds=[1, 2, 3], slack=SLACK)
    scheduler = CappingScheduler(SLACK, rungs=RungRule(zone=None))
    searcher = RaceSearcher(race, PENALTY, at_once=2)
    first, second = searcher.suggest("a"), searcher.suggest("b")
    assert isinstance(first, dict) and isinstance(second, dict)
    assert {first[keys.SEED], second[keys.SEED]} == {1} and searcher.suggest("c") is None
    knobs = {"a": (first[keys.MICRO_BATCH_SIZE], first[keys.LR_MULTIPLIER]),
             "b": (second[keys.MICRO_BATCH_SIZE], second[keys.LR_MULTIPLIER])}  # fmt: skip
    times = {(A[0], A[2]): None, (B[0], B[2]): 1.0}  # A never reaches on this seed
    ended: dict[str, dict[str, Any]] = {}
    trained = 0.0
    while len(ended) < 2:  # the two runs' reports interleaved, as Tune delivers them
        trained = round(trained + 0.05, 2)
        for name in ("a", "b"):
            if name in ended:
                continue
            time_s = times[knobs[name]]
            reached = time_s is not None and trained >= time_s
            result = {keys.TRIAL_ID: name, keys.TRAIN_S: trained, keys.HELD_S: trained,
                      keys.STATUS: "reached" if reached else "running",
                      keys.TIME_TO_TARGET_S: time_s if reached else None,
                      keys.OBJECTIVE: time_s if reached else None}  # fmt: skip
            trial = _Trial(name, first if name == "a" else second)
            stop = scheduler.on_trial_result(None, trial, result) == TrialScheduler.STOP
            if reached or stop:
                result = {**result, keys.OBJECTIVE: result[keys.OBJECTIVE] or PENALTY}
                ended[name] = result
                scheduler.on_trial_complete(None, trial, result)
                searcher.on_trial_complete(name, result)
    a_row = next(r for r in searcher.rows if r.micro_batch_size == A[0])
    assert a_row.status is TrialStatus.CAPPED and 1.2 < (a_row.train_s or 0) <= 1.25


def test_a_race_stopped_with_a_run_in_flight_or_a_round_undone_is_no_verdict() -> None:
    """Ctrl-C stops the Tuner with the race's runs untold: ``decided`` says so (and the driver
    raises SearchInterrupted instead of returning a verdict from half a race); the same race
    run to its end is decided."""
    race = Race(_search((A, 1.0), (B, 1.05)), top=2, seeds=[1, 2], slack=SLACK)
    searcher = RaceSearcher(race, PENALTY)
    assert not searcher.decided()  # nothing run yet: the first round is owed
    assert isinstance(searcher.suggest("t0"), dict)
    assert not searcher.decided()  # the leader's run in flight
    searcher.on_trial_complete("t0", {keys.TRIAL_ID: "t0", keys.STATUS: "reached",
                                      keys.TIME_TO_TARGET_S: 1.0, keys.TRAIN_S: 1.0})  # fmt: skip
    assert not searcher.decided()  # the challenger of the round not run yet
    config = searcher.suggest("t1")
    assert isinstance(config, dict)
    searcher.on_trial_complete("t1", {keys.TRIAL_ID: "t1", keys.STATUS: "reached",
                                      keys.TIME_TO_TARGET_S: 1.1, keys.TRAIN_S: 1.1})  # fmt: skip
    # Two pairs both won by A: the race is decided.
    assert searcher.decided() and searcher.suggest("t2") == Searcher.FINISHED


def _curves(rows: list[TrialRow]) -> dict[str, Trajectory]:
    """Each search run's curve as the search's phases keep it: the metric rising linearly to
    0.97 at its time to target, evaluated every quarter of it."""
    curves = {}
    for row in rows:
        curves[row.trial_id] = curve = Trajectory("max")
        for quarter in (1, 2, 3, 4):
            if row.time_to_target_s is not None:
                curve.add(row.time_to_target_s * quarter / 4, 0.97 * quarter / 4)
    return curves


def test_the_two_meet_at_the_leaders_level_at_half_its_time_a_round_of_about_one_training() -> None:
    """With the search's curves the race's two train to the level the leader's search run had
    at half its time to target (A: 0.485 at 0.5 s), not to the target: A gets there in 0.5 s
    on seed 1, B is capped at 1.2x that, and the round costs about one of A's trainings where
    a race to the target cost two. The meeting runs pair on their seed; they are no time to
    target (the winner's runs are its search run's)."""
    rows = _search((A, 1.0), (B, 1.05), (C, 2.0))
    race = Race(rows, top=2, seeds=[1, 2], slack=SLACK, curves=_curves(rows))
    first = race.next_round()
    assert first is not None and first.level == pytest.approx(0.485)
    rounds = _play(race, {A: {1: 0.5}, B: {1: 0.9}})
    assert rounds == [(1, [A, B])]
    assert [r.meet_level for r in race.rows[-2:]] == [pytest.approx(0.485)] * 2
    assert [r.status for r in race.rows[-2:]] == [TrialStatus.REACHED, TrialStatus.CAPPED]
    assert sum(r.train_s or 0.0 for r in race.rows[-2:]) <= 1.15  # A's training: 1.0
    best = choose_winner(Target(0.97), race.rows, confirmed=True)
    assert best is not None and best.config.micro_batch_size == A[0]
    assert best.provenance.time_to_target_s_runs == [1.0]
    assert "meeting level 0.485" in (race.rows[-1].reason or "")


def test_a_meeting_pairs_with_the_search_pair_and_may_turn_the_verdict() -> None:
    """A leads B by 5 % on the search's seed; at the meeting on seed 1 B gets to the level
    in 0.45 s where A needs 0.6 s (A 1.33x slower): the median of the two paired log ratios
    puts B ahead by 1.13x, and B wins on its search run's time."""
    rows = _search((A, 1.0), (B, 1.05))
    level = {keys.MEET_LEVEL: 0.5}
    rows += [_row(A, keys.PHASE_CONFIRMATION, 0.6, 1, candidate=0, **level),
             _row(B, keys.PHASE_CONFIRMATION, 0.45, 1, candidate=1, **level)]  # fmt: skip
    best = choose_winner(Target(0.97), rows, confirmed=True)
    assert best is not None and best.config.micro_batch_size == B[0]
    assert best.provenance.median_time_to_target_s == 1.05
    runner_up = best.provenance.runner_up
    assert runner_up is not None and (runner_up.pairs, runner_up.wins) == (2, 1)
    assert runner_up.paired_ratio == pytest.approx((0.6 / 0.45 * 1.0 / 1.05) ** 0.5)


def test_no_meeting_where_a_search_run_judges_nothing_or_the_curve_shows_no_progress() -> None:
    """A packed search run judges nothing, so its recipe's fresh-seed run is its only time:
    the two race to the target. Likewise where the leader's curve at half its time is still at
    its first evaluation's value (the two would meet at their first evaluations)."""
    packed = [dataclasses.replace(r, gpu_share=0.5) for r in _search((A, 1.0), (B, 1.05))]
    race = Race(packed, top=2, seeds=[1], slack=SLACK, curves=_curves(packed))
    first = race.next_round()
    assert first is not None and first.level is None
    rows = _search((A, 1.0), (B, 1.05))
    flat = _curves(rows)
    flat[rows[0].trial_id] = curve = Trajectory("max")
    for t, value in ((0.2, 0.3), (0.6, 0.3), (1.0, 0.97)):
        curve.add(t, value)
    first = Race(rows, top=2, seeds=[1], slack=SLACK, curves=flat).next_round()
    assert first is not None and first.level is None


def test_the_winners_samples_to_target_are_its_runs_to_the_target_not_to_the_level() -> None:
    level = {keys.MEET_LEVEL: 0.5}
    rows = [_row(A, keys.PHASE_SEARCH, 1.0, 0, samples_to_target=1000),
            _row(B, keys.PHASE_SEARCH, 1.05, 0, samples_to_target=1100),
            _row(A, keys.PHASE_CONFIRMATION, 0.5, 1, samples_to_target=500, **level),
            _row(B, keys.PHASE_CONFIRMATION, 0.55, 1, samples_to_target=560, **level)]  # fmt: skip
    best = choose_winner(Target(0.97), rows, confirmed=True)
    assert best is not None and best.provenance.samples_to_target == 1000
    assert best.provenance.spread_s is None  # one run to the target: no spread to say


def test_a_race_run_is_capped_at_slack_times_the_first_on_its_own_seed() -> None:
    from raybatch.tuning.race_record import RaceCaps

    caps = RaceCaps(slack=1.5)
    assert caps.cap_s(0) is None  # none reached on it yet
    for seed, time_s in ((0, 4.0), (1, 2.0), (0, 3.0), (0, 5.0)):
        caps.reached(seed, time_s)
    assert caps.cap_s(0) == pytest.approx(4.5) and caps.cap_s(1) == pytest.approx(3.0)
