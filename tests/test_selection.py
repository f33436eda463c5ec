"""The one rule that picks the winner, on constructed rows: the fastest recipe that reached the
target in every confirmation run, whichever it is (a candidate, the baseline, the reference)."""

from __future__ import annotations

import pytest

import raybatch
from raybatch import Target, keys
from raybatch.provenance import Provenance
from raybatch.results.rows import TrialRow
from raybatch.results.selection import choose_winner, measured_recipes, select_winner
from raybatch.status import TrialStatus

SPACE = raybatch.load_space("digits_cnn_sgd")
BASELINE = (256, 1, 1.0)  # the largest batch the space lists, at the rule's LR
REFERENCE = (64, 1, 1.0)
CANDIDATE = (32, 2, 1.3)


def _row(knobs: tuple[int, int, float], phase: str, time_s: float | None, trial: str = "t",
         samples: int = 1024, seed: int | None = None) -> TrialRow:  # fmt: skip
    micro, accumulation, lr_multiplier = knobs
    reached = time_s is not None
    return TrialRow.of(
        SPACE.derive(micro, accumulation, 1, lr_multiplier), phase, trial,
        TrialStatus.REACHED if reached else TrialStatus.CENSORED, time_to_target_s=time_s,
        samples_to_target=samples if reached else None, peak_memory_bytes=1000, seed=seed,
    )  # fmt: skip


def _confirmed(knobs: tuple[int, int, float], *times: float | None, first_seed: int | None = None
               ) -> list[TrialRow]:  # fmt: skip
    return [
        _row(knobs, keys.PHASE_CONFIRMATION, t, trial=f"c{i}",
             seed=None if first_seed is None else first_seed + i)
        for i, t in enumerate(times)
    ]  # fmt: skip


def _searched(*pairs: tuple[tuple[int, int, float], float]) -> list[TrialRow]:
    return [_row(k, keys.PHASE_SEARCH, t, trial=f"s{i}") for i, (k, t) in enumerate(pairs)]


def _knobs_of(rows: list[TrialRow]) -> tuple[int, int, float]:
    r = rows[0]
    return r.micro_batch_size, r.accumulation_steps, r.lr_multiplier


def test_the_baseline_wins_when_it_confirms_fastest() -> None:
    """The search's own candidate was faster once in the search; confirmation says otherwise
    (the search's runs count as one run each: 1.2, 1.1, 1.2, 1.0 for the baseline)."""
    rows = _searched((CANDIDATE, 1.0), (BASELINE, 1.2), (REFERENCE, 1.5))
    rows += _confirmed(CANDIDATE, 1.4, 1.5, 1.6) + _confirmed(BASELINE, 1.1, 1.2, 1.0)
    rows += _confirmed(REFERENCE, 1.9, 2.0, 2.1)
    winner = select_winner(rows, confirmed=True)
    assert winner is not None and _knobs_of(winner.runs) == BASELINE
    assert winner.median == pytest.approx(1.15)
    best = choose_winner(Target(0.97), rows, confirmed=True)
    assert best is not None and best.config.micro_batch_size == 256
    assert best.provenance.trial_id == "s1"  # the search trial that ran it
    # What the rows cannot say, given in part: the device the rest falls back to is this one.
    given = Provenance(baseline_point={"micro_batch_size": 256})
    chosen = choose_winner(Target(0.97), rows, confirmed=True, measured_on=given)
    assert chosen is not None and chosen.provenance.device == best.provenance.device is not None


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
    assert choose_winner(Target(0.97), rows, confirmed=True) is None


def test_without_confirmation_the_search_rows_decide() -> None:
    rows = _searched((CANDIDATE, 1.0), (BASELINE, 0.8), (REFERENCE, None))
    winner = select_winner(rows, confirmed=False)
    assert winner is not None and _knobs_of(winner.runs) == BASELINE
    best = choose_winner(Target(0.97), rows, confirmed=False)
    assert best is not None and best.provenance.time_to_target_s_runs == [0.8]


def _shared(knobs: tuple[int, int, float], time_s: float | None, share: float | None,
            trial: str) -> TrialRow:  # fmt: skip
    micro, accumulation, lr_multiplier = knobs
    return TrialRow.of(
        SPACE.derive(micro, accumulation, 1, lr_multiplier), keys.PHASE_SEARCH, trial,
        TrialStatus.REACHED if time_s is not None else TrialStatus.CENSORED,
        time_to_target_s=time_s, gpu_share=share,
    )  # fmt: skip


def test_only_runs_measured_alike_are_compared_for_the_race_and_an_unconfirmed_winner() -> None:
    """A packed run's clock runs at its neighbours' pace: beside lone runs it is no measure,
    faster or slower. Where a lone run reached, the race's entrants and a winner without
    confirmation come from lone runs; where none did, from the runs packed at the most common
    share, compared with each other."""
    from raybatch.results.selection import candidates

    rows = [_shared(CANDIDATE, 0.5, 0.25, "packed"), _shared(BASELINE, 1.0, None, "lone"),
            _shared(REFERENCE, 1.2, None, "lone2")]  # fmt: skip
    assert [r.trial_id for r in candidates(rows, 2)] == ["lone", "lone2"]
    winner = select_winner(rows, confirmed=False)
    assert winner is not None and _knobs_of(winner.runs) == BASELINE
    packed = [_shared(CANDIDATE, 0.9, 0.25, "a"), _shared(BASELINE, 0.7, 0.25, "b"),
              _shared(REFERENCE, 0.3, 0.5, "c")]  # fmt: skip
    assert [r.trial_id for r in candidates(packed, 2)] == ["b", "a"]
    winner = select_winner(packed, confirmed=False)
    assert winner is not None and _knobs_of(winner.runs) == BASELINE


def test_the_search_run_judges_a_confirmed_recipe_but_never_an_unconfirmed_one() -> None:
    """A recipe's search run is its first run (same seed as every other search trial); a
    recipe the confirmation never ran is not judged, however fast its search run."""
    rows = [_row(k, keys.PHASE_SEARCH, t, trial=f"s{k[0]}", seed=0)
            for k, t in ((CANDIDATE, 0.1), (REFERENCE, 0.05), (BASELINE, 1.0))]  # fmt: skip
    rows += _seeded(CANDIDATE, 2.0, 2.2) + _seeded(BASELINE, 1.0, 1.1)
    winner = select_winner(rows, confirmed=True)
    assert winner is not None and _knobs_of(winner.runs) == BASELINE
    measured = {_knobs_of(m.runs): m for m in measured_recipes(rows, confirmed=True)}
    assert measured[CANDIDATE].times == [0.1, 2.0, 2.2] and REFERENCE not in measured


def test_a_search_run_the_scheduler_capped_does_not_count_as_a_miss() -> None:
    """Capping in the search stopped a run for another's sake: not a verdict on the recipe."""
    capped = TrialRow.of(SPACE.derive(32, 2, 1, 1.3), keys.PHASE_SEARCH, "s9",
                         TrialStatus.CAPPED, train_s=2.0)  # fmt: skip
    rows = [capped, *_confirmed(CANDIDATE, 1.0, 1.1), *_confirmed(BASELINE, 1.5, 1.6)]
    winner = select_winner(rows, confirmed=True)
    assert winner is not None and _knobs_of(winner.runs) == CANDIDATE


def test_a_recipe_that_missed_once_never_wins_however_many_pairs_it_won() -> None:
    """It missed the target in 1 of 5 runs and won 4 of 5 pairs: it still cannot win (the
    promise is a recipe that reaches the target every time)."""
    rows = _seeded(CANDIDATE, 1.0, 1.0, None, 1.0, 1.0) + _seeded(BASELINE, 1.1, 1.1, 1.1, 1.1,
                                                                  1.1)  # fmt: skip
    winner = select_winner(rows, confirmed=True)
    assert winner is not None and _knobs_of(winner.runs) == BASELINE
    best = choose_winner(Target(0.97), rows, confirmed=True)
    assert best is not None and best.provenance.runner_up is None


def _seeded(knobs: tuple[int, int, float], *times: float | None, first_seed: int = 1
            ) -> list[TrialRow]:  # fmt: skip
    return _confirmed(knobs, *times, first_seed=first_seed)


def test_the_two_best_are_ordered_seed_by_seed_not_by_independent_medians() -> None:
    """Medians say the baseline (1.25 against 1.30); seed by seed the candidate won 2 of 3
    pairs, and the median of the paired ratios says it is about 7% faster."""
    rows = _seeded(CANDIDATE, 1.0, 1.30, 1.31) + _seeded(BASELINE, 1.1, 1.25, 1.4)
    winner = select_winner(rows, confirmed=True)
    assert winner is not None and _knobs_of(winner.runs) == CANDIDATE
    best = choose_winner(Target(0.97), rows, confirmed=True)
    assert best is not None
    runner_up = best.provenance.runner_up
    assert runner_up is not None
    assert runner_up.knobs["micro_batch_size"] == 256
    assert (runner_up.wins, runner_up.pairs) == (2, 3)
    assert runner_up.paired_ratio == pytest.approx(1.4 / 1.31)  # the median pair
    assert runner_up.within_noise is True  # 7 % apart: inside the 10 % zone


def test_pairs_follow_seeds_not_row_order() -> None:
    rows = _seeded(CANDIDATE, 1.0, 2.0, first_seed=1) + _seeded(BASELINE, 2.2, 1.1, first_seed=2)
    # Seed 2 is the one pair: 2.0 against 2.2.
    from raybatch.results.selection import compare_paired, measured_recipes

    a, b = measured_recipes(rows, confirmed=True)
    paired = compare_paired(a, b)
    assert paired is not None and (paired.wins, paired.pairs) == (1, 1)
    assert paired.ratio == pytest.approx(1.1)
