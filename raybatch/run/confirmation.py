"""The confirmation: the best candidates (and the baselines) re-run with fresh seeds, paired.

A search ranks candidates on one run each, on a shared machine; the confirmation re-measures
them, uncapped, so the winner is the recipe that reached the target every time, fastest. Every
recipe runs on the same seeds, so two recipes compare seed by seed
(:func:`raybatch.results.selection.compare_paired`); when the two best still disagree from pair
to pair, they *race* (F-race, Birattari et al. 2002; irace): one more seed each, until one is
ahead by three pairs or ``race_seeds`` more seeds are spent, and the winner's provenance says
"within noise" when they never separate. On GPUs every confirmation run holds a whole GPU
(``alone`` in its config), never packed with neighbours: it is a measurement.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from raybatch import keys
from raybatch.results.rows import TrialRow
from raybatch.results.selection import compare_paired, ranked
from raybatch.run.options import SearchOptions
from raybatch.run.scheduler import CappingScheduler
from raybatch.space.config import TrialConfig
from raybatch.status import TrialStatus


class _Pick:
    """``tune.sample_from`` callable: one value of the recipe a confirmation trial runs."""

    def __init__(self, recipes: list[dict[str, Any]], key: str) -> None:
        self.values = [r[key] for r in recipes]
        self.key = key

    def __call__(self, config: dict[str, Any]) -> Any:
        return self.values[config[keys.CANDIDATE]]


def confirm(
    path: Path,
    resourced: Any,
    candidates: list[TrialRow],
    options: SearchOptions,
    verbose: int,
    max_concurrent: int | None,
    whole_gpus: bool = False,
    seeds: list[int] | None = None,
) -> list[TrialRow]:
    """Re-run each candidate on the same fresh seeds (default: ``confirm_seeds`` of them; no
    capping: every run must finish honestly); with ``whole_gpus``, each run alone on its GPU.

    Each run's config carries its candidate's recipe (:attr:`TrialRow.config`, the one the
    search measured), and its row carries it back: nothing is derived again here.

    Raises:
        ValueError: A candidate carries no recipe (a row read back from ``trials.csv``).
    """
    seeds = seeds if seeds is not None else confirmation_seeds(options)
    if not candidates or not seeds:
        return []
    from ray import tune

    recipes = [_recipe_of(c).to_dict() for c in candidates]
    param_space: dict[str, Any] = {
        keys.CANDIDATE: tune.grid_search(list(range(len(candidates)))),
        keys.SEED: tune.grid_search(seeds),
    }
    for key in recipes[0]:
        param_space[key] = tune.sample_from(_Pick(recipes, key))
    if whole_gpus:
        param_space[keys.ALONE] = True
    storage = str((path / "tune").resolve())
    tuner = tune.Tuner(
        resourced,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            max_concurrent_trials=max_concurrent,
            scheduler=CappingScheduler(
                enabled=False, hang_after_s=options.max_time_s + options.hang_grace_s
            ),
        ),
        run_config=tune.RunConfig(
            storage_path=storage,
            name=f"confirm-{time.strftime('%Y%m%d-%H%M%S')}",
            verbose=min(verbose, 1),
        ),
    )
    rows = []
    for result in list(tuner.fit()):  # type: ignore[call-overload]
        metrics = dict(result.metrics or {})
        status = TrialStatus(metrics.get(keys.STATUS, TrialStatus.ERROR.value))
        trial_id = str(metrics.get(keys.TRIAL_ID, ""))
        run = {keys.CANDIDATE: result.config[keys.CANDIDATE], keys.SEED: result.config[keys.SEED]}
        recipe = TrialConfig.from_dict(result.config, "a confirmation run's Tune config")
        rows.append(TrialRow.from_result(
            recipe, keys.PHASE_CONFIRMATION, trial_id, status, metrics, **run
        ))  # fmt: skip
    return rows


def _recipe_of(candidate: TrialRow) -> TrialConfig:
    if candidate.config is None:
        raise ValueError(f"candidate {candidate.trial_id} carries no recipe to confirm")
    return candidate.config


def confirmation_slots(candidates: list[TrialRow], placeable_gpus: int) -> int:
    """Confirmation runs a GPU cluster can hold at once.

    Each run holds whole GPUs: one alone, or one per data-parallel worker. A data-parallel
    run's Tune trial holds no GPU itself and starts at once, then waits inside ``fit()`` for
    its workers; started beyond the room there is, it would wait past its hang clock and be
    ended as hung, losing for being queued. So at most the placeable GPUs over the widest
    world size run together (at least one).
    """
    widest = max((c.world_size for c in candidates), default=1)
    return max(1, placeable_gpus // max(widest, 1))


def confirmation_seeds(options: SearchOptions) -> list[int]:
    """The seeds every confirmed recipe runs on (fresh: the search's trials use ``seed``)."""
    return [options.seed + 1 + i for i in range(options.confirm_seeds)]


def race(
    path: Path,
    resourced: Any,
    rows: list[TrialRow],
    options: SearchOptions,
    verbose: int,
    max_concurrent: int | None,
    whole_gpus: bool = False,
) -> list[TrialRow]:
    """More paired seeds for the two best recipes while their pairs disagree; the new rows.

    Each round runs both on one more seed. It stops when one is ahead by three pairs (or won
    every pair), when another recipe moves into the top two and the pair is decided, or after
    ``race_seeds`` rounds; then the winner's provenance says whether the two stayed within
    noise. A confirmation of one seed asked for no repeated measurement: no race then.
    """
    extra: list[TrialRow] = []
    first = options.seed + 1 + options.confirm_seeds
    for round_ in range(options.race_seeds if options.confirm_seeds >= 2 else 0):
        order = ranked(rows + extra, confirmed=True)
        paired = compare_paired(order[0], order[1]) if len(order) >= 2 else None
        if paired is None or paired.decisive:
            break
        two = [order[0].runs[0], order[1].runs[0]]
        extra += confirm(path, resourced, two, options, verbose, max_concurrent,
                         whole_gpus, seeds=[first + round_])  # fmt: skip
    return extra
