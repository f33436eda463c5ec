"""The reporter's clock and cadence on their own, with a hand-driven clock."""

from __future__ import annotations

import pytest

from raybatch import keys
from raybatch.trial.cadence import NEAR_MARK_RATIO, Cadence, heartbeat_for
from raybatch.trial.clock import TrialClock


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def started(syncs: list[int] | None = None) -> tuple[TrialClock, Clock]:
    ticks = Clock()
    hook = None if syncs is None else (lambda: syncs.append(1))
    return TrialClock(synchronize=hook, clock=ticks).start(), ticks


def test_evaluation_time_counts_in_elapsed_but_is_kept_out_of_train_s() -> None:
    clock, ticks = started()
    ticks.now += 2.0
    with clock.evaluating():
        ticks.now += 5.0
    ticks.now += 1.0
    assert clock.elapsed_s == pytest.approx(8.0)
    assert clock.eval_s == pytest.approx(5.0)
    assert clock.train_s == pytest.approx(3.0)
    assert clock.train_s_now(synchronize=False) == pytest.approx(3.0)
    figures = clock.figures()
    assert figures[keys.TRAIN_S] == pytest.approx(3.0) and figures[keys.EVAL_S] == 5.0


def test_before_it_starts_the_clock_reads_no_time_and_spends_no_budget() -> None:
    ticks = Clock()
    clock = TrialClock(clock=ticks)
    ticks.now += 50.0
    assert not clock.started
    assert clock.elapsed_s == clock.train_s == clock.train_s_now(synchronize=True) == 0.0
    assert clock.start().started


def test_the_synchronize_hook_runs_at_marks_but_not_for_a_reading_between_them() -> None:
    """On CUDA a device sync per step makes small batches look slow: the budget check between
    marks reads the host clock alone; a mark's reading (and an evaluation's) waits first."""
    syncs: list[int] = []
    clock, ticks = started(syncs)
    assert syncs == [1]  # start
    for _ in range(10):
        ticks.now += 0.1
        clock.train_s_now(synchronize=False)
    assert syncs == [1]
    clock.train_s_now(synchronize=True)
    assert len(syncs) == 2
    with clock.evaluating():
        ticks.now += 1.0
    assert len(syncs) == 4  # before and after the evaluation


def test_the_time_spent_waiting_for_data_adds_up() -> None:
    clock, _ = started()
    clock.add_data_wait(0.25)
    clock.add_data_wait(0.5)
    assert clock.data_wait_s == pytest.approx(0.75)


def test_the_held_time_runs_on_a_plain_wall_clock_from_held_since() -> None:
    clock, _ = started()
    clock.held_since -= 30.0  # the wrapper sets when the trial began holding its device
    clock.startup_s = 4.0
    figures = clock.figures()
    assert figures[keys.HELD_S] >= 30.0 and figures[keys.STARTUP_S] == 4.0


def test_a_paused_trial_resumed_holds_its_earlier_seconds_and_its_first_start_up() -> None:
    """Paused and resumed in another process (raybatch.tuning.promotion), a trial's report says
    what all its processes held and the start-up of its first: its span ends at its end."""
    first, _ = started()
    first.held_since -= 3.0
    first.startup_s = 1.5
    saved = first.state()
    later, _ = started()
    later.held_since -= 2.0  # a warm process: no start-up of its own
    later.resume(saved)
    figures = later.figures()
    assert figures[keys.HELD_S] == pytest.approx(5.0, abs=0.2)
    assert figures[keys.STARTUP_S] == 1.5


def test_sample_marks_advance_past_the_samples_seen() -> None:
    cadence = Cadence(eval_every_samples=100, max_time_s=60.0)
    assert not cadence.due(99) and cadence.due(100)
    cadence.passed(250)  # a loop whose steps overshoot a mark owes no second evaluation
    assert (cadence.last_mark, cadence.next_mark) == (200, 300)
    assert not cadence.due(299) and cadence.due(300)


def test_time_marks_drop_once_passed_and_an_evaluation_is_due_at_one() -> None:
    cadence = Cadence(eval_every_samples=10_000, max_time_s=60.0, eval_at_s=(4.0, 0.5, 2.0, 1.0))
    assert not cadence.time_mark_passed(0.4) and not cadence.due(8)
    assert cadence.time_mark_passed(0.6) and cadence.due(8)
    cadence.passed(8)
    assert not cadence.due(8)
    cadence.trained(2.5)  # marks passed during a long stretch are skipped, not owed
    assert cadence.eval_at_s == [4.0]


def test_a_near_mark_is_added_only_where_there_are_time_marks() -> None:
    """Near the target the next evaluation comes at most 15 % later; a cadence the user chose
    (sample marks only) is kept as given."""
    timed = Cadence(eval_every_samples=10_000, max_time_s=60.0, eval_at_s=(0.5, 4.0))
    timed.near_target()
    timed.trained(2.0)
    assert timed.eval_at_s == [pytest.approx(2.0 * NEAR_MARK_RATIO)]
    users = Cadence(eval_every_samples=10_000, max_time_s=60.0)
    users.near_target()
    users.trained(2.0)
    assert users.eval_at_s == [] and not users.time_mark_passed(1e9)


def test_beside_time_marks_sample_marks_count_from_the_last_evaluation() -> None:
    """With time marks, sample marks are a backstop (at most that many samples between two
    evaluations), not a grid that adds evaluations a few steps after a time mark's; alone
    (a cadence the user chose) they stay a grid."""
    timed = Cadence(eval_every_samples=100, max_time_s=60.0, eval_at_s=(0.5, 4.0))
    assert timed.time_mark_passed(0.6)
    timed.passed(70)  # the time mark's evaluation: the next sample mark 100 samples later
    assert not timed.due(100) and not timed.due(169) and timed.due(170)
    grid = Cadence(eval_every_samples=100, max_time_s=60.0)
    grid.passed(70)
    assert grid.due(100)


def test_near_the_target_each_evaluation_sets_the_only_time_mark_afresh() -> None:
    """Each evaluation near the target sets the next at most 15 % later; the one an earlier
    evaluation set, and the geometric marks, are dropped: they would fire a few steps after an
    evaluation another mark brought (a digits CNN evaluated in pairs 0.03-0.1 s apart)."""
    cadence = Cadence(eval_every_samples=10_000, max_time_s=60.0, eval_at_s=(0.5, 2.2, 4.0))
    cadence.near_target()
    cadence.trained(2.0)
    assert cadence.eval_at_s == [pytest.approx(2.0 * NEAR_MARK_RATIO)]
    cadence.trained(2.1)  # brought by a sample mark before 2.3 s
    assert cadence.eval_at_s == [pytest.approx(2.1 * NEAR_MARK_RATIO)]


def test_a_heartbeat_is_due_after_heartbeat_s_of_training_since_the_last_report() -> None:
    cadence = Cadence(eval_every_samples=100, max_time_s=60.0, heartbeat_s=1.0)
    assert not cadence.heartbeat_due(0.9) and cadence.heartbeat_due(1.0)
    cadence.reported(1.0)
    assert not cadence.heartbeat_due(1.9) and cadence.heartbeat_due(2.0)
    assert Cadence(eval_every_samples=100, max_time_s=60.0).heartbeat_s == heartbeat_for(60.0)
