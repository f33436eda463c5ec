"""The searcher's parts on their own, built as :class:`RaybatchSearcher` builds them: the
screen (ask Optuna until a recipe passes every gate) and the launches (each launch to its end
told once)."""

from __future__ import annotations

from typing import Any

import pytest

import raybatch
from raybatch import keys
from raybatch.space.config import TrialConfig
from raybatch.status import TrialStatus
from raybatch.tuning import screen as screen_module
from raybatch.tuning.gates import Devices, Gate, Rejection
from raybatch.tuning.launches import Launches
from raybatch.tuning.plan import Plan
from raybatch.tuning.screen import Screen
from raybatch.tuning.study import SearchStudy

SPACE = raybatch.load_space("digits_cnn_sgd")
PENALTY = 60.0


class AtMost(Gate):
    """Refuses, for memory, every micro batch above ``largest``."""

    def __init__(self, largest: int) -> None:
        self.largest = largest

    def check(self, recipe: TrialConfig) -> Rejection | None:
        if recipe.micro_batch_size > self.largest:
            return Rejection(f"micro batch over {self.largest}")
        return None


def _parts(gates: list[Gate]) -> tuple[Screen, Launches]:
    """A screen and its launches as the searcher composes them (its study in memory)."""
    record = SearchStudy(None, "parts")
    plan = Plan(SPACE)
    plan.attach(record)
    screen = Screen(SPACE, record, plan, gates, PENALTY)
    return screen, Launches(record, plan, screen, Devices())


def test_the_screen_tells_each_refusal_and_hands_on_the_first_recipe_that_passes() -> None:
    """Only the space's smallest micro batch (16 of 16-256) passes: every other suggestion is
    told to Optuna at once as infeasible for memory, with the penalty, and kept as a row; the
    first that passes is handed on, never told."""
    screen, _ = _parts([AtMost(16)])
    passed = screen.next()
    assert passed is not None and passed.recipe.micro_batch_size == 16
    assert screen.refused and all(p.params[keys.MICRO_BATCH_SIZE] > 16 for p in screen.refused)
    assert {p.reason for p in screen.refused} == {"micro batch over 16"}
    told = [t for t in screen.record.study.trials if t.number != passed.trial.number]
    assert len(told) == len(screen.refused)
    assert all(t.value == PENALTY and t.constraints["memory"] > 0 for t in told)  # infeasible


def test_a_screen_whose_every_suggestion_is_refused_gives_up_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(screen_module, "MAX_PRESCREEN_ATTEMPTS", 5)
    screen, _ = _parts([AtMost(0)])
    assert screen.next() is None
    reason = screen.record.gave_up_reason()
    assert reason is not None and "5 suggestions in a row were rejected" in reason
    assert "micro batch over 0" in reason


def _launched(launches: Launches, trial_id: str) -> tuple[int, dict[str, Any]]:
    passed = launches.screen.next()
    assert passed is not None
    config = launches.start(passed, trial_id)
    assert config is not None
    return passed.trial.number, config


def test_a_packed_trial_out_of_memory_runs_once_more_alone_then_its_oom_is_the_recipes() -> None:
    """A packed trial's OOM may be its neighbours' doing: it is not told, but launched again
    alone on a whole GPU under the next Tune trial id; out of memory alone, it is the
    recipe's verdict. Each end is told once."""
    _, launches = _parts([])
    number, _ = _launched(launches, "t1")
    oom = TrialStatus.INFEASIBLE_MEMORY
    assert launches.end("t1", number, oom, PENALTY, {keys.GPU_SHARE: 0.5}) is False
    again = launches.again("t2")
    assert again is not None and again[keys.ALONE] and again[keys.GPU_SHARE] == 1.0
    assert launches.to_tell("t2") == number and launches.devices.held["t2"] == 1.0
    assert launches.end("t2", number, oom, PENALTY, {keys.GPU_SHARE: 1.0}) is True
    launches.told("t2")
    assert launches.to_tell("t2") is None  # told once: Tune may report an end twice
    assert launches.again("t3") is None  # nothing left to run again


def test_only_a_lone_reach_sets_the_rungs_later_launches_are_judged_at() -> None:
    """A packed trial's time is its neighbours' too: it sets no ``B``; a lone one does, and
    every trial launched after it carries the rungs tied to it."""
    _, launches = _parts([])
    reached = TrialStatus.REACHED
    number, _ = _launched(launches, "packed")
    launches.end("packed", number, reached, 2.0,
                 {keys.TIME_TO_TARGET_S: 2.0, keys.GPU_SHARE: 0.5})  # fmt: skip
    assert launches.fastest_s is None
    number, config = _launched(launches, "lone")
    assert keys.RUNG_MARKS not in config
    launches.end("lone", number, reached, 3.0, {keys.TIME_TO_TARGET_S: 3.0})
    assert launches.fastest_s == 3.0
    _, config = _launched(launches, "next")
    assert config[keys.RUNG_MARKS] == launches.rung_marks(3.0) and 3.0 in config[keys.RUNG_MARKS]
