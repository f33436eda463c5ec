"""The search, then its confirmation, in one Ray Tune experiment: the race runs on warm slots.

The confirmation's race (:mod:`raybatch.tuning.confirmation`) used to run in a Tuner of its own
once the search's had ended: a Tuner to build (1.4 s on the tabular demo) and, on every slot,
a cold process to start (Python, torch, raybatch and the workload imported, the data built
again: 3-4 s on the benchmark's MLPs), while a race run trains for a few seconds. Here the
search's own Tuner runs it: :class:`SearchThenRace` suggests the search's trials through the
:class:`~raybatch.tuning.searcher.RaybatchSearcher` until they have all been launched, waits for
the last to end (the race's entrants are chosen from all of them), then suggests the race's
runs through a :class:`~raybatch.tuning.confirmation.RaceSearcher`, and Tune's reused processes
(``reuse_actors``) run them. A race decided by the search's own runs (one recipe ahead by more
than the zone) runs nothing.

Its checkpoint holds the search's (the searcher's own) and the race's state whole, so a run
interrupted during the race resumes it where it stood: the runs that ended are kept, one in
flight is run again by Tune under its own trial id, and the rest are run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from raybatch import keys
from raybatch.errors import SearchInterrupted
from raybatch.results.rows import TrialRow
from raybatch.space.config import carried_recipe
from raybatch.status import INDIFFERENCE_ZONE, TrialStatus, final_status, timed_evaluation
from raybatch.tuning.confirmation import Race, RaceSearcher, confirmation_seeds
from raybatch.tuning.options import SearchOptions
from raybatch.tuning.progress import log, recipe
from raybatch.tuning.race_record import RaceRecord, race_seed
from raybatch.tuning.rungs import Trajectory
from raybatch.tuning.scheduler import CappingScheduler
from raybatch.tuning.searcher import RaybatchSearcher, read_checkpoint, write_checkpoint
from raybatch.tuning.study import SearchStudy
from raybatch.tuning.study_file import prescreened


def search_row(config: dict[str, Any], result: dict[str, Any] | None, error: bool,
               penalty: float, seed: int) -> TrialRow:  # fmt: skip
    """A search trial's row from its Tune config and last result: the recipe its config
    carries, its status and objective (:func:`~raybatch.status.final_status`), and the seed
    every search trial trains on (the confirmation's first pair)."""
    metrics = dict(result or {})
    status, value = final_status(metrics, error, penalty)
    metrics[keys.OBJECTIVE] = value
    trial_id = str(metrics.get(keys.TRIAL_ID, ""))
    carried = carried_recipe(config, "a search trial's Tune config")
    return TrialRow.from_result(carried, keys.PHASE_SEARCH, trial_id, status, metrics, seed=seed)


class SearchThenRace(Searcher):
    """The search's trials, then the confirmation's race, suggested to one Tuner.

    Args:
        search: The search's searcher (its trials, its study).
        options: The search's options (trials, seed, the race's top, seeds, slack, zone).
        slots: Trials the search runs at once: the race runs its two side by side where there
            are two or more (each on a slot of its own), one at a time otherwise.
        whole_gpus: Each race run holds a whole GPU (``alone``): a measurement.
        limit: The search's trials running at once, paused ones not counted (Tune's
            ``max_concurrent_trials`` counts them, and a search whose scheduler pauses trials
            would stall with every slot held by a paused one); ``None``: Tune's limit.
        mode: The target's direction: the search trials' curves are kept in it, where the
            race's two meet (:meth:`~raybatch.tuning.confirmation.Race.meeting_level`).
    """

    only_one_reached = False
    """The search's runs decided it: one recipe reached the target, and is not run again (a
    class default: a checkpoint of an earlier release lacks it)."""

    def __init__(self, search: RaybatchSearcher, options: SearchOptions, slots: int,
                 whole_gpus: bool = False, limit: int | None = None,
                 mode: str = "max") -> None:  # fmt: skip
        super().__init__(metric=keys.OBJECTIVE, mode="min")
        self.search = search
        self.trials = options.trials
        self.seed = options.seed
        self.top = options.confirm_top
        self.seeds = confirmation_seeds(options) if options.confirms else []
        self.slack = options.slack
        self.zone = INDIFFERENCE_ZONE if options.zone is None else options.zone
        self.at_once = min(2, max(1, slots))
        self.whole_gpus = whole_gpus
        self.launched: dict[str, dict[str, Any]] = {}  # search trial -> its config
        self.ended: dict[str, TrialRow] = {}  # search trial -> its row, as the race reads it
        self.search_finished = False  # the searcher said FINISHED (it gave up) before the end
        self.race: RaceSearcher | None = None
        self.raced = False  # the race was set up (or found it had nothing to run)
        self.decided_by_the_search = False
        self.limit = limit
        self.paused: set[str] = set()  # search trials the scheduler paused
        self.last: dict[str, dict[str, Any]] = {}  # search trial -> its last result
        self.target_mode = mode
        self.curves: dict[str, Trajectory] = {}  # search trial -> its evaluations

    @classmethod
    def for_search(cls, search: RaybatchSearcher, options: SearchOptions, cuda: bool,
                   in_flight: int, limit: int | None = None, mode: str = "max"
                   ) -> SearchThenRace:  # fmt: skip
        """As the driver builds it: the race side by side on CPU slots as the search ran
        (``in_flight``: the trials the cluster runs at once, or ``--max-concurrent`` under
        that); on GPUs one run at a time, each on a whole GPU (the search's slots may have
        been shares of one). ``limit``: the search's own bound on trials at once; ``mode``:
        the target's direction."""
        slots = 1 if cuda else in_flight
        return cls(search, options, slots, whole_gpus=cuda, limit=limit, mode=mode)

    def set_search_properties(self, metric: str | None, mode: str | None,
                              config: dict[str, Any], **spec: Any) -> bool:  # fmt: skip
        return self.search.set_search_properties(metric, mode, config, **spec)

    @property
    def searching(self) -> bool:
        """Whether the search may still launch a trial."""
        return not self.search_finished and len(self.launched) < self.trials

    @property
    def search_ended(self) -> bool:
        """Whether the search has launched all it will and every one of its trials ended."""
        return not self.searching and set(self.launched) <= set(self.ended)

    def waits_for(self, trial_id: str) -> bool:
        """Whether a search trial or a race run it launched has not been told ended."""
        if trial_id in self.launched:
            return trial_id not in self.ended
        return self.race is not None and self.race.waits_for(trial_id)

    def decided(self) -> bool:
        """Whether the search ran to its end and the race to its verdict (or needed none)."""
        if not self.search_ended:
            return False
        if self.race is None:
            return self.raced or not self.seeds
        return self.race.decided()

    def on_pause(self, trial_id: str) -> None:
        self.paused.add(trial_id)
        self.search.on_pause(trial_id)

    def on_unpause(self, trial_id: str) -> None:
        self.paused.discard(trial_id)
        self.search.on_unpause(trial_id)

    def _full(self) -> bool:
        """Whether as many search trials run as the limit allows (paused ones not counted)."""
        running = set(self.launched) - set(self.ended) - self.paused
        return self.limit is not None and len(running) >= self.limit

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]
        if trial_id not in self.launched and self.race is None and self.searching and self._full():
            return None  # Tune asks again once a trial ends or is paused
        if trial_id in self.launched or (self.race is None and self.searching):
            config = self.search.suggest(trial_id)
            if isinstance(config, dict):
                self.launched[trial_id] = config
                return config
            if config != Searcher.FINISHED:
                return config  # None: Tune asks again later
            self.search_finished = True
        if self.race is None:
            if not self.search_ended:
                return None  # the race's entrants are chosen from every search trial
            if self.raced or not self.seeds:
                return Searcher.FINISHED
            self.race, self.raced = self._start_race(), True
            if self.race is None:
                return Searcher.FINISHED
        return self.race.suggest(trial_id)

    def _start_race(self) -> RaceSearcher | None:
        """The race over the search's rows; ``None`` where the search's runs decided it (or
        no trial reached, or there are no seeds): nothing to run."""
        rows = list(self.ended.values())
        race = Race(rows, self.top, self.seeds, self.slack, self.zone, self.curves)
        first = race.next_round()
        if first is None:
            standing = race.standing()  # none: every recipe that reached missed in a run
            self.decided_by_the_search = bool(self.seeds and standing)
            self.only_one_reached = self.decided_by_the_search and len(standing) == 1
            return None
        names = " and ".join(recipe(e.config.to_dict()) for e in first.entrants)
        how = "side by side" if self.at_once > 1 else "one run at a time"
        to = (
            ""
            if first.level is None
            else f", to the level {first.level:.4g} (where the first had half its time)"
        )
        log.info(f"confirming: {names} on up to {len(self.seeds)} fresh seed(s), {how}{to}")
        record = RaceRecord(self.search.record)
        record.start()
        return RaceSearcher(race, self.search.penalty, self.whole_gpus, record, self.at_once)

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if trial_id in self.launched:
            if self.limit is not None:
                self.last[trial_id] = result
            self._follow(trial_id, result)
            self.search.on_trial_result(trial_id, result)
        elif self.race is not None:
            self.race.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                          error: bool = False) -> None:  # fmt: skip
        if trial_id in self.launched:
            self.paused.discard(trial_id)
            # A paused trial stopped for good is told with no result (Tune's stop_trial): its
            # last report is its end.
            result = result if result is not None else self.last.pop(trial_id, None)
            self.search.on_trial_complete(trial_id, result, error)
            if trial_id not in self.ended:  # told once (TellUntold may tell again)
                self.ended[trial_id] = search_row(self.launched[trial_id], result, error,
                                                  self.search.penalty, self.seed)  # fmt: skip
        elif self.race is not None:
            self.race.on_trial_complete(trial_id, result, error)

    def _follow(self, trial_id: str, result: dict[str, Any]) -> None:
        """A search trial's evaluation on its curve (a heartbeat repeats the last one)."""
        evaluation = timed_evaluation(result)
        if evaluation is not None and self.target_mode:
            self.curves.setdefault(trial_id, Trajectory(self.target_mode)).add(*evaluation)

    @property
    def race_rows(self) -> list[TrialRow]:
        """The race's runs that ended, as it decided on them."""
        return [] if self.race is None else list(self.race.rows)

    def save(self, checkpoint_path: str) -> None:
        """The searcher's checkpoint and the race's state, in one pickle (the study they
        share is the restoring searcher's: :func:`write_checkpoint`)."""
        phases = {k: v for k, v in self.__dict__.items() if k != "search"}
        state = {"search": self.search.checkpoint(), "phases": phases}
        write_checkpoint(state, checkpoint_path, self.search.record)

    def restore(self, checkpoint_path: str) -> None:
        state = read_checkpoint(checkpoint_path, self.search.record)
        self.search.restore_checkpoint(state.get("search", {}), checkpoint_path)
        self.__dict__.update(state["phases"])

    def ended_or_interrupted(self, gave_up: str | None, path: Path, notes: list[str]) -> None:
        """The search and its race ran to their end (a searcher that gave up is said in a
        note); otherwise the run was interrupted, said with the phase, what is kept and how to
        continue.

        Raises:
            SearchInterrupted: The search, or its race, did not run to its end.
        """
        if gave_up is not None:
            notes.append(f"the searcher stopped after {len(self.ended)} trial(s): {gave_up}")
        elif not self.search_ended:
            raise SearchInterrupted(
                f"search interrupted in {self.search.plan.phase()} after {len(self.ended)} of"
                f" {self.trials} trials; the state is saved: continue with"
                f" `raybatch resume {path}`"
            )
        if not self.decided():
            raise SearchInterrupted(
                "the confirmation was interrupted before its verdict; the search's trials and"
                f" the race's finished runs are saved: continue with `raybatch resume {path}`"
            )


def search_rows(results: Any, penalty: float, seed: int, scheduler: CappingScheduler
                ) -> list[TrialRow]:  # fmt: skip
    """The search trials' rows (:func:`search_row`) from Tune's results, each with why it
    ended where the scheduler capped it or Ray errored it; the race's runs are left out (their
    rows are the race's: :attr:`SearchThenRace.race_rows`)."""
    rows = []
    for result in results:
        if race_seed(result.config) is not None:
            continue
        metrics = dict(result.metrics or {})
        status, _ = final_status(metrics, result.error is not None, penalty)
        if status is TrialStatus.CAPPED:
            metrics[keys.REASON] = _capped_reason(metrics, scheduler)
        if result.error is not None:
            metrics[keys.REASON] = f"{type(result.error).__name__}: {result.error}"
        rows.append(search_row(result.config, metrics, result.error is not None, penalty, seed))
    return rows


def _capped_reason(metrics: dict[str, Any], scheduler: CappingScheduler) -> str:
    tune_id = str(metrics.get(keys.TRIAL_ID))
    rung, rule = scheduler.capped_at_rung.get(tune_id), scheduler.judge.rule
    zone = scheduler.judge.rung_zones.get(tune_id, rule.zone or 0.0)
    why = (
        f"at the rung of {rung:.3f} s, more than {1 + zone:.2g}x slower to its level than the"
        f" best curve there and, below B, outside the top 1/{rule.eta:g}"
        if rung is not None
        else "slower than the best time to target x slack"
    )
    if rung is not None and tune_id in scheduler.promotions.yielded and rung == rule.horizon_s:
        why = (f"paused at {rung:.3f} s, the guess of the optimum's time, to go on last, and"
               f" not taken on: no rung passed it once a trial had reached the target")  # fmt: skip
    return f"capped at {metrics.get(keys.TRAIN_S, 0):.3f} s of training: {why}"


def prescreened_rows(record: SearchStudy) -> list[TrialRow]:
    """Pre-screened-out configs with the recipes the searcher derived, read back from the
    study (so they survive a resume). A combination the space's rules refused has no recipe to
    show: it is left out of the rows (the study keeps it, with its reason)."""
    rows = []
    for p in prescreened(record):
        recipe = p.recipe
        if recipe is None:
            continue
        rows.append(
            TrialRow.of(
                recipe,
                keys.PHASE_PRESCREEN,
                f"optuna_{p.number}",
                TrialStatus.PRESCREENED_OUT,
                reason=p.reason,
                peak_memory_bytes=p.predicted_bytes,
            )
        )
    return rows


__all__ = ["SearchThenRace", "prescreened_rows", "search_row", "search_rows"]
