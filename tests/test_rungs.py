"""The rungs' rule alone: curves, ASHA's quantile, and when a rung has judged a trial."""

from __future__ import annotations

import pytest

from raybatch.tuning.rungs import (
    Trajectory,
    extrapolated,
    grid_rungs,
    lowest_mark,
    passes,
    quantile,
    rung_times,
)


def _curve(*points: tuple[float, float], mode: str = "max") -> Trajectory:
    t = Trajectory(mode)
    for train_s, metric in points:
        t.add(train_s, metric)
    return t


def test_a_curve_is_interpolated_between_evaluations_and_ends_where_the_trial_did() -> None:
    c = _curve((1.0, 0.2), (3.0, 0.6))
    assert c.value_at(2.0) == pytest.approx(0.4)
    assert c.value_at(3.5) is None  # it has not trained that long
    assert c.value_at(0.5) == 0.2  # before its first evaluation, its own first value stands...
    assert c.value_at(0.5, before_first=False) is None  # ...but never as a peer's evidence


def test_a_curve_keeps_the_best_so_far_and_reads_a_loss_as_lower_is_better() -> None:
    assert _curve((1.0, 0.5), (2.0, 0.3)).progress == 0.5
    loss = _curve((1.0, 2.0), (2.0, 1.0), mode="min")
    assert loss.value_at(2.0) == -1.0 and loss.value_at(1.5) == pytest.approx(-1.5)


def test_the_quantile_is_numpys_linear_one() -> None:
    assert quantile([0.1, 0.3, 0.45, 0.5], 2 / 3) == pytest.approx(0.45)
    assert quantile([0.2, 0.4], 2 / 3) == pytest.approx(0.2 + 0.2 * 2 / 3)
    assert quantile([7.0], 0.5) == 7.0


def test_rungs_are_tied_to_the_horizon() -> None:
    assert rung_times(27.0) == pytest.approx([3.0, 9.0, 27.0])
    assert rung_times(81.0, count=5) == pytest.approx([1.0, 3.0, 9.0, 27.0, 81.0])


def test_a_rung_nobody_else_got_to_gives_no_verdict() -> None:
    """The first trial at a rung goes on, to be judged there again once another curve is."""
    alone = _curve((1.0, 0.01))
    early = _curve((0.2, 0.5))  # ended before the rung
    assert passes(alone, 1.0, [early], zone=0.1, eta=3) is None
    assert passes(alone, 1.0, [early, _curve((0.5, 0.3), (1.2, 0.8))], 0.1, 3) is False


def test_at_the_lowest_time_mark_a_peers_first_evaluation_stands_for_the_rung() -> None:
    """Every trial evaluates first at the first step past the lowest mark: no curve shows the
    rung itself. There a peer's first value stands, as the judged trial's own does; elsewhere
    a peer that has shown nothing by the rung is no evidence."""
    judged, peers = _curve((0.07, 0.1)), [_curve((0.08, 0.3)), _curve((0.075, 0.4))]
    assert passes(judged, 0.062, peers, zone=0.0, eta=3) is None
    assert passes(judged, 0.062, peers, zone=0.0, eta=3, first_stands=True) is False
    assert lowest_mark(5.0) == pytest.approx(15.0 / 243)


def test_below_b_the_rungs_are_the_grids_two_points_under_b_over_sqrt_eta() -> None:
    assert grid_rungs(9.0, 30.0) == pytest.approx([30 / 27, 30 / 9, 9.0])
    assert grid_rungs(5.0, 30.0) == pytest.approx([30 / 81, 30 / 27, 5.0])  # 30/9 > 5/sqrt(3)
    assert grid_rungs(300.0, 30.0) == pytest.approx([30.0, 90.0, 300.0])  # the grid goes up too


def test_a_curve_extrapolates_to_the_target_at_its_average_pace_once_it_has_moved() -> None:
    """From 0.1 at 1 s to 0.5 at 3 s, half the way to 0.9: 5 s at that pace (optimistic, as
    curves slow down). Before a fifth of the way, or with one evaluation, no estimate."""
    assert extrapolated(_curve((1.0, 0.1), (3.0, 0.5)), 0.9) == pytest.approx(5.0)
    assert extrapolated(_curve((1.0, 0.1), (3.0, 0.2)), 0.9) is None
    assert extrapolated(_curve((1.0, 0.1)), 0.9) is None
    assert extrapolated(_curve((1.0, 0.1), (2.0, 0.95)), 0.9) == pytest.approx(2.0)
    loss = _curve((1.0, 2.0), (2.0, 1.0), mode="min")
    assert extrapolated(loss, 0.5) == pytest.approx(2.5)  # two thirds of the way in 1 s


def test_a_curve_run_again_from_an_earlier_point_keeps_what_it_showed_before_it() -> None:
    """A trial resumed from its save (or retried from its start) reports an earlier training
    time than its last: its curve up to there stands, the rest is shown again, and rungs past
    that point are judged again."""
    curve = Trajectory("max")
    for t, v in ((1.0, 0.1), (2.0, 0.2), (3.0, 0.3)):
        curve.add(t, v)
    curve.judged.update({1.5, 2.5})
    curve.add(2.0, 0.2)  # from a save at 2 s
    assert curve.times == [1.0, 2.0, 2.0] and curve.judged == {1.5}
    assert curve.value_at(1.5) == pytest.approx(0.15)
    curve.add(0.5, 0.05)  # from its start: nothing before it
    assert curve.times == [0.5] and curve.judged == set()
