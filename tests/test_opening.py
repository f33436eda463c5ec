"""The plan's opening on its own, in the state a search leaves it in: when its sweep has been
compared before any reach, and what a sweep point out of memory changes."""

from __future__ import annotations

from typing import Any

import raybatch
from raybatch import keys
from raybatch.tuning.opening import Opening
from raybatch.tuning.rungs import Trajectory
from raybatch.tuning.study import SearchStudy

SPACE = raybatch.load_space("digits_cnn_sgd")
SWEEP = (1.0, 2.0, 4.0, 0.5)


def _opening(curves: dict[int, list[tuple[float, float]]], running: dict[int, int],
             ended: tuple[int, ...]) -> Opening:  # fmt: skip
    """The largest batch (256) at four LRs and the reference (64 x 1) as point 2, the plan's
    order; a 15 s cap's guess of ``B`` (5 s). ``running``: Optuna number -> point."""
    points: list[Any] = [{keys.MICRO_BATCH_SIZE: 256, keys.ACCUMULATION_STEPS: 1,
                          keys.LR_MULTIPLIER: m} for m in SWEEP]  # fmt: skip
    points.insert(2, {keys.MICRO_BATCH_SIZE: 64, keys.ACCUMULATION_STEPS: 1,
                      keys.LR_MULTIPLIER: 1.0})  # fmt: skip
    opening = Opening(SPACE, points, None, horizon_s=5.0)
    opening.record = SearchStudy(None, "opening")
    opening.numbers, opening.times = dict(running), dict.fromkeys(ended)
    for i, marks in curves.items():
        curve = opening.curves[i] = Trajectory("max")
        for t, value in marks:
            curve.add(t, value)
    return opening


def test_a_lone_leader_past_the_rung_under_the_guess_settles_the_opening() -> None:
    """The other sweep points ended before their first evaluation: the leader's curve is the
    only one, and once it trained as long as the rung under the guess of ``B`` (5 s / 3)
    without reaching, nothing is left to compare it with: the ladder is not held until it
    runs out its cap, nor until it gets to the guess (its leaders leapfrogging to it)."""
    short = _opening({0: [(1.2, 0.5)]}, running={7: 0}, ended=(1, 2, 3, 4))
    assert not short.settled({7})
    past = _opening({0: [(1.2, 0.5), (1.8, 0.6)]}, running={7: 0}, ended=(1, 2, 3, 4))
    assert past.settled({7})


def test_a_sweep_point_replaced_after_running_out_of_memory_starts_a_curve_of_its_own() -> None:
    """256 at 2x ran out of memory after an evaluation: the smaller batch that replaces it is
    not compared by the larger one's curve, so the opening waits for its first evaluation."""
    curves = {0: [(5.5, 0.6)], 1: [(0.4, 0.2)], 3: [(0.6, 0.3)], 4: [(0.6, 0.2)]}
    opening = _opening(curves, running={7: 0, 8: 1}, ended=(2,))
    opening.done(8, None, memory=True)
    assert opening.points[1][keys.MICRO_BATCH_SIZE] == 128 and 1 not in opening.curves
    assert not opening.settled({7})
    opening.numbers[9] = 1  # the replacement asked (Opening.note) and evaluated
    opening.evaluated(9, 0.7, 0.3)
    assert opening.settled({7, 9})
