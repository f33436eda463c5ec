"""The report's verdict says what the runs support, and no more: the winner, the runner-up seed
by seed, the simple alternatives (bounds where they were stopped) and what the search cost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import raybatch
from raybatch.provenance import Provenance
from raybatch.report import NOT_CONFIRMED, verdict
from raybatch.results.outcome import SearchResult
from raybatch.results.rows import TrialRow
from raybatch.results.selection import choose_winner
from raybatch.status import TrialStatus

SPACE = raybatch.load_space("digits_cnn_sgd")
BASELINE = {"micro_batch_size": 256, "accumulation_steps": 1, "world_size": 1}


def _row(knobs: tuple[int, int, float], phase: str, time_s: float | None, seed: int,
         status: TrialStatus | None = None, train_s: float | None = None) -> TrialRow:  # fmt: skip
    micro, accumulation, multiplier = knobs
    status = status or (TrialStatus.REACHED if time_s is not None else TrialStatus.CENSORED)
    return TrialRow.of(
        SPACE.derive(micro, accumulation, 1, multiplier), phase, f"{phase}{knobs}{seed}", status,
        time_to_target_s=time_s, train_s=train_s or time_s, held_s=(train_s or time_s or 0) * 3,
        seed=seed,
    )  # fmt: skip


WINNER, RUNNER = (32, 4, 1.0), (64, 1, 2.0)


def _result(rows: list[TrialRow]) -> SearchResult:
    """As the driver builds it: the winner chosen from the rows, with its comparisons."""
    best = choose_winner(raybatch.Target(0.97), rows, confirmed=True,
                         measured_on=Provenance(baseline_point=BASELINE))  # fmt: skip
    return SearchResult(Path("."), rows, best, BASELINE, None)


def _race(runner_s: float | None) -> list[TrialRow]:
    """The search's runs of the two best, and one round of the race."""
    rows = [_row(WINNER, "search", 0.5, 0), _row(RUNNER, "search", 0.6, 0),
            _row(WINNER, "confirmation", 0.52, 1)]  # fmt: skip
    if runner_s is None:
        rows.append(_row(RUNNER, "confirmation", None, 1, TrialStatus.CAPPED, train_s=0.62))
    else:
        rows.append(_row(RUNNER, "confirmation", runner_s, 1))
    return rows


def test_a_largest_batch_stopped_before_the_target_is_stated_as_a_bound() -> None:
    rows = [*_race(None), _row((256, 1, 1.0), "search", None, 0, TrialStatus.CAPPED, 1.25),
            _row((256, 1, 2.0), "search", 0.8, 0)]  # fmt: skip
    text = verdict(_result(rows), raybatch.Target(0.97))
    assert "at its best swept LR, 256 x 1 at 2x the rule's LR (lr 0.2): 1.60x slower" in text
    assert "at the rule's LR, 256 x 1 at 1x the rule's LR (lr 0.1): at least 2.50x slower" in text
    assert "reached the target in 2 of 2 runs" in text and "lr 0.05" in text


def test_a_largest_batch_stopped_sooner_than_the_winner_reached_is_not_called_slower() -> None:
    rows = [*_race(None), _row((256, 1, 1.0), "search", None, 0, TrialStatus.CAPPED, 0.26)]
    text = verdict(_result(rows), raybatch.Target(0.97))
    assert "at the rule's LR, 256 x 1 at 1x the rule's LR (lr 0.1): no comparison: stopped" in text
    assert "0.52x slower" not in text  # a bound below 1 proves no order


def test_a_winner_no_fresh_seed_ran_is_flagged_as_unconfirmed() -> None:
    searched = [_row(WINNER, "search", 0.5, 0), _row(RUNNER, "search", 0.7, 0)]
    assert NOT_CONFIRMED in verdict(_result(searched), raybatch.Target(0.97))
    assert NOT_CONFIRMED not in verdict(_result(_race(0.6)), raybatch.Target(0.97))


def test_a_runner_up_inside_the_indifference_zone_is_called_within_noise() -> None:
    text = verdict(_result(_race(0.5)), raybatch.Target(0.97))
    assert "within noise of it" in text and "10% indifference zone" in text


def test_a_runner_up_capped_on_the_fresh_seed_never_wins_and_the_cost_is_said() -> None:
    result = _result(_race(None))
    assert result.best is not None and result.best.config.micro_batch_size == 32
    text = verdict(result, raybatch.Target(0.97))
    # Held seconds: 3x each run's training (1.5 + 1.8 + 1.56 + 1.86), over the winner's 0.51 s.
    assert "This search cost 13.2 trainings of the recipe it found" in text


def test_when_the_largest_batch_wins_the_verdict_says_so() -> None:
    """A useful answer, not a failure: nothing beat the largest batch at its best LR."""
    rows = [_row((256, 1, 2.0), "search", 0.4, 0), _row(WINNER, "search", 0.5, 0),
            _row((256, 1, 2.0), "confirmation", 0.41, 1),
            _row(WINNER, "confirmation", None, 1, TrialStatus.CAPPED, 0.49)]  # fmt: skip
    text = verdict(_result(rows), raybatch.Target(0.97))
    assert "best swept LR, 256 x 1 at 2x the rule's LR (lr 0.2): is the winner itself" in text


def test_a_search_where_nothing_reached_says_there_was_nothing_to_confirm_and_its_price() -> None:
    rows = [_row(WINNER, "search", None, 0, TrialStatus.DIVERGED, train_s=0.7)]
    text = verdict(_result(rows), raybatch.Target(0.97))
    assert text.splitlines() == [
        "No trial of the search reached accuracy>=0.97: there was nothing to confirm.",
        "Its one trial diverged.",  # why, as the CLI's error says it
        "It spent 2.1 device-seconds in 1 run(s).",  # no recipe's training to count it in
    ]


def test_the_comparison_plot_draws_every_run_not_only_the_medians(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import raybatch.report as report

    saved: list[Any] = []
    monkeypatch.setattr(report, "_save", lambda fig, out: saved.append(fig))
    runs = {"winner": (WINNER, (0.4, 0.5, 0.6)), "max batch": ((256, 1, 1.0), (0.6, 0.7))}
    entries = {name: report._summary([_row(knobs, "search", t, i) for i, t in enumerate(times)])
               for name, (knobs, times) in runs.items()}  # fmt: skip
    report._plot_comparison({n: e for n, e in entries.items() if e is not None}, Path("x.png"))
    dots = [c for c in saved[0].axes[0].collections if c.get_offsets().shape[0]]
    assert sorted(len(c.get_offsets()) for c in dots) == [2, 3]


def test_an_alternative_that_raced_the_winner_is_compared_seed_by_seed() -> None:
    """The largest batch at its best LR was the runner-up: the verdict compares it over the
    race's pairs (within noise here), not from its one search run (1.2x)."""
    tuned = (256, 1, 2.0)
    rows = [_row(WINNER, "search", 0.5, 0), _row(tuned, "search", 0.6, 0),
            _row(WINNER, "confirmation", 0.52, 1), _row(tuned, "confirmation", 0.5, 1)]  # fmt: skip
    text = verdict(_result(rows), raybatch.Target(0.97))
    assert "(lr 0.2): within noise (paired ratio 1.07; 1 of 2 pairs won by the winner)" in text


def test_the_page_compares_every_recipe_the_verdict_names_and_bounds_the_unreached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table and the bars show what the verdict compares: the largest batch at its best
    swept LR beside the one at the rule's LR (which never reached: its bar is the time it
    trained, hatched, marked "not reached"), each with its LR and how often it reached."""
    import dataclasses

    import matplotlib.pyplot as plt

    import raybatch.report as report

    tuned, at_rule = (256, 1, 2.0), (256, 1, 1.0)
    rows = [_row(WINNER, "search", 0.5, 0), _row(tuned, "search", 0.7, 0),
            _row(at_rule, "search", None, 0, TrialStatus.CAPPED, train_s=0.9),
            _row(WINNER, "confirmation", 0.52, 1)]  # fmt: skip
    result = dataclasses.replace(_result(rows), run_dir=tmp_path)
    drawn: list[Any] = []
    page_path = report.write_report(result, SPACE, raybatch.Target(0.97), None, None)
    page = page_path.read_text()
    assert "<td>max batch, best LR</td><td>256 x 1 at 2x (lr 0.2)</td><td>256</td>" in page
    assert "<td>1 of 1</td><td>0.700</td>" in page
    assert "<td>max batch</td><td>256 x 1 at 1x (lr 0.1)</td><td>256</td><td>0 of 1</td>" in page
    assert (tmp_path / "comparison.png").is_file()
    winner, unreached = report._summary(rows[:1]), report._summary(rows[2:3])
    assert winner is not None and unreached is not None and unreached.time is None
    monkeypatch.setattr(report, "_save", lambda fig, out: drawn.append(fig))
    report._plot_comparison({"winner": winner, "max batch": unreached}, tmp_path / "x.png")
    time_axes = drawn[0].axes[0]
    bound = time_axes.patches[1]
    assert bound.get_height() == 0.9 and bound.get_hatch() == "//"
    assert any("not reached" in t.get_text() for t in time_axes.texts)
    plt.close(drawn[0])


def test_a_winner_that_met_its_runner_up_at_a_level_says_its_time_is_its_search_runs() -> None:
    """The race's two trained to a level on the fresh seed: the winner's time and its count
    of runs to the target are its search run's, and the verdict says where the two met."""
    rows = [_row(WINNER, "search", 0.5, 0), _row(RUNNER, "search", 0.52, 0)]
    for knobs, time_s in ((WINNER, 0.25), (RUNNER, 0.28)):
        met = _row(knobs, "confirmation", time_s, 1)
        rows.append(TrialRow.of(met.config, met.phase, met.trial_id, met.status,
                                time_to_target_s=time_s, train_s=time_s, seed=1,
                                meet_level=0.61))  # fmt: skip
    text = verdict(_result(rows), raybatch.Target(0.97))
    assert "reaches accuracy>=0.97 in 0.50 s" in text and "in 1 of 1 runs" in text
    assert "on a fresh seed it met the runner-up at 0.61" in text and NOT_CONFIRMED not in text
