"""The trial clock, sample marks, target and statuses, with a hand-driven clock."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from raybatch import Target, keys
from raybatch.status import TrialStatus, objective_value
from raybatch.trial.clock import TrialClock
from raybatch.trial.reporting import ReporterOptions, TrialReporter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(
    target: float = 0.9,
    synchronize: Callable[[], None] | None = None,
    options: ReporterOptions | None = None,
    **kwargs: Any,
) -> tuple[TrialReporter, list[dict[str, Any]], Clock]:
    reports: list[dict[str, Any]] = []
    clock = Clock()
    settings: dict[str, Any] = {"eval_every_samples": 100, "max_time_s": 10.0} | kwargs
    reporter = TrialReporter(Target(target), report_fn=reports.append, options=options,
                             clock=TrialClock(synchronize, clock), **settings)  # fmt: skip
    return reporter.start(), reports, clock


def test_reaching_the_target_records_time_and_samples_and_stops() -> None:
    run, reports, clock = make()
    run.add(samples=64, steps=1, loss=2.0)
    assert not run.eval_due
    run.add(samples=64, steps=1, loss=1.5)
    assert run.eval_due
    clock.now += 1.0
    assert run.report(0.5) is False
    assert reports[-1][keys.STATUS] == "running"
    assert reports[-1][keys.EVAL_MARK] == 100
    run.add(samples=128, steps=2, loss=1.0)
    clock.now += 2.0
    assert run.report(0.95) is True
    final = reports[-1]
    assert final[keys.STATUS] == "reached"
    assert final[keys.TIME_TO_TARGET_S] == pytest.approx(3.0)
    assert final[keys.SAMPLES_TO_TARGET] == 256
    assert final[keys.OBJECTIVE] == pytest.approx(3.0)
    assert final[keys.STEPS] == 4
    assert run.report(0.99) is True and len(reports) == 2  # nothing after a terminal status


def test_evaluation_time_counts_in_elapsed_but_not_in_train_time() -> None:
    run, reports, clock = make()
    clock.now += 2.0
    run.add(samples=100, steps=1)
    with run.evaluating():
        clock.now += 0.5
    run.report(0.1)
    assert reports[-1][keys.ELAPSED_S] == pytest.approx(2.5)
    assert reports[-1][keys.TRAIN_S] == pytest.approx(2.0)
    assert reports[-1][keys.THROUGHPUT] == pytest.approx(50.0)


def test_the_objective_is_training_time_to_target_and_evaluation_is_reported_apart() -> None:
    """Evaluations are the measuring device, not the user's training: kept out of the
    objective, reported as eval_s, and the old figure (both together) kept beside it."""
    run, reports, clock = make()
    clock.now += 2.0
    run.add(samples=100, steps=1)
    with run.evaluating():
        clock.now += 5.0
    run.report(0.5)
    clock.now += 1.0
    run.add(samples=100, steps=1)
    with run.evaluating():
        clock.now += 5.0
    assert run.report(0.95) is True
    final = reports[-1]
    assert final[keys.TIME_TO_TARGET_S] == pytest.approx(3.0)
    assert final[keys.OBJECTIVE] == pytest.approx(3.0)
    assert final[keys.EVAL_S] == pytest.approx(10.0)
    assert final[keys.ELAPSED_TO_TARGET_S] == pytest.approx(13.0)
    assert "in 3.000 s of training" in final[keys.REASON]


def test_the_time_cap_counts_training_only() -> None:
    run, reports, clock = make(max_time_s=5.0)
    run.add(samples=50, steps=1, loss=1.0)
    with run.evaluating():
        clock.now += 20.0  # a slow evaluation does not spend the trial's budget
    clock.now += 4.0
    assert run.add(samples=10, steps=1, loss=1.0) is False
    clock.now += 2.0
    assert run.add(samples=10, steps=1, loss=1.0) is True
    assert "time cap of 5 s of training" in reports[-1][keys.REASON]


@pytest.mark.parametrize("on_device", [False, True])
def test_a_report_that_waits_is_not_training_where_the_device_waits_too(on_device: bool) -> None:
    """Ray Train's report waits for its controller's poll (2 s by default), and a report's wait
    had entered the time to target: after an evaluation, and anywhere on a CPU, the wait is
    timed apart; a heartbeat on a device is not, since its queued steps train meanwhile."""
    clock = Clock()
    reports: list[dict[str, Any]] = []

    def waits(report: dict[str, Any]) -> None:
        reports.append(report)
        clock.now += 2.0  # the report blocks for two seconds

    synchronize = (lambda: None) if on_device else None
    run = TrialReporter(Target(0.9), report_fn=waits, eval_every_samples=100, max_time_s=100.0,
                        options=ReporterOptions(heartbeat_s=1.0),
                        clock=TrialClock(synchronize, clock)).start()  # fmt: skip
    clock.now += 1.0
    run.add(samples=10, steps=1)  # a heartbeat: 1 s trained, then a 2 s wait
    assert reports[-1][keys.HEARTBEAT]
    clock.now += 0.5
    run.add(samples=90, steps=1)
    clock.now += 0.5
    run.report(0.5)  # an evaluation: 2 s trained, then a 2 s wait
    run.add(samples=10, steps=1)
    clock.now += 1.0
    assert run.report(0.95)  # 1 s more
    waited = 2.0 if on_device else 0.0  # the heartbeat's wait, where the device trained on
    assert reports[-1][keys.TIME_TO_TARGET_S] == pytest.approx(3.0 + waited)


def test_the_device_is_synchronised_at_marks_never_between_them() -> None:
    """On CUDA a sync per step makes small launch-bound batches look slow: between marks the
    time cap is read from the host clock; only marks, heartbeats (one per 0.31 s of a 10 s
    cap here) and the end wait for the device."""
    syncs: list[int] = []
    run, reports, clock = make(synchronize=lambda: syncs.append(1), eval_every_samples=1000)
    syncs.clear()  # start() reads the clock once
    for _ in range(99):
        clock.now += 0.01
        run.add(samples=10, steps=1)
    assert len(syncs) == len(reports) == 3  # 99 steps, 3 heartbeats: one sync each
    run.add(samples=10, steps=1)
    assert run.eval_due
    with run.evaluating():
        clock.now += 0.1
    run.report(0.5)
    assert 3 < len(syncs) <= 3 + 4


def test_between_far_apart_marks_a_heartbeat_reports_the_training_time() -> None:
    """A trial whose next mark is far off (a small batch) still reports its training time at
    least every ``heartbeat_s``: the capping scheduler can act only on a report."""
    run, reports, clock = make(eval_every_samples=10**6, options=ReporterOptions(heartbeat_s=1.0))
    for _ in range(20):
        clock.now += 0.25
        run.add(samples=10, steps=1)
    assert [round(r[keys.TRAIN_S], 2) for r in reports] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert {r[keys.STATUS] for r in reports} == {"running"} and reports[-1][keys.METRIC] is None
    assert all(r[keys.HEARTBEAT] for r in reports)


def test_an_evaluation_is_due_at_each_training_time_mark_between_sample_marks() -> None:
    """The rungs need an evaluation near each training time, whatever the batch: past a time
    mark (read on the host clock) an evaluation is due though no sample mark has come; marks
    passed during the evaluation are skipped, not owed."""
    from raybatch.trial.cadence import NEAR_MARK_RATIO, time_marks

    run, reports, clock = make(
        eval_every_samples=10_000, options=ReporterOptions(eval_at_s=(0.5, 1.0, 2.0, 4.0))
    )
    clock.now += 0.4
    run.add(samples=8, steps=1)
    assert not run.eval_due
    clock.now += 0.2
    run.add(samples=8, steps=1)
    assert run.eval_due  # 0.6 s of training: past the 0.5 s mark
    with run.evaluating():
        clock.now += 5.0  # a long evaluation is off the training clock
    run.report(0.3)
    assert reports[-1][keys.TRAIN_S] == pytest.approx(0.6) and not run.eval_due
    clock.now += 0.5
    run.add(samples=8, steps=1)
    assert run.eval_due  # 1.1 s: the 1 s mark
    clock.now += 3.0
    run.report(0.4)  # at 4.1 s: the 2 s and 4 s marks have passed, none is owed
    run.add(samples=8, steps=1)
    assert not run.eval_due
    marks = time_marks(60.0)
    geometric = marks[: marks.index(pytest.approx(60 / 3**0.5)) + 1]
    assert geometric[0] == pytest.approx(60 / 243) and len(geometric) == 10
    assert all(b / a == pytest.approx(3**0.5) for a, b in itertools.pairwise(geometric))
    # Past the cap / sqrt(3), 15 % apart up to the cap, as near the target: an epoch there can
    # be longer than what is left of the cap.
    last = marks[len(geometric) - 1 :]
    assert all(b / a == pytest.approx(NEAR_MARK_RATIO) for a, b in itertools.pairwise(last))
    assert last[-1] < 60.0 <= last[-1] * NEAR_MARK_RATIO


def test_near_the_target_each_evaluation_sets_the_next_at_most_15_percent_later() -> None:
    """A time to target is read at the first evaluation past the crossing: marks sqrt(3) apart
    overstated it by up to 73 %. Near the target the next evaluation comes at 1.15 x the
    training time of the last; a cadence the user chose (no time marks) is kept as given."""
    run, reports, clock = make(
        eval_every_samples=10_000, options=ReporterOptions(eval_at_s=(0.5, 1.0, 2.0, 4.0))
    )
    clock.now += 2.0
    run.add(samples=8, steps=1)
    assert run.eval_due
    run.near_target()
    run.report(0.85)  # at 2.0 s: the next is due at 2.3 s, not at the 4 s mark
    clock.now += 0.25
    run.add(samples=8, steps=1)
    assert not run.eval_due
    clock.now += 0.1
    run.add(samples=8, steps=1)
    assert run.eval_due  # 2.35 s
    run.report(0.88)
    clock.now += 0.3
    run.add(samples=8, steps=1)
    assert not run.eval_due  # 2.65 s, before 2.35 x 1.15 = 2.70 s
    clock.now += 0.1
    run.add(samples=8, steps=1)
    assert run.eval_due
    run.report(0.91)
    assert reports[-1][keys.TIME_TO_TARGET_S] == pytest.approx(2.75)
    users, _, users_clock = make(eval_every_samples=10_000)
    users.near_target()
    users_clock.now += 2.0
    users.add(samples=8, steps=1)
    users.report(0.85)
    users_clock.now += 0.5
    users.add(samples=8, steps=1)
    assert not users.eval_due  # only the user's sample marks


def test_the_heartbeat_is_a_32nd_of_the_cap_and_never_over_five_seconds() -> None:
    """A cap of hours must not let a trial train minutes past a capping decision."""
    from raybatch.trial.cadence import heartbeat_for

    assert heartbeat_for(60.0) == pytest.approx(60.0 / 32)
    assert heartbeat_for(3600.0) == 5.0
    assert make(max_time_s=3600.0)[0].cadence.heartbeat_s == 5.0


def test_caps_can_wait_for_the_marks() -> None:
    """Data-parallel workers must agree to stop, so there the caps are checked at marks."""
    run, _reports, clock = make(
        max_time_s=1.0, options=ReporterOptions(check_budgets_between_marks=False)
    )
    clock.now += 5.0
    assert run.add(samples=10, steps=1) is False
    run.add(samples=90, steps=1)
    assert run.report(0.1) is True and run.status is TrialStatus.CENSORED


def test_data_wait_fraction_is_the_share_of_training_time() -> None:
    run, reports, clock = make()
    clock.now += 4.0
    run.add_data_wait(1.0)
    run.add(samples=100)
    run.report(0.1)
    assert reports[-1][keys.DATA_WAIT_FRACTION] == pytest.approx(0.25)


def test_time_cap_censors_with_the_par10_objective() -> None:
    run, reports, clock = make(max_time_s=5.0)
    run.add(samples=10, steps=1, loss=1.0)
    clock.now += 6.0
    assert run.add(samples=10, steps=1, loss=1.0) is True
    assert run.status is TrialStatus.CENSORED
    assert reports[-1][keys.OBJECTIVE] == 50.0
    assert "time cap of 5 s" in reports[-1][keys.REASON]


def test_sample_budget_censors() -> None:
    run, _reports, _ = make(max_samples=50)
    run.add(samples=60, steps=1)
    assert run.status is TrialStatus.CENSORED
    assert "sample budget of 50" in run.reason


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), 31.0])
def test_nan_inf_or_exploding_loss_diverges_at_once(loss: float) -> None:
    run, reports, _ = make(options=ReporterOptions(divergence_factor=10.0))
    run.add(samples=10, steps=1, loss=3.0)
    assert run.add(samples=10, steps=1, loss=loss) is True
    assert run.status is TrialStatus.DIVERGED
    assert reports[-1][keys.STATUS] == "diverged"
    assert reports[-1][keys.OBJECTIVE] == 100.0


def test_min_mode_targets_lower_is_better() -> None:
    reports: list[dict[str, Any]] = []
    run = TrialReporter(
        Target(0.5, mode="min", metric="loss"), eval_every_samples=1, max_time_s=1,
        report_fn=reports.append,
    ).start()  # fmt: skip
    run.add(samples=1)
    assert run.report(0.7) is False
    assert run.report(0.4) is True


def test_context_manager_turns_an_oom_into_infeasible_memory() -> None:
    reports: list[dict[str, Any]] = []
    with TrialReporter(0.9, eval_every_samples=10, max_time_s=5, report_fn=reports.append):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
    assert reports[-1][keys.STATUS] == "infeasible_memory"
    assert "CUDA out of memory" in reports[-1][keys.REASON]


def test_context_manager_turns_a_crash_into_error_and_a_short_loop_into_censored() -> None:
    reports: list[dict[str, Any]] = []
    with TrialReporter(0.9, eval_every_samples=10, max_time_s=5, report_fn=reports.append):
        raise KeyError("features")
    assert reports[-1][keys.STATUS] == "error"
    assert reports[-1][keys.REASON] == "KeyError: 'features' (during training)"
    with TrialReporter(0.9, eval_every_samples=10, max_time_s=5, report_fn=reports.append):
        pass
    assert reports[-1][keys.STATUS] == "censored"


def test_keyboard_interrupt_is_not_swallowed() -> None:
    reporter = TrialReporter(0.9, eval_every_samples=10, max_time_s=5, report_fn=lambda m: None)
    with pytest.raises(KeyboardInterrupt), reporter:
        raise KeyboardInterrupt


def test_objective_is_time_when_reached_and_ten_times_the_cap_otherwise() -> None:
    assert objective_value(TrialStatus.REACHED, 3.5, 60) == 3.5
    for status in TrialStatus:
        if status is not TrialStatus.REACHED:
            assert objective_value(status, None, 60) == 600


def test_bad_settings_are_refused_naming_the_field() -> None:
    from raybatch.errors import OptionError
    from raybatch.metric import Metric

    with pytest.raises(OptionError, match="eval_every_samples: must be positive, got 0"):
        TrialReporter(0.9, eval_every_samples=0, max_time_s=5)
    with pytest.raises(OptionError, match="target: mode must be 'max' or 'min', got 'up'"):
        Target(0.9, mode="up")
    with pytest.raises(OptionError, match=r"Metric\('acc'\)\.mode: must be 'max' or 'min'"):
        Metric("acc", mode="higher")


def test_what_runs_at_the_target_is_off_the_clock_and_its_failure_is_only_a_note() -> None:
    """The time model is measured once the target is reached, before the final report: its
    seconds are evaluation, not training; one that fails leaves the trial reached, with why."""
    run, reports, clock = make()
    run.add(samples=128, steps=2)
    clock.now += 2.0

    def measure() -> dict[str, Any]:
        clock.now += 5.0
        return {keys.TIME_MODEL: "{}"}

    run.at_target = measure
    assert run.report(0.95) is True
    final = reports[-1]
    assert final[keys.STATUS] == "reached" and final[keys.TIME_MODEL] == "{}"
    assert final[keys.TIME_TO_TARGET_S] == final[keys.TRAIN_S] == 2.0
    assert final[keys.EVAL_S] == 5.0 and final[keys.ELAPSED_S] == 7.0
    assert run.step_s() == 1.0

    run, reports, clock = make()
    run.add(samples=128, steps=2)

    def fails() -> dict[str, Any]:
        raise ValueError("the gradient norms at the target were not finite")

    run.at_target = fails
    run.report(0.95)
    assert reports[-1][keys.STATUS] == "reached"
    assert reports[-1][keys.TIME_MODEL_ERROR] == (
        "ValueError: the gradient norms at the target were not finite"
    )
