"""The one rule that picks the winner, on constructed rows: the fastest recipe that reached the
target in every confirmation run, whichever it is (a candidate, the baseline, the reference)."""

from __future__ import annotations

from typing import Any

import pytest

import raybatch
from raybatch import Target, keys
from raybatch.run.options import SearchOptions
from raybatch.run.selection import choose_winner, measured_recipes, select_winner

SPACE = raybatch.load_space("digits_cnn_sgd")
BASELINE = (256, 1, 1.0)  # the largest batch the space lists, at the rule's LR
REFERENCE = (64, 1, 1.0)
CANDIDATE = (32, 2, 1.3)


def _row(knobs: tuple[int, int, float], phase: str, time_s: float | None, trial: str = "t",
         samples: int = 1024) -> dict[str, Any]:  # fmt: skip
    micro, accumulation, lr_multiplier = knobs
    return {
        keys.PHASE: phase,
        keys.TRIAL_ID: trial,
        keys.MICRO_BATCH_SIZE: micro,
        keys.ACCUMULATION_STEPS: accumulation,
        keys.WORLD_SIZE: 1,
        keys.LR_MULTIPLIER: lr_multiplier,
        keys.WEIGHT_DECAY_MULTIPLIER: 1.0,
        keys.STATUS: "reached" if time_s is not None else "censored",
        keys.TIME_TO_TARGET_S: time_s,
        keys.SAMPLES_TO_TARGET: samples if time_s is not None else None,
        keys.PEAK_MEMORY_BYTES: 1000,
    }


def _confirmed(knobs: tuple[int, int, float], *times: float | None) -> list[dict[str, Any]]:
    return [_row(knobs, keys.PHASE_CONFIRMATION, t, trial=f"c{i}") for i, t in enumerate(times)]


def _searched(*pairs: tuple[tuple[int, int, float], float]) -> list[dict[str, Any]]:
    return [_row(k, keys.PHASE_SEARCH, t, trial=f"s{i}") for i, (k, t) in enumerate(pairs)]


def _knobs_of(rows: list[dict[str, Any]]) -> tuple[int, int, float]:
    r = rows[0]
    return r[keys.MICRO_BATCH_SIZE], r[keys.ACCUMULATION_STEPS], r[keys.LR_MULTIPLIER]


def test_the_baseline_wins_when_it_confirms_fastest() -> None:
    """The search's own candidate was faster once in the search; confirmation says otherwise."""
    rows = _searched((CANDIDATE, 1.0), (BASELINE, 1.2), (REFERENCE, 1.5))
    rows += _confirmed(CANDIDATE, 1.4, 1.5, 1.6) + _confirmed(BASELINE, 1.1, 1.2, 1.0)
    rows += _confirmed(REFERENCE, 1.9, 2.0, 2.1)
    winner = select_winner(rows, confirmed=True)
    assert winner is not None and _knobs_of(winner.runs) == BASELINE
    assert winner.median == pytest.approx(1.1)
    best = choose_winner(SPACE, Target(0.97), rows, SearchOptions())
    assert best is not None and best.config.micro_batch_size == 256
    assert best.provenance[keys.TRIAL_ID] == "s1"  # the search trial that ran it


def test_the_reference_can_win_too() -> None:
    rows = _confirmed(CANDIDATE, 1.4, 1.5) + _confirmed(REFERENCE, 1.3, 1.35)
    winner = select_winner(rows, confirmed=True)
    assert winner is not None and _knobs_of(winner.runs) == REFERENCE


def test_overlapping_runs_still_rank_by_median() -> None:
    """Runs that overlap do not stop a choice (the verdict says the gap is noise)."""
    rows = _confirmed(CANDIDATE, 1.0, 1.4, 1.2) + _confirmed(BASELINE, 1.1, 1.3, 1.25)
    winner = select_winner(rows, confirmed=True)
    assert winner is not None and _knobs_of(winner.runs) == CANDIDATE
    assert winner.times == [1.0, 1.4, 1.2]


def test_one_confirmation_miss_rules_a_recipe_out_however_fast_its_other_runs() -> None:
    rows = _confirmed(CANDIDATE, 0.5, None, 0.6) + _confirmed(BASELINE, 1.1, 1.2, 1.3)
    measured = {_knobs_of(m.runs): m for m in measured_recipes(rows, confirmed=True)}
    assert not measured[CANDIDATE].always_reached and measured[BASELINE].always_reached
    winner = select_winner(rows, confirmed=True)
    assert winner is not None and _knobs_of(winner.runs) == BASELINE


def test_nothing_that_always_reached_means_no_winner() -> None:
    rows = _confirmed(CANDIDATE, 0.5, None) + _confirmed(BASELINE, None, None)
    assert select_winner(rows, confirmed=True) is None
    assert choose_winner(SPACE, Target(0.97), rows, SearchOptions()) is None


def test_without_confirmation_the_search_rows_decide() -> None:
    rows = _searched((CANDIDATE, 1.0), (BASELINE, 0.8), (REFERENCE, None))
    winner = select_winner(rows, confirmed=False)
    assert winner is not None and _knobs_of(winner.runs) == BASELINE
    best = choose_winner(SPACE, Target(0.97), rows, SearchOptions(confirm_seeds=0))
    assert best is not None and best.provenance["time_to_target_s_runs"] == [0.8]


def test_search_rows_never_judge_a_confirmed_recipe() -> None:
    """A fast search run is one sample; only the confirmation, run on equal terms, decides."""
    rows = _searched((CANDIDATE, 0.1)) + _confirmed(CANDIDATE, 2.0) + _confirmed(BASELINE, 1.0)
    winner = select_winner(rows, confirmed=True)
    assert winner is not None and _knobs_of(winner.runs) == BASELINE
