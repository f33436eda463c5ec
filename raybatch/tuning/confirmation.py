"""The confirmation: a race of the search's two best recipes on paired seeds, cheap and honest.

A search ranks recipes on one run each; the confirmation checks the order of the two best
before one is exported, and spends as little as it can doing so:

- the search's runs are the first pair: no race where they show one ahead by more than the
  noise, nor where only one recipe reached (it stands on its search run: :meth:`Race.next_round`);
- each round is one fresh seed on which the two *meet*: each trains to the level the leader's
  search run had at half its time to target (:data:`MEET_SHARE`; the runs' ``meet_level``), so a
  round costs about one training, not two; the later to the level is capped at ``slack`` x the
  first on that seed: slower there, and more would cost full price;
- a recipe that misses the target in any run is out, and the next candidate takes its place;
- the race ends once two pairs agree or their paired ratio is within the indifference zone
  ("within noise"), or after ``confirm_seeds`` seeds; the baseline and the reference are not
  re-run (:func:`~raybatch.results.selection.comparisons` reads their search runs).

:class:`Race` holds the decisions, so the simulated benchmark drives the same object as the
search; :class:`RaceSearcher` runs its rounds as Ray Tune trials in the search's own experiment
(:class:`~raybatch.tuning.phases.SearchThenRace`). On GPUs every confirmation run holds a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ray.tune.search import Searcher

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
from raybatch.space.config import carried_recipe
from raybatch.status import INDIFFERENCE_ZONE, TrialStatus, evaluation_of, final_status
from raybatch.tuning.options import SearchOptions
from raybatch.tuning.race_record import RaceRecord
from raybatch.tuning.rungs import Trajectory

MEET_SHARE = 0.5
"""Where the race's two recipes meet: the level the leader's search run had at this share of
its time to target. Each run trains to that level, so a round of two costs about one training
(the design's bound on a confirmation); the pair's ratio there is one seed's evidence beside
the search's own pair at the target. Half, not a third: on a small transformer whose curves
were measured the rank at half the optimum's time agreed with the final rank at Spearman 0.86,
at a third at 0.19."""


@dataclass(frozen=True)
class Round:
    """One round of the race: the recipes to run on ``seed``, in order (the leader first, the
    challenger capped at ``slack`` x the leader's time on the same seed), each to ``level``
    (``None``: to the target)."""

    entrants: list[TrialRow]
    seed: int
    level: float | None = None


class Race:
    """The confirmation's decisions: which recipes run next, on which seed; when it is over.

    Args:
        rows: The search's rows (its candidates are read from them).
        top: Candidates that may enter (the two best race; the next enters when one drops out).
        seeds: The fresh seeds, in order: at most one round each.
        slack: The challenger's cap, as a multiple of the leader's time on the same seed.
        zone: The search's indifference zone: where its runs show one recipe ahead of the other
            by more than ``1 + zone``, the race is decided without a round.
        curves: The search trials' curves (Tune trial id -> its best metric against training
            time): where the leader's is known, the two meet at a level on it
            (:meth:`meeting_level`); otherwise they race to the target.
    """

    def __init__(self, rows: list[TrialRow], top: int, seeds: list[int], slack: float,
                 zone: float = INDIFFERENCE_ZONE,
                 curves: Mapping[str, Trajectory] | None = None) -> None:  # fmt: skip
        self.rows = list(rows)
        self.entrants = candidates(rows, top)
        self.top = top
        self.seeds = list(seeds)
        self.slack = slack
        self.zone = zone
        self.curves = dict(curves or {})
        self.rounds = 0

    def meeting_level(self, leader: TrialRow, challenger: TrialRow) -> float | None:
        """The level the race's two meet at: the metric the leader's search run had at
        :data:`MEET_SHARE` of its time to target, interpolated on its curve. ``None`` (the two
        race to the target) where either has no time to target that judges it (a packed
        search run judges nothing: the fresh seed's runs are then its only times), or the
        leader's curve has no evaluation that early, or shows no progress past its first by
        then (both would meet at their first evaluation, a pair that tells nothing)."""
        if not all(self.judged(e).times for e in (leader, challenger)):
            return None
        curve = self.curves.get(leader.trial_id)
        if curve is None or leader.time_to_target_s is None:
            return None
        value = curve.value_at(leader.time_to_target_s * MEET_SHARE, before_first=False)
        if value is None or value <= curve.best[0]:
            return None
        return curve.sign * value

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
        # By the times to target that judge each (a meeting run's is to its level; an
        # entrant with none yet stands on its search time until it runs).
        alive.sort(key=lambda em: em[1].median if em[1].times else _time_of(em[0]))
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
        if len(alive) == 1:
            lone, runs = alive[0]
            confirmed = any(r.phase == keys.PHASE_CONFIRMATION for r in runs.runs)
            # The only one that reached, on a run that judges it (alone on its device): the
            # search's answer, nothing to race. Run once more where one candidate was asked for
            # (``confirm_top`` 1), where no run judges it yet (its search run was packed), or
            # where it is left alone mid-race (a race's verdict reads confirmation runs).
            sole = self.top > 1 and bool(runs.times) and self.rounds == 0
            return None if confirmed or sole else Round([lone], seed)
        paired = compare_paired(alive[0][1], alive[1][1])
        if paired is not None and paired.pairs == 1 and paired.ratio > 1 + self.zone:
            return None  # the search's runs: one leads by more than the noise, no race
        if paired is not None and paired.pairs >= 2 and (paired.decisive or paired.within_noise()):
            return None
        leader, challenger = alive[0][0], alive[1][0]
        return Round([leader, challenger], seed, self.meeting_level(leader, challenger))


class RaceSearcher(Searcher):
    """Ray Tune's view of a :class:`Race`: its rounds' runs suggested in order.

    With ``at_once`` 1 a round's leader runs first and its challenger is suggested only once
    the leader's run ended; with 2 both run side by side. Each run's config carries its seed
    and candidate, and the scheduler caps a run at ``slack`` x the first run *on the same seed*
    to reach (:meth:`~raybatch.tuning.race_record.RaceCaps.cap_s`); the next round
    starts once both runs of this one ended. The race's rows are built as each run ends
    (:attr:`rows`): the next round depends on them.

    Args:
        race: The decisions.
        penalty: The objective of a run that did not reach the target.
        whole_gpus: Each run holds a whole GPU (``alone``): a measurement.
        record: Where each run is recorded as it ends, beside the search's study
            (:class:`~raybatch.tuning.race_record.RaceRecord`: optuna-dashboard shows the race).
        at_once: A round's runs at once: with two slots the leader and the challenger run side
            by side on the same seed, and the scheduler caps the later at ``slack`` x the
            first to reach (each on a slot of its own: a lone measurement, half the wall
            clock); with one, the leader first.
    """

    def __init__(self, race: Race, penalty: float, whole_gpus: bool = False,
                 record: RaceRecord | None = None, at_once: int = 1) -> None:  # fmt: skip
        super().__init__(metric=keys.OBJECTIVE, mode="min")
        self.race = race
        self.penalty = penalty
        self.whole_gpus = whole_gpus
        self.record = record
        self.rows: list[TrialRow] = []
        # The current round's runs not yet suggested, each with its entrant's search trial.
        self._queue: list[tuple[dict[str, Any], str]] = []
        self._round: list[TrialRow] = []  # the current round's rows so far
        self._configs: dict[str, dict[str, Any]] = {}
        self._entrants: dict[str, str] = {}  # run -> the search trial of its recipe
        self._curves: dict[str, dict[int, float]] = {}  # run -> samples seen -> metric
        self._running: set[str] = set()
        self._in_round = False
        self.at_once = max(1, at_once)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]
        if len(self._running) >= self.at_once:  # the cap needs a run of the round to end
            return None
        if not self._queue and self._running:  # the next round waits for this one's runs
            return None
        if not self._queue:
            if self._in_round:
                self.race.add(self._round)
                self._round, self._in_round = [], False
            round_ = self.race.next_round()
            if round_ is None:
                return Searcher.FINISHED
            met = {} if round_.level is None else {keys.MEET_LEVEL: round_.level}
            self._queue = [
                ({**e.config.to_dict(), keys.CANDIDATE: i, keys.SEED: round_.seed, **met},
                 e.trial_id)
                for i, e in enumerate(round_.entrants)
            ]  # fmt: skip
            self._in_round = True
        config, self._entrants[trial_id] = self._queue.pop(0)
        if self.whole_gpus:
            config[keys.ALONE] = True
        self._configs[trial_id] = config
        self._running.add(trial_id)
        return config

    def waits_for(self, trial_id: str) -> bool:
        """Whether a run it suggested has not been told ended."""
        return trial_id in self._running

    def decided(self) -> bool:
        """Whether the race ran to its verdict: no run in flight or waiting, and the rounds it
        ran leave nothing to run. A Tuner stopped by Ctrl-C leaves its runs in flight untold,
        or a round undone: not a verdict."""
        if self._running or self._queue:
            return False
        if self._in_round:
            self.race.add(self._round)
            self._round, self._in_round = [], False
        return self.race.next_round() is None

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """An evaluation of a run: its curve, for the run's record in the study."""
        evaluation = evaluation_of(result)
        curve = self._curves.setdefault(trial_id, {})
        if evaluation is not None and evaluation[0] > max(curve, default=-1):
            curve[evaluation[0]] = evaluation[1]

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        config = self._configs.pop(trial_id, None)  # told once (TellUntold may tell again)
        self._running.discard(trial_id)
        if config is None:
            return
        if result:
            self.on_trial_result(trial_id, result)  # the last evaluation, if Tune sent it here
        metrics = dict(result or {})
        status, _ = final_status(metrics, error, self.penalty)
        level = config.get(keys.MEET_LEVEL)
        if status is TrialStatus.CAPPED:
            metrics[keys.REASON] = capped_reason(metrics.get(keys.TRAIN_S), self.race.slack, level)
        recipe = carried_recipe(config, "a confirmation run's Tune config")
        row = TrialRow.from_result(
            recipe, keys.PHASE_CONFIRMATION, str(metrics.get(keys.TRIAL_ID, trial_id)), status,
            metrics, candidate=config[keys.CANDIDATE], seed=config[keys.SEED], meet_level=level,
        )  # fmt: skip
        self._round.append(row)
        self.rows.append(row)
        if self.record is not None:
            entrant = self._entrants.pop(trial_id, None)
            self.record.add(row, entrant, self._curves.pop(trial_id, {}))


def capped_reason(train_s: float | None, slack: float, level: float | None = None) -> str:
    """Why a confirmation run was stopped: the scheduler's cap on its seed
    (:meth:`~raybatch.tuning.race_record.RaceCaps.cap_s`)."""
    to = "the target" if level is None else f"the meeting level {level:.4g}"
    return (f"capped at {train_s or 0:.3f} s of training: slower on this seed than {slack} x"
            f" the time of the first to reach {to}")  # fmt: skip


DECIDED_BY_THE_SEARCH = (
    "no confirmation race was run: the search's runs already showed its best recipe ahead of the"
    " next by more than the {zone:.0%} indifference zone; the winner stands on its search run"
)
"""The closing note of a race the search's own runs decided (:meth:`Race.next_round`)."""
ONLY_ONE_REACHED = (
    "no confirmation race was run: only one recipe reached the target in the search (every"
    " other was stopped behind it); the winner stands on its search run"
)
"""The closing note where the search's runs left one recipe standing: it is not run again."""


def _time_of(row: TrialRow) -> float:
    return row.time_to_target_s if row.time_to_target_s is not None else math.inf


def confirmation_seeds(options: SearchOptions) -> list[int]:
    """The fresh seeds of the race (the search's trials all ran on ``seed``)."""
    return [options.seed + 1 + i for i in range(options.confirm_seeds)]
