"""Choosing the winner: the candidates of the search, the rows of the seeded points (max-batch
baseline, reference), and the one rule that picks the fastest recipe among everything confirmed."""

from __future__ import annotations

import math
import platform
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raybatch import keys
from raybatch.errors import ConfigError, Issue
from raybatch.export import BestConfig
from raybatch.metric import Target
from raybatch.results.rows import TrialRow
from raybatch.version import __version__


def _knobs(row: TrialRow) -> tuple[float, ...]:
    return tuple(float(k) for k in row.knobs)


def same_knobs(row: TrialRow, others: list[TrialRow]) -> bool:
    return any(_knobs(row) == _knobs(o) for o in others)


def runs_point(knobs: Mapping[str, Any], point: dict[str, Any]) -> bool:
    """Whether raw ``knobs`` (a row's :meth:`~TrialRow.knob_dict`, a recipe's ``to_dict()``)
    are the seeded ``point`` (the max-batch baseline or the reference).

    The point fixes integer knobs; the multipliers are the rule's own (1.0). Rows read back
    from ``trials.csv`` carry floats through text, hence a relative tolerance, not ``==``.
    """
    return (
        all(int(knobs[k]) == int(v) for k, v in point.items())
        and math.isclose(float(knobs[keys.LR_MULTIPLIER]), 1.0, rel_tol=1e-9)
        and math.isclose(float(knobs[keys.WEIGHT_DECAY_MULTIPLIER]), 1.0, rel_tol=1e-9)
    )


def comparison_rows(rows: list[TrialRow], *points: dict[str, Any] | None) -> list[TrialRow]:
    """The search rows of the baseline and reference points (LR and WD multipliers 1)."""
    out: list[TrialRow] = []
    for point in points:
        if point is None:
            continue
        for r in rows:
            search = r.phase == keys.PHASE_SEARCH
            if search and runs_point(r.knob_dict(), point) and not same_knobs(r, out):
                out.append(r)
                break
    return out


def candidates(rows: list[TrialRow], top: int) -> list[TrialRow]:
    reached = sorted((r for r in rows if r.reached), key=_time)
    out, seen = [], set()
    for r in reached:
        knobs = _knobs(r)
        if knobs not in seen:
            seen.add(knobs)
            out.append(r)
        if len(out) == top:
            break
    return out


def _versions() -> dict[str, str]:
    import optuna
    import ray
    import torch

    return {
        "raybatch": __version__,
        "torch": str(torch.__version__),
        "ray": ray.__version__,
        "optuna": optuna.__version__,
        "python": platform.python_version(),
    }


def _device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return str(torch.cuda.get_device_name(0))
    return f"CPU ({platform.machine()})"


@dataclass(frozen=True)
class Measured:
    """One recipe's runs that decide the winner, and their verdict.

    Attributes:
        runs: The rows measuring it: its confirmation runs, or (with no confirmation) its
            search rows.
        times: Training times to target of the runs that reached it.
    """

    runs: list[TrialRow]
    times: list[float]

    @property
    def always_reached(self) -> bool:
        return bool(self.runs) and len(self.times) == len(self.runs)

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else math.inf


def measured_recipes(rows: list[TrialRow], confirmed: bool) -> list[Measured]:
    """Every recipe with the runs that judge it, in the order first seen.

    With a confirmation, a recipe is judged by its confirmation runs alone — search candidates,
    the max-batch baseline and the reference alike, since they ran side by side under the same
    seeds; without one, by its search rows.
    """
    phase = keys.PHASE_CONFIRMATION if confirmed else keys.PHASE_SEARCH
    groups: dict[tuple[float, ...], list[TrialRow]] = {}
    for row in rows:
        if row.phase == phase:
            groups.setdefault(_knobs(row), []).append(row)
    return [Measured(runs, [_time(r) for r in runs if r.reached]) for runs in groups.values()]


def paired_times(a: Measured, b: Measured) -> list[tuple[float, float]]:
    """The two recipes' times on the same seeds (confirmation runs carry their seed; rows
    without one pair in order). Same seed, same data order and initialisation: the pair's
    ratio cancels what the seed does to both."""
    if all(r.seed is not None for r in a.runs + b.runs):
        # A run that missed the target lost its pair (its time counts as infinite).
        times_b = {r.seed: _time(r) for r in b.runs}
        pairs = [(_time(r), times_b[r.seed]) for r in a.runs if r.seed in times_b]
        return [(x, y) for x, y in pairs if math.isfinite(x) or math.isfinite(y)]
    return list(zip(a.times, b.times, strict=False))


def _time(row: TrialRow) -> float:
    if not row.reached or row.time_to_target_s is None:
        return math.inf
    return row.time_to_target_s


@dataclass(frozen=True)
class Paired:
    """The winner against the runner-up, seed by seed.

    Attributes:
        ratio: Median over pairs of runner-up time / winner time (> 1: the winner is faster).
        wins: Pairs the winner won.
        pairs: Pairs compared.
    """

    ratio: float
    wins: int
    pairs: int

    @property
    def decisive(self) -> bool:
        """Whether the pairs agree enough to call it: every pair the same way (at least two),
        or one side ahead by three pairs or more (a sequential sign test's stopping rule)."""
        losses = self.pairs - self.wins
        unanimous = self.pairs >= 2 and (self.wins == self.pairs or losses == self.pairs)
        return unanimous or abs(self.wins - losses) >= 3


def compare_paired(winner: Measured, runner_up: Measured) -> Paired | None:
    pairs = paired_times(winner, runner_up)
    if not pairs:
        return None
    ratio = statistics.median(b / a if math.isfinite(a) else 0.0 for a, b in pairs)
    return Paired(ratio, sum(1 for a, b in pairs if a < b), len(pairs))


def ranked(rows: list[TrialRow], confirmed: bool) -> list[Measured]:
    """The recipes that reached the target in every run that judges them, best first: by
    median, except that the top two are ordered by their paired runs when they share seeds."""
    measured = measured_recipes(rows, confirmed)
    shared = _shared_seeds(measured)
    # Eligible: reached the target on every seed all recipes ran. The race's extra seeds are
    # run by the two best alone: a miss there loses a pair, it does not hand a third the win.
    eligible = sorted((m for m in measured if _reached_on(m, shared)), key=lambda m: m.median)
    if len(eligible) >= 2:
        paired = compare_paired(eligible[0], eligible[1])
        if paired is not None and paired.ratio < 1:
            eligible[0], eligible[1] = eligible[1], eligible[0]
    return eligible


def _shared_seeds(measured: list[Measured]) -> set[int] | None:
    """The seeds every recipe ran on (``None``: rows without seeds, judge every run)."""
    runs = [r for m in measured for r in m.runs]
    if not runs or any(r.seed is None for r in runs):
        return None
    seeds = [{r.seed for r in m.runs if r.seed is not None} for m in measured]
    return set.intersection(*seeds)


def _reached_on(m: Measured, seeds: set[int] | None) -> bool:
    if not seeds:
        return m.always_reached
    judged = [r for r in m.runs if r.seed in seeds]
    return bool(judged) and all(r.reached for r in judged)


def select_winner(rows: list[TrialRow], confirmed: bool) -> Measured | None:
    """The fastest recipe that reached the target in every run that judges it, whichever it is.

    The one rule the search, :func:`raybatch.analyze_run` and the report share: among recipes
    that never missed, the lowest median training time to target -- and between the two best,
    the one faster seed by seed (the median of their paired ratios), since a median of
    independent runs on a noisy machine can pick the slower of two close recipes. A search
    candidate, the max-batch baseline or the reference may win; when the largest batch that
    fits wins, that is the answer (the verdict says so), not a failure. Ties go to the recipe
    seen first.
    """
    order = ranked(rows, confirmed)
    return order[0] if order else None


def choose_winner(
    target: Target,
    rows: list[TrialRow],
    confirmed: bool,
    measured_on: dict[str, Any] | None = None,
) -> BestConfig | None:
    """The winner (:func:`select_winner`) as an exportable recipe with its provenance.

    ``confirmed``: whether the search ran a confirmation (then its runs alone judge).
    ``measured_on`` holds what the rows cannot say: ``device`` (the hardware the trials ran
    on, as the search saw the cluster) and ``amp_dtype`` (the workload's autocast, which the
    framework exports need); without it, ``device`` is this machine's. The winner's recipe is
    the one its rows carry (:attr:`TrialRow.config`); rows read back from ``trials.csv`` get
    theirs with :meth:`TrialRow.derived_under` first.

    Raises:
        ConfigError: The winner's rows carry no recipe (rows read back and not derived, or
            knobs the run's space now refuses).
    """
    order = ranked(rows, confirmed)
    if not order:
        return None
    winner = order[0]
    first = winner.runs[0]
    searched = [r for r in rows if r.phase == keys.PHASE_SEARCH and same_knobs(r, [first])]
    recipe = next((r.config for r in winner.runs if r.config is not None), None)
    if recipe is None:
        problem = "carries no recipe: derive the rows under the run's space (derived_under)"
        raise ConfigError([Issue("recipe", problem)], f"trial {first.trial_id}")
    peaks = [r.peak_memory_bytes for r in winner.runs if r.peak_memory_bytes]
    samples = [r.samples_to_target for r in winner.runs if r.samples_to_target is not None]
    provenance = {
        "median_time_to_target_s": winner.median,
        "time_to_target_s_runs": winner.times,
        "spread_s": max(winner.times) - min(winner.times),
        "samples_to_target": statistics.median(samples) if samples else None,
        "peak_memory_bytes": max(peaks) if peaks else None,
        "device": _device_name(),
        "amp_dtype": None,
        "versions": _versions(),
        keys.TRIAL_ID: (searched or winner.runs)[0].trial_id,
        "space": recipe.space,
        "target": str(target),
        "search_trials": sum(1 for r in rows if r.phase == keys.PHASE_SEARCH),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if len(order) > 1:
        paired = compare_paired(winner, order[1])
        if paired is not None:
            second = order[1].runs[0]
            provenance["runner_up"] = {
                **second.knob_dict(),
                "paired_ratio": paired.ratio,
                "wins": paired.wins,
                "pairs": paired.pairs,
                "within_noise": None if paired.pairs < 2 else not paired.decisive,
            }
    provenance.update(measured_on or {})
    return BestConfig(recipe, provenance)
