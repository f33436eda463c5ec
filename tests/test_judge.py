"""The rungs' judge on its own, built as the capping scheduler builds it: the curves, ``B`` and
the rule are all it reads, and a failed rung names its zone."""

from __future__ import annotations

import pytest

from raybatch import keys
from raybatch.errors import OptionError
from raybatch.tuning.judge import RungJudge
from raybatch.tuning.promotion import Promotions
from raybatch.tuning.rungs import RungRule


def _evaluated(judge: RungJudge, name: str, points: tuple[tuple[float, float], ...]) -> None:
    for t, metric in points:
        judge.follow(name, {keys.STATUS: "running", keys.TRAIN_S: t, keys.METRIC: metric})


def test_once_b_is_measured_a_trial_slower_than_the_zone_and_outside_the_top_third_fails() -> None:
    """With B at 9 s the rungs are 1, 3 and 9 s: at 1 s a curve far below the incumbent's, the
    last of four, fails there with the rung's zone; the incumbent's own curve passes."""
    judge = RungJudge(RungRule(zone=0.1, hedge=0.0), "max", False, Promotions())
    _evaluated(judge, "inc", ((0.25, 0.1), (1.0, 0.4), (3.0, 0.7)))
    _evaluated(judge, "mid", ((1.0, 0.35),))
    _evaluated(judge, "low", ((1.0, 0.3),))
    judge.record(9.0)
    assert judge.rungs() == pytest.approx([1.0, 3.0, 9.0])
    slow = judge.follow("slow", {keys.STATUS: "running", keys.TRAIN_S: 1.0, keys.METRIC: 0.05})
    assert judge.failed_rung("slow", slow, 1.0) == pytest.approx(1.0)
    assert judge.rung_zones["slow"] == pytest.approx(0.1)
    assert judge.failed_rung("inc", judge.trajectories["inc"], 3.0) is None


def test_a_failed_trial_is_forgotten_and_a_faster_reach_alone_moves_b() -> None:
    judge = RungJudge(RungRule(horizon_s=27.0), "max", False, Promotions())
    _evaluated(judge, "t", ((1.0, 0.2),))
    judge.warming["t"] = 1.0
    judge.forget("t")  # Tune runs it again from its start: nothing of it is kept
    assert "t" not in judge.trajectories and "t" not in judge.warming
    for reach in (5.0, 7.0, None, 4.0):
        judge.record(reach)
    assert judge.best_s == 4.0


@pytest.mark.parametrize(("field", "rule"), [("zone", {"zone": -0.5}), ("eta", {"eta": 1.0})])
def test_a_rule_that_cannot_judge_is_refused_naming_its_field(field: str, rule: dict) -> None:
    with pytest.raises(OptionError, match=field):
        RungRule(**rule)
