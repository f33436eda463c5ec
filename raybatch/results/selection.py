"""Choosing the winner: the candidates of the search, the rows of the seeded points (max-batch
baseline, reference), and the one rule that picks the fastest recipe among everything confirmed."""

from __future__ import annotations

import math
import platform
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from raybatch import keys
from raybatch.export import BestConfig
from raybatch.keys import KnobPoint, knob_items
from raybatch.metric import Target
from raybatch.provenance import Comparison, Provenance, RunnerUp
from raybatch.results.cost import search_cost
from raybatch.results.rows import TrialRow
from raybatch.status import INDIFFERENCE_ZONE, TrialStatus, is_packed
from raybatch.version import __version__

INDIFFERENCE = 1.0 + INDIFFERENCE_ZONE
"""The indifference zone of a paired comparison: two recipes whose median paired ratio is
within 10 % of 1 are "within noise" of each other (the same recipe's runs spread about that
much on a shared machine, ``bench/results/real_training.json``'s ``rerun_spread``)."""


def _knobs(row: TrialRow) -> tuple[float, ...]:
    return tuple(float(k) for k in row.knobs)


def same_knobs(row: TrialRow, others: list[TrialRow]) -> bool:
    return any(_knobs(row) == _knobs(o) for o in others)


def runs_point(knobs: Mapping[str, Any], point: KnobPoint) -> bool:
    """Whether raw ``knobs`` (a row's :meth:`~TrialRow.knob_dict`, a recipe's ``to_dict()``)
    are the seeded ``point`` (the max-batch baseline or the reference).

    The point fixes integer knobs; the multipliers are the rule's own (1.0). Rows read back
    from ``trials.csv`` carry floats through text, hence a relative tolerance, not ``==``.
    """
    return (
        all(int(knobs[k]) == int(v) for k, v in knob_items(point))
        and math.isclose(float(knobs[keys.LR_MULTIPLIER]), 1.0, rel_tol=1e-9)
        and math.isclose(float(knobs[keys.WEIGHT_DECAY_MULTIPLIER]), 1.0, rel_tol=1e-9)
    )


def comparison_rows(rows: list[TrialRow], *points: KnobPoint | None) -> list[TrialRow]:
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


def measured_alike(rows: list[TrialRow]) -> list[TrialRow]:
    """The search rows whose times compare with each other: the runs that held their device
    alone, where one of them reached the target; else the runs packed at the share most of the
    reached ones had. A packed run's clock runs at the pace its neighbours leave it, so its
    time is no measure beside a lone one's (nor beside one packed otherwise)."""
    search = [r for r in rows if r.phase == keys.PHASE_SEARCH]
    kinds = Counter(_packing(r) for r in search if r.reached)
    if not kinds:
        return search
    kind = None if None in kinds else kinds.most_common(1)[0][0]
    return [r for r in search if _packing(r) == kind]


def _packing(row: TrialRow) -> float | None:
    """How a run held its device: ``None`` alone, else its share of a GPU."""
    share = row.gpu_share
    return round(float(share), 6) if share is not None and is_packed(share) else None


def candidates(rows: list[TrialRow], top: int) -> list[TrialRow]:
    """The confirmation's entrants: the ``top`` fastest recipes that reached the target among
    the search's runs measured alike (:func:`measured_alike`), one run each."""
    reached = sorted((r for r in measured_alike(rows) if r.reached), key=_time)
    out, seen = [], set()
    for r in reached:
        knobs = _knobs(r)
        if knobs not in seen:
            seen.add(knobs)
            out.append(r)
        if len(out) == top:
            break
    return out


def _label(row: TrialRow) -> str:
    return (
        f"{row.micro_batch_size} x {row.accumulation_steps}"
        + (f" x {row.world_size} workers" if row.world_size > 1 else "")
        + f" at {row.lr_multiplier:.3g}x the rule's LR (lr {row.lr:.4g})"
    )


def _against(row: TrialRow | None, winner_s: float, winner: Measured,
             raced: list[Measured]) -> Comparison | None:  # fmt: skip
    """One comparison: paired over the race's seeds where the alternative raced the winner,
    else from the search run alone (same seed as the winner's search run).

    A run that reached gives a measured ratio; one stopped before the target (capped or
    censored at its time cap) gives a lower bound, its training seconds over the winner's
    time: a capped run proves "at least this much slower", and running it on to the target
    would prove nothing more at full price."""
    if row is None:
        return None
    out = partial(Comparison, _label(row), row.knob_dict(), row.status.value)
    if same_knobs(row, winner.runs[:1]):
        return out(1.0, "measured", is_winner=True)
    rival = next((m for m in raced if same_knobs(row, m.runs[:1])), None)
    # Paired only where every run of the rival reached: a capped run has no time, and its
    # stand-in in the ratio (100x) is no figure to print; the search run says it then.
    paired = compare_paired(winner, rival) if rival is not None and rival.always_reached else None
    if paired is not None and paired.pairs >= 2:
        return out(paired.ratio, "paired", pairs=paired.pairs, wins=paired.wins,
                   within_noise=paired.within_noise())  # fmt: skip
    if row.reached and row.time_to_target_s is not None:
        ratio = row.time_to_target_s / winner_s
        return out(ratio, "measured", time_to_target_s=row.time_to_target_s)
    if row.status in (TrialStatus.CAPPED, TrialStatus.CENSORED) and row.train_s:
        return out(row.train_s / winner_s, "at_least", train_s=row.train_s)
    return out(None, None, reason=row.reason)


def _first(rows: list[TrialRow]) -> TrialRow | None:
    return rows[0] if rows else None


def comparisons(
    rows: list[TrialRow],
    winner: Measured,
    baseline: KnobPoint | None,
    reference: KnobPoint | None,
    raced: list[Measured] | None = None,
) -> dict[str, Comparison]:
    """The winner against the simple alternatives, each from its search run: the largest batch
    that fits at the rule's LR (``max_batch``), the same batch at its best LR of the plan's
    sweep (``max_batch_tuned``) and the reference recipe (``reference``). Ratios > 1: the
    winner is faster; ``bound: at_least`` where the alternative never reached the target,
    ``paired`` where it raced the winner (``raced``: the recipes the confirmation judged)."""
    searched = [r for r in rows if r.phase == keys.PHASE_SEARCH]
    mine = [r for r in searched if same_knobs(r, winner.runs[:1]) and r.reached]
    winner_s = _time(mine[0]) if mine else winner.median
    out: dict[str, Comparison] = {}
    tuned: TrialRow | None = None
    if baseline is not None:
        batch = knob_items(baseline)
        at_batch = [r for r in searched if all(int(getattr(r.config, k)) == v for k, v in batch)]
        reached = sorted((r for r in at_batch if r.reached), key=_time)
        stopped = sorted(at_batch, key=lambda r: -(r.train_s or 0.0))
        tuned = reached[0] if reached else (stopped[0] if stopped else None)
    chosen: list[tuple[str, TrialRow | None]] = [
        ("max_batch", _first(comparison_rows(searched, baseline))),
        ("max_batch_tuned", tuned),
        ("reference", _first(comparison_rows(searched, reference))),
    ]
    for name, row in chosen:
        compared = _against(row, winner_s, winner, raced or [])
        if compared is not None:
            out[name] = compared
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
        times: Training times to target of the runs that reached it (a confirmation run to
            its meeting level pairs with its rival's on the same seed, and is not among them).
    """

    runs: list[TrialRow]
    times: list[float]

    @property
    def always_reached(self) -> bool:
        """Whether every run reached what it trained to (the target, or the meeting level)."""
        return bool(self.runs) and all(r.reached for r in self.runs)

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else math.inf


def measured_recipes(rows: list[TrialRow], confirmed: bool) -> list[Measured]:
    """Every recipe with the runs that judge it, in the order first seen.

    With a confirmation, the recipes it ran are judged by their confirmation runs *and* their
    search runs: every search trial runs on the search's seed, so the search's run of two
    recipes is their first pair (the confirmation adds fresh seeds). A search run the capping
    scheduler stopped is left out: it was stopped to save time for another, not measured. A
    recipe the confirmation did not run is not judged, unless it ran none (the search's runs
    decided the race: one led by more than the noise). Without a confirmation, a recipe is
    judged by its search rows measured alike (:func:`measured_alike`: lone runs, where one
    reached; a packed run's time is no measure beside them).
    """
    judged: set[tuple[float, ...]] | None = None
    phases: tuple[str, ...] = (keys.PHASE_SEARCH,)
    if confirmed:
        # A race the search's runs decided (one led by more than the noise) ran nothing: then
        # those runs judge, as the race's first pair would have.
        judged = {_knobs(r) for r in rows if r.phase == keys.PHASE_CONFIRMATION} or None
        phases = (keys.PHASE_CONFIRMATION, keys.PHASE_SEARCH)
    else:  # the search's runs alone judge: only those measured alike
        rows = measured_alike(rows)
    groups: dict[tuple[float, ...], list[TrialRow]] = {}
    for row in rows:
        if row.phase not in phases or (judged is not None and _knobs(row) not in judged):
            continue
        if confirmed and not judges(row):
            continue
        groups.setdefault(_knobs(row), []).append(row)
    return [measured(runs) for runs in groups.values()]


def judges(row: TrialRow) -> bool:
    """Whether a row judges its recipe in a confirmed search: every confirmation run (each runs
    alone on its device), and the search runs the capping scheduler did not stop (those were
    stopped for another's sake) that ran alone (a packed run's time depends on its neighbours:
    it is not comparable with a lone one)."""
    if row.phase == keys.PHASE_CONFIRMATION:
        return True
    return (
        row.phase == keys.PHASE_SEARCH
        and row.status is not TrialStatus.CAPPED
        and not is_packed(row.gpu_share)
    )


def measured(runs: list[TrialRow]) -> Measured:
    """A recipe's runs with the times of those that reached the target."""
    return Measured(runs, [_time(r) for r in runs if r.to_target])


def paired_times(a: Measured, b: Measured) -> list[tuple[float, float]]:
    """The two recipes' times on the same seeds (confirmation runs carry their seed; rows
    without one pair in order). Same seed, same data order and initialisation: the pair's
    ratio cancels what the seed does to both."""
    if all(r.seed is not None for r in a.runs + b.runs):
        # One pair per seed (a recipe the search ran twice on its seed counts once, at the
        # median of its runs there); a run that missed the target lost its pair (infinite).
        times_a, times_b = _per_seed(a), _per_seed(b)
        pairs = [(times_a[s], times_b[s]) for s in sorted(times_a) if s in times_b]
        return [(x, y) for x, y in pairs if math.isfinite(x) or math.isfinite(y)]
    return list(zip(a.times, b.times, strict=False))


def _per_seed(m: Measured) -> dict[int, float]:
    """A recipe's time per seed: the median of its runs on that seed (infinite if one of them
    missed the target)."""
    by_seed: dict[int, list[float]] = {}
    for r in m.runs:
        if r.seed is not None:
            by_seed.setdefault(r.seed, []).append(_time(r))
    return {s: statistics.median(t) if all(map(math.isfinite, t)) else math.inf
            for s, t in by_seed.items()}  # fmt: skip


def _time(row: TrialRow) -> float:
    if not row.reached or row.time_to_target_s is None:
        return math.inf
    return row.time_to_target_s


@dataclass(frozen=True)
class Paired:
    """The winner against the runner-up, seed by seed.

    Attributes:
        ratio: Runner-up time / winner time, the median over pairs taken in log space (so the
            comparison is symmetric: ``b`` against ``a`` is exactly ``1 / ratio``; > 1: the
            winner is faster).
        wins: Pairs the winner won.
        pairs: Pairs compared.
    """

    ratio: float
    wins: int
    pairs: int

    def within_noise(self, zone: float = INDIFFERENCE) -> bool:
        """Whether the median paired ratio lies inside the indifference zone (``1/zone`` to
        ``zone``): the two are called equal, "within noise", whatever the pairs' signs."""
        return 1 / zone < self.ratio < zone

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
    logs = [_log_ratio(a, b) for a, b in pairs]
    return Paired(math.exp(statistics.median(logs)), sum(1 for a, b in pairs if a < b), len(pairs))


RATIO_CLAMP = 100.0
"""A pair where one run missed the target has no finite ratio; it counts as this far apart."""


def _log_ratio(a: float, b: float) -> float:
    """``log(b / a)``, clamped: one missed run (infinite time) counts as :data:`RATIO_CLAMP`."""
    bound = math.log(RATIO_CLAMP)
    if not math.isfinite(a):
        return -bound
    if not math.isfinite(b):
        return bound
    return max(-bound, min(bound, math.log(b / a)))


def ranked(rows: list[TrialRow], confirmed: bool) -> list[Measured]:
    """The recipes that reached the target in every run that judges them, best first: by
    median, except that the top two are ordered by their paired runs when they share seeds.

    A recipe that missed the target once (censored, diverged, or capped in a confirmation run
    at a slack of its rival's time on the same seed) never wins, however fast its other runs.
    """
    eligible = sorted(
        (m for m in measured_recipes(rows, confirmed) if m.always_reached), key=lambda m: m.median
    )
    if len(eligible) >= 2:
        paired = compare_paired(eligible[0], eligible[1])
        if paired is not None and paired.ratio < 1:
            eligible[0], eligible[1] = eligible[1], eligible[0]
    return eligible


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
    measured_on: Provenance | None = None,
    sessions: Sequence[float] = (),
    slots: int | None = None,
) -> BestConfig | None:
    """The winner (:func:`select_winner`) as an exportable recipe with its provenance.

    ``confirmed``: whether the search ran a confirmation (then its runs alone judge).
    ``measured_on`` holds what the rows cannot say (:meth:`Provenance.measured_on`): ``device``
    (the hardware the trials ran on, as the search saw the cluster), ``amp_dtype`` (the
    workload's autocast, which the framework exports need), ``grad_clip_norm``, the time model
    (``prior``), ``baseline_point`` and ``reference_point`` (the largest batch as found and the
    reference, which the verdict compares with: ``compared``); without it, ``device`` is this
    machine's. ``sessions``: when each driver session started (the search, each resume), so
    that the cost's wall clock leaves out the time a run lay interrupted; ``slots``: the trials
    the search ran at once (``None``: the most runs that overlapped). The winner's recipe
    is the one its rows carry (:attr:`TrialRow.config`).
    """
    order = ranked(rows, confirmed)
    if not order:
        return None
    winner = order[0]
    first = winner.runs[0]
    searched = [r for r in rows if r.phase == keys.PHASE_SEARCH and same_knobs(r, [first])]
    recipe = winner.runs[0].config
    peaks = [r.peak_memory_bytes for r in winner.runs if r.peak_memory_bytes]
    samples = [r.samples_to_target for r in winner.runs
               if r.to_target and r.samples_to_target is not None]  # fmt: skip
    given = measured_on if measured_on is not None else Provenance()
    if given.device is None:  # the rows alone: the trials ran here, as far as anyone can say
        given = replace(given, device=_device_name())
    runner_up = None
    if len(order) > 1:
        paired = compare_paired(winner, order[1])
        if paired is not None:
            second = order[1].runs[0].knob_dict()
            runner_up = RunnerUp(second, paired.ratio, paired.wins, paired.pairs,
                                 paired.within_noise(), INDIFFERENCE_ZONE)  # fmt: skip
    provenance = replace(
        given,
        median_time_to_target_s=winner.median,
        time_to_target_s_runs=winner.times,
        spread_s=max(winner.times) - min(winner.times) if len(winner.times) > 1 else None,
        samples_to_target=statistics.median(samples) if samples else None,
        peak_memory_bytes=max(peaks) if peaks else None,
        versions=_versions(),
        trial_id=(searched or winner.runs)[0].trial_id,
        space=recipe.space,
        target=str(target),
        search_trials=sum(1 for r in rows if r.phase == keys.PHASE_SEARCH),
        created=time.strftime("%Y-%m-%dT%H:%M:%S"),
        runner_up=runner_up,
        compared=comparisons(rows, winner, given.baseline_point, given.reference_point,
                             measured_recipes(rows, confirmed)),
        search_cost=search_cost(rows, winner.median, slots=slots, sessions=sessions),
    )  # fmt: skip
    return BestConfig(recipe, provenance)
