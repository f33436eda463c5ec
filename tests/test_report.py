"""The report's one-line verdict says what the confirmation runs support, and no more."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import raybatch
from raybatch.export import BestConfig
from raybatch.report import verdict
from raybatch.results.outcome import SearchResult
from raybatch.results.rows import TrialRow
from raybatch.status import TrialStatus

SPACE = raybatch.load_space("digits_cnn_sgd")
BASELINE = {"micro_batch_size": 256, "accumulation_steps": 1, "world_size": 1}


def _rows(micro: int, accumulation: int, times: list[float], phase: str = "confirmation",
          status: TrialStatus = TrialStatus.REACHED) -> list[TrialRow]:  # fmt: skip
    recipe = SPACE.derive(micro, accumulation)
    reached = status is TrialStatus.REACHED
    return [
        TrialRow.of(recipe, phase, "t", status, time_to_target_s=t if reached else None,
                    samples_to_target=1000, throughput=100.0 if reached else None)
        for t in times
    ]  # fmt: skip


def _result(winner_times: list[float], baseline_times: list[float]) -> SearchResult:
    rows = _rows(32, 4, winner_times) + _rows(256, 1, baseline_times)
    best = BestConfig(
        SPACE.derive(32, 4),
        {"median_time_to_target_s": sorted(winner_times)[1],
         "time_to_target_s_runs": winner_times},
    )  # fmt: skip
    return SearchResult(Path("."), rows, best, BASELINE, None)


def test_a_clear_gap_to_the_largest_batch_is_stated_as_a_speed_up() -> None:
    text = verdict(_result([0.50, 0.52, 0.55], [0.80, 0.90, 1.00]), raybatch.Target(0.97))
    assert "1.7x faster than the largest batch that fits, 256 x 1 (0.90 s)" in text


def test_overlapping_runs_are_called_noise_not_a_speed_up() -> None:
    text = verdict(_result([0.34, 0.42, 0.53], [0.39, 0.45, 0.65]), raybatch.Target(0.97))
    assert "faster" not in text
    assert "256 x 1, took 0.45 s: their runs overlap" in text and "run-to-run noise" in text


def test_a_baseline_that_never_reported_is_shown_by_its_status() -> None:
    result = _result([0.5, 0.5, 0.5], [])
    result.rows += _rows(256, 1, [1.0], phase="search", status=TrialStatus.CENSORED)
    text = verdict(result, raybatch.Target(0.97))
    assert "the largest batch that fits, 256 x 1, ended censored" in text


def test_when_the_largest_batch_wins_the_verdict_says_it_is_the_optimum() -> None:
    """A useful answer, not a failure: the search confirms that nothing beats the max batch."""
    rows = _rows(256, 1, [0.40, 0.42, 0.41]) + _rows(32, 4, [0.50, 0.52, 0.55])
    runs = [0.40, 0.42, 0.41]
    best = BestConfig(
        SPACE.derive(256, 1), {"median_time_to_target_s": 0.41, "time_to_target_s_runs": runs}
    )
    text = verdict(SearchResult(Path("."), rows, best, BASELINE, None), raybatch.Target(0.97))
    assert "It is the largest batch that fits, at the rule's LR" in text
    assert "here the largest batch is already the optimum" in text


def test_a_baseline_faster_when_it_arrived_but_that_missed_is_said_to_have_missed() -> None:
    result = _result([0.50, 0.52, 0.55], [0.30, 0.31])
    result.rows += _rows(256, 1, [1.0], status=TrialStatus.CENSORED)
    text = verdict(result, raybatch.Target(0.97))
    assert "256 x 1, measured 0.30 s when it got there but missed the target in 1 of 3 runs" in text


def test_the_comparison_plot_draws_every_run_not_only_the_medians(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import raybatch.report as report

    saved: list[Any] = []
    monkeypatch.setattr(report, "_save", lambda fig, out: saved.append(fig))
    entries = {"winner": {"time": 0.5, "times": [0.4, 0.5, 0.6], "samples": 1.0,
                          "throughput": 1.0},
               "max batch": {"time": 0.7, "times": [0.6, 0.7], "samples": 1.0,
                             "throughput": 1.0}}  # fmt: skip
    report._plot_comparison(entries, Path("unused.png"))
    dots = [c for c in saved[0].axes[0].collections if c.get_offsets().shape[0]]
    assert sorted(len(c.get_offsets()) for c in dots) == [2, 3]
