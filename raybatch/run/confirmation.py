"""The confirmation: a race of the search's two best recipes on paired seeds, cheap and honest.

A search ranks recipes on one run each; the confirmation checks the ranking of the two that
matter before a recipe is exported, and spends as little as it can doing so:

- **the search's run is the first pair**: every search trial ran on the search's seed, so the
  two best already have one paired comparison;
- **each round is one fresh seed, run in order**: the leader first, then the challenger,
  *capped* at ``slack`` x the leader's time on that seed (the search's own capping rule): a
  challenger that cannot reach by then is slower on that seed, and running it on to the target
  would prove nothing more at full price;
- **a recipe that misses the target in any run is out**
  (:func:`~raybatch.results.selection.ranked`); when one of the two drops out, the next
  candidate (up to ``confirm_top``) takes its place;
- **an indifference zone** (:data:`~raybatch.results.selection.INDIFFERENCE`): once two pairs
  agree, or their median paired ratio is within 10 % of 1 ("within noise", said in the
  verdict), the race ends; otherwise it goes on for at most ``confirm_seeds`` fresh seeds.

Two agreeing pairs cost one training of the leader and at most ``slack`` of the challenger.
The baseline and the reference are not re-run: the verdict compares the winner with them from
their search runs, as bounds where they were stopped before the target
(:func:`~raybatch.results.selection.comparisons`).

:class:`Race` holds the decisions and nothing else, so the simulated benchmark drives the same
object as the search (``bench/search_efficiency.py``); :func:`run_race` runs its rounds as
Ray Tune trials. On GPUs every confirmation run holds a whole GPU (``alone``): a measurement.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raybatch import keys
from raybatch.results.rows import TrialRow
from raybatch.results.selection import (
    Measured,
    candidates,
    compare_paired,
    judges,
    measured,
    same_knobs,
)
from raybatch.run.options import SearchOptions
from raybatch.run.resources import REUSE_ACTORS
from raybatch.run.scheduler import CappingScheduler
from raybatch.space.config import TrialConfig
from raybatch.status import final_status


@dataclass(frozen=True)
class Round:
    """One round of the race: the recipes to run on ``seed``, in order (the leader first, the
    challenger capped at ``slack`` x the leader's time on the same seed)."""

    entrants: list[TrialRow]
    seed: int


class Race:
    """The confirmation's decisions: which recipes run next, on which seed; when it is over.

    Args:
        rows: The search's rows (its candidates are read from them).
        top: Candidates that may enter (the two best race; the next enters when one drops out).
        seeds: The fresh seeds, in order: at most one round each.
        slack: The challenger's cap, as a multiple of the leader's time on the same seed.
    """

    def __init__(self, rows: list[TrialRow], top: int, seeds: list[int], slack: float) -> None:
        self.rows = list(rows)
        self.entrants = candidates(rows, top)
        self.seeds = list(seeds)
        self.slack = slack
        self.rounds = 0

    def add(self, rows: list[TrialRow]) -> None:
        """A round's rows (confirmation runs carrying their seed)."""
        self.rows += rows
        self.rounds += 1

    def judged(self, entrant: TrialRow) -> Measured:
        """An entrant's runs so far: its search run (the first pair) and its confirmation runs."""
        return measured([r for r in self.rows if same_knobs(r, [entrant]) and judges(r)])

    def standing(self) -> list[tuple[TrialRow, Measured]]:
        """The entrants that never missed the target, best first (the two best by their paired
        runs), each with its judging runs. An entrant with none yet (its search run was packed
        beside neighbours, which judges nothing) stands on its search time until it runs."""
        alive = [(e, m) for e, m in ((e, self.judged(e)) for e in self.entrants)
                 if all(r.reached for r in m.runs)]  # fmt: skip
        alive.sort(key=lambda em: em[1].median if em[1].runs else _time_of(em[0]))
        if len(alive) >= 2:
            paired = compare_paired(alive[0][1], alive[1][1])
            if paired is not None and paired.ratio < 1:
                alive[0], alive[1] = alive[1], alive[0]
        return alive

    def next_round(self) -> Round | None:
        """The next round, or ``None`` when the race is decided (or out of seeds)."""
        if self.rounds >= len(self.seeds):
            return None
        alive = self.standing()
        if not alive:
            return None
        seed = self.seeds[self.rounds]
        if len(alive) == 1:  # a lone recipe is run once more to show it reaches again
            lone, runs = alive[0]
            confirmed = any(r.phase == keys.PHASE_CONFIRMATION for r in runs.runs)
            return None if confirmed else Round([lone], seed)
        paired = compare_paired(alive[0][1], alive[1][1])
        if paired is not None and paired.pairs >= 2 and (paired.decisive or paired.within_noise()):
            return None
        return Round([alive[0][0], alive[1][0]], seed)


class _Pick:
    """``tune.sample_from`` callable: one value of the recipe a confirmation trial runs."""

    def __init__(self, recipes: list[dict[str, Any]], key: str) -> None:
        self.values = [r[key] for r in recipes]
        self.key = key

    def __call__(self, config: dict[str, Any]) -> Any:
        return self.values[config[keys.CANDIDATE]]


def run_round(
    path: Path,
    resourced: Any,
    round_: Round,
    options: SearchOptions,
    verbose: int,
    whole_gpus: bool = False,
) -> list[TrialRow]:
    """One round as Ray Tune trials, one at a time in order, the later ones capped at
    ``options.slack`` x the first's time to target (:class:`CappingScheduler` on the final
    level only: a confirmation run is judged at the target, not along the way).

    Each run's config carries its recipe (:attr:`TrialRow.config`, the one the search
    measured), and its row carries it back: nothing is derived again here.

    Raises:
        ValueError: An entrant carries no recipe (a row read back from ``trials.csv``).
    """
    from ray import tune

    recipes = [_recipe_of(c).to_dict() for c in round_.entrants]
    param_space: dict[str, Any] = {
        keys.CANDIDATE: tune.grid_search(list(range(len(recipes)))),
        keys.SEED: round_.seed,
    }
    for key in recipes[0]:
        param_space[key] = tune.sample_from(_Pick(recipes, key))
    if whole_gpus:
        param_space[keys.ALONE] = True
    scheduler = CappingScheduler(
        options.slack,
        enabled=options.capping,
        hang_after_s=options.max_time_s + options.hang_grace_s,
        level_slack=None,
    )
    tuner = tune.Tuner(
        resourced,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            max_concurrent_trials=1, scheduler=scheduler, reuse_actors=REUSE_ACTORS
        ),
        run_config=tune.RunConfig(
            storage_path=str((path / "tune").resolve()),
            name=f"confirm-{time.strftime('%Y%m%d-%H%M%S')}-{round_.seed}",
            verbose=min(verbose, 1),
            # A run whose worker or node died (not the recipe's fault) runs again, as in the
            # search: a lost node must not knock a recipe out of the race.
            failure_config=tune.FailureConfig(max_failures=options.max_failures),
        ),
    )
    rows = []
    for result in list(tuner.fit()):  # type: ignore[call-overload]
        metrics = dict(result.metrics or {})
        status, _ = final_status(metrics, result.error is not None, options.penalty)
        if result.error is None and metrics.get(keys.TRIAL_ID) in scheduler.capped:
            metrics[keys.REASON] = (
                f"capped at {metrics.get(keys.TRAIN_S, 0):.3f} s of training: slower on this"
                f" seed than {options.slack} x the leader's time"
            )
        trial_id = str(metrics.get(keys.TRIAL_ID, ""))
        run = {keys.CANDIDATE: result.config[keys.CANDIDATE], keys.SEED: round_.seed}
        recipe = TrialConfig.from_dict(result.config, "a confirmation run's Tune config")
        rows.append(TrialRow.from_result(
            recipe, keys.PHASE_CONFIRMATION, trial_id, status, metrics, **run
        ))  # fmt: skip
    return rows


def run_race(
    path: Path,
    resourced: Any,
    rows: list[TrialRow],
    options: SearchOptions,
    verbose: int,
    whole_gpus: bool = False,
) -> list[TrialRow]:
    """The confirmation of a finished search: :class:`Race`'s rounds until it is decided; the
    new rows."""
    race = Race(rows, options.confirm_top, confirmation_seeds(options), options.slack)
    added: list[TrialRow] = []
    while (round_ := race.next_round()) is not None:
        new = run_round(path, resourced, round_, options, verbose, whole_gpus)
        race.add(new)
        added += new
    return added


def _time_of(row: TrialRow) -> float:
    return row.time_to_target_s if row.time_to_target_s is not None else math.inf


def _recipe_of(candidate: TrialRow) -> TrialConfig:
    if candidate.config is None:
        raise ValueError(f"candidate {candidate.trial_id} carries no recipe to confirm")
    return candidate.config


def confirmation_seeds(options: SearchOptions) -> list[int]:
    """The fresh seeds of the race (the search's trials all ran on ``seed``)."""
    return [options.seed + 1 + i for i in range(options.confirm_seeds)]
