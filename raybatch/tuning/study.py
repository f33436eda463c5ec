"""The search's record in Optuna: one study per run, and the one place that opens it.

The searcher asks and tells through a :class:`SearchStudy`; the driver closes through it the
trials an interruption orphaned, and reads back what the searcher wrote from outside it
(:mod:`raybatch.tuning.study_file`). The user attributes written on each
Optuna trial are declared here, so no reader guesses their names.

Only public Optuna API is used. A trial asked in this process is told through its live
``optuna.Trial``. A trial restored into a new driver process (``raybatch resume`` of a trial
that was running) has no live handle, and Optuna offers none for a running trial by number:
its old entry is closed by number (``study.tell(number, state=FAIL, skip_if_finished=True)``,
read back as ``lost_at_interruption``) and its result is added as a new finished trial with
the same parameters (``study.add_trial``), so TPE still learns from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from raybatch import keys
from raybatch.errors import ConfigError
from raybatch.keys import KnobPoint
from raybatch.space.config import TrialConfig, carried_recipe
from raybatch.status import TrialStatus
from raybatch.tuning.sessions import SESSIONS_ATTR, SLOTS_ATTR, sessions_in, slots_in

if TYPE_CHECKING:
    import optuna

DEFAULT_STUDY = "raybatch"
"""The study's name where none is given (the plugin path's in-memory study)."""
STATUS_ATTR = "status"
"""How the trial ended: a :class:`~raybatch.status.TrialStatus` value."""
REASON_ATTR = "reason"
"""Why a pre-screened config was not launched."""
PREDICTED_BYTES_ATTR = keys.PREDICTED_BYTES
"""The pre-screen's predicted peak, for a config it rejected (``None`` for a learned OOM)."""
CONFIG_ATTR = "config"
"""The whole config Ray Tune ran (raw knobs and constants), for a launched trial."""
TUNE_TRIAL_ID_ATTR = keys.TUNE_TRIAL_ID
"""The Ray Tune trial that ran this Optuna trial."""
TIME_TO_TARGET_ATTR = "time_to_target_s"
"""The measured time to target of a trial that reached it."""

LADDER_ATTR = "ladder_queued"
"""Study attribute: the plan's second stage (:class:`raybatch.tuning.seeding.Ladder`) is queued."""
BASELINE_ATTR = "baseline"
"""Study attribute: the largest batch that fits, when the opening had to go below the one the
estimate chose (that one ran out of memory)."""

GAVE_UP_ATTR = "gave_up"
"""Study attribute: why the searcher stopped suggesting (every suggestion was pre-screened out)."""

MEMORY_CONSTRAINT = "memory"
"""Optuna constraint: (predicted - budget) / budget; > 0 means the config does not fit."""

STARTUP_TRIALS = 10
"""Random trials before TPE models the study: Optuna's default. A shorter start (5) was tried
and kept for a while, because it won on the first simulated family; on the fairer family
(estimator error, an LR rule 3.5x off, seeds far from the optimum; ``bench/search_efficiency.py``,
20 seeds, 20 trials) it lost the tail: 90th-percentile regret 1.317 vs 1.121, 1.349 vs 1.185
and 1.680 vs 1.286 on three members, for one better median (1.065 vs 1.097)."""


@dataclass(frozen=True)
class Prescreened:
    """A config the pre-screen kept from launching, as the study recorded it (``params``: the
    knobs Optuna sampled) or as the searcher logged it (``params``: its whole config)."""

    number: int
    params: dict[str, Any]
    reason: str | None
    predicted_bytes: int | None
    recipe: TrialConfig | None = None
    """The recipe the searcher derived and kept out (``None``: the space's rules refused the
    combination, or a study written before raybatch recorded it)."""

    @classmethod
    def of(
        cls, number: int, config: dict[str, Any], reason: str | None, predicted_bytes: int | None
    ) -> Prescreened:
        """The rejection of Optuna trial ``number``: its ``config`` (the searcher's recipe, or
        the bare knobs the space's rules refused) with the recipe read from it."""
        return cls(number, dict(config), reason, predicted_bytes, recipe_recorded(config))


class SearchStudy:
    """An Optuna study with the sampler raybatch searches with.

    Args:
        storage_url: ``sqlite:///RUN_DIR/optuna.db`` (what ``raybatch search`` uses), any
            Optuna storage URL, or ``None``: Optuna's in-memory storage, which the searcher
            keeps in its Tune checkpoint (:attr:`memory_storage`) so that a restored Tune
            experiment resumes the same study.
        study_name: The study's name in that storage.
        seed: The TPE sampler's seed.
    """

    def __init__(self, storage_url: str | None, study_name: str, seed: int = 0) -> None:
        self.storage_url = storage_url
        self.memory_storage: optuna.storages.InMemoryStorage | None = None
        self.study_name = study_name
        self.seed = seed
        self._study: optuna.Study | None = None
        self._live: dict[int, optuna.Trial] = {}
        self._steps: dict[int, int] = {}  # open trial -> last step told (intermediate values)
        # Read at every suggestion: read from storage once, then kept, since only gave_up()
        # below writes it (a copy made by pickling reads storage afresh).
        self._gave_up: str | None = None
        self._gave_up_read = False

    def relocate(self, storage_url: str) -> None:
        """Use ``storage_url`` from now on: a searcher unpickled from a run directory that was
        copied or moved still names the old one's database."""
        if self.storage_url is None:
            return  # in memory: the study travels in the searcher's checkpoint
        self.storage_url = storage_url
        self._study = None
        self._live = {}

    def __getstate__(self) -> dict[str, Any]:
        # The study holds a database engine; it is reopened from the URL after unpickling.
        return {**self.__dict__, "_study": None, "_live": {}, "_gave_up_read": False}

    @property
    def study(self) -> optuna.Study:
        if self._study is None:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            sampler = optuna.samplers.TPESampler(
                seed=self.seed,
                n_startup_trials=STARTUP_TRIALS,
                multivariate=True,
                constant_liar=True,
            )
            if self.storage_url is None and self.memory_storage is None:
                self.memory_storage = optuna.storages.InMemoryStorage()
            self._study = optuna.create_study(
                storage=self.storage_url or self.memory_storage,
                study_name=self.study_name,
                direction="minimize",
                sampler=sampler,
                load_if_exists=True,
            )
        return self._study

    def use_memory_storage(self, storage: optuna.storages.InMemoryStorage | None) -> None:
        """Continue the in-memory study a checkpoint kept (a restored Tune experiment)."""
        if self.storage_url is None and storage is not None:
            self.memory_storage, self._study = storage, None

    def enqueue_if_new(self, points: list[KnobPoint]) -> None:
        """Queue points to run first, once: only while the study has no trial."""
        if points and not self.study.get_trials(deepcopy=False):
            for point in points:
                self.study.enqueue_trial(dict(point), skip_if_exists=True)

    # ------------------------------------------------------------------ the searcher's side

    def ask(self) -> optuna.Trial:
        trial = self.study.ask()
        self._live[trial.number] = trial
        return trial

    def live(self, number: int) -> optuna.Trial | None:
        """The open Optuna trial ``number`` asked in this process (``None``: not open here)."""
        return self._live.get(number)

    def launched(self, trial: optuna.Trial, config: dict[str, Any], tune_trial_id: str) -> None:
        """Record which Tune trial runs this Optuna trial, with which config."""
        trial.set_user_attr(CONFIG_ATTR, config)
        trial.set_user_attr(TUNE_TRIAL_ID_ATTR, tune_trial_id)

    def relaunched(self, number: int, tune_trial_id: str) -> None:
        """Record that another Tune trial now runs this (still open) Optuna trial."""
        trial = self._live.get(number)
        if trial is not None:
            trial.set_user_attr(TUNE_TRIAL_ID_ATTR, tune_trial_id)

    def progress(self, number: int, value: float, step: int) -> None:
        """An evaluation of the open trial ``number``: its target metric after ``step``
        samples, kept as an intermediate value (the learning curves optuna-dashboard draws).
        TPE ranks a pruned (capped) trial below every COMPLETE one, those told the penalty
        (censored, diverged, an error) included, and reads its curve only to rank it among
        other pruned ones; both matter only while fewer trials reached than TPE's "good"
        group holds (a tenth of the trials: at most one reached, at 20). A step not past the
        last is skipped (a trial run again alone restarts its count)."""
        trial = self._live.get(number)
        last = self._steps.get(number, -1)
        if trial is None or step <= last or not math.isfinite(value):
            return
        trial.report(value, step)
        self._steps[number] = step

    def config_of(self, number: int) -> dict[str, Any]:
        """The config trial ``number`` was launched with. A trial open in this process is read
        alone (every trial's end asks for it; reading the whole study would load every trial
        from the database each time)."""
        live = self._live.get(number)
        if live is not None:
            return dict(live.user_attrs[CONFIG_ATTR])
        return dict(self.study.get_trials(deepcopy=False)[number].user_attrs[CONFIG_ATTR])

    def reject(
        self,
        trial: optuna.Trial,
        violation: float,
        penalty: float,
        reason: str,
        predicted_bytes: int | None,
        config: dict[str, Any] | None = None,
    ) -> None:
        """Tell a config that is not launched: infeasible (positive constraint), penalised;
        its recipe (``config``, derived by the searcher) is kept for the run's rows."""
        trial.set_constraint(MEMORY_CONSTRAINT, max(violation, 1e-9))
        if config is not None:
            trial.set_user_attr(CONFIG_ATTR, config)
        trial.set_user_attr(STATUS_ATTR, TrialStatus.PRESCREENED_OUT.value)
        trial.set_user_attr(REASON_ATTR, reason)
        trial.set_user_attr(PREDICTED_BYTES_ATTR, predicted_bytes)
        self.study.tell(trial, penalty)
        self._live.pop(trial.number, None)

    def finish(
        self,
        number: int,
        status: TrialStatus,
        value: float,
        violation: float,
        time_to_target_s: float | None,
        reason: str | None = None,
    ) -> int | None:
        """Tell a launched trial's result; the number it is recorded under, or ``None`` when
        that trial was already finished (told before an interruption that Tune's last saved
        state predates: the first result is kept).

        A trial that failed (an error, divergence, the time cap) is told COMPLETE with the
        PAR-10 penalty, not FAIL: TPE ignores a FAIL trial and would propose its config
        again, the complaint users have of the peer tools. Its ``status`` and ``reason`` user
        attributes say what happened (optuna-dashboard shows both)."""
        attrs: dict[str, Any] = {STATUS_ATTR: status.value}
        if time_to_target_s is not None:
            attrs[TIME_TO_TARGET_ATTR] = time_to_target_s
        if reason:
            attrs[REASON_ATTR] = str(reason)[:500]
        pruned = status is TrialStatus.CAPPED
        trial = self._live.pop(number, None)
        if trial is not None:
            for key, item in attrs.items():
                trial.set_user_attr(key, item)
            trial.set_constraint(MEMORY_CONSTRAINT, violation)
            if pruned:
                self.study.tell(trial, state=trial_state("PRUNED"))
            else:
                self.study.tell(trial, value)
            self._steps.pop(number, None)
            return number
        return _tell_restored(self.study, number, attrs, None if pruned else value, violation,
                              pruned)  # fmt: skip

    def gave_up(self, reason: str) -> None:
        """Record that the searcher ended the search early, and why."""
        self.study.set_user_attr(GAVE_UP_ATTR, reason)
        self._gave_up, self._gave_up_read = reason, True

    def add_session(self, started_at: float, slots: int | None = None) -> list[float]:
        """Record that a driver session (a search, or a resume of it) started at
        ``started_at`` (epoch seconds), running ``slots`` trials at once; returns every
        session's start, in order. The wall clock a search paid is counted within sessions
        (:func:`raybatch.results.cost.wall_clock`), never across the time a run lay
        interrupted, and times the most slots a session had."""
        started = [*sessions_in(self.study.user_attrs), float(started_at)]
        self.study.set_user_attr(SESSIONS_ATTR, started)
        if slots is not None:
            most = max(slots, slots_in(self.study.user_attrs) or 0)
            self.study.set_user_attr(SLOTS_ATTR, int(most))
        return started

    def slots(self) -> int | None:
        """The most trials a driver session ran at once (``None``: not recorded)."""
        return slots_in(self.study.user_attrs)

    def ladder_queued(self) -> bool:
        return bool(self.study.user_attrs.get(LADDER_ATTR, False))

    def queue_ladder(self, points: list[KnobPoint]) -> None:
        """Queue the plan's second stage, once."""
        for point in points:
            self.study.enqueue_trial(dict(point), skip_if_exists=True)
        self.study.set_user_attr(LADDER_ATTR, True)

    def queued(self) -> bool:
        """Whether points wait in the queue (enqueued, not yet asked)."""
        import optuna

        waiting = (optuna.trial.TrialState.WAITING,)
        return bool(self.study.get_trials(deepcopy=False, states=waiting))

    def set_baseline(self, knobs: KnobPoint) -> None:
        self.study.set_user_attr(BASELINE_ATTR, knobs)

    def baseline(self) -> KnobPoint | None:
        """The largest batch that fits, as the search found it (``None``: as planned)."""
        stored = self.study.user_attrs.get(BASELINE_ATTR)
        return cast(KnobPoint, dict(stored)) if stored is not None else None

    # ------------------------------------------------------------------ the driver's side

    def gave_up_reason(self) -> str | None:
        """Why the searcher ended the search before its trials were all launched, if it did."""
        if not self._gave_up_read:
            reason = self.study.user_attrs.get(GAVE_UP_ATTR)
            self._gave_up = None if reason is None else str(reason)
            self._gave_up_read = True
        return self._gave_up

    def close_orphans(self, tune_trial_ids: set[str], why: str | None = None) -> int:
        """Fail study trials left RUNNING by an interrupted driver (or a search stopped early):
        those no Tune trial among ``tune_trial_ids`` ran, each with ``why`` as its reason.
        Returns how many were closed, so the study and the Ray experiment agree."""
        import optuna

        running = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        orphans = [t for t in running if t.user_attrs.get(TUNE_TRIAL_ID_ATTR) not in tune_trial_ids]
        for trial in orphans:
            if why is not None:
                self.study._storage.set_trial_user_attr(trial._trial_id, REASON_ATTR, why)
            self.study.tell(trial.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            self._live.pop(trial.number, None)
        return len(orphans)


def _tell_restored(
    study: optuna.Study,
    number: int,
    attrs: dict[str, Any],
    value: float | None,
    violation: float,
    pruned: bool = False,
) -> int | None:
    """Tell trial ``number``, asked by an earlier process (a resumed search): Optuna tells only
    a trial this process asked, so it is failed and recorded again whole with its result; the
    number it is recorded under, or ``None`` where it was finished already."""
    import optuna

    old = study.get_trials(deepcopy=False)[number]
    if old.state.is_finished():
        return None
    study.tell(number, state=trial_state("FAIL"), skip_if_finished=True)
    curve = old.intermediate_values
    if value is None and curve:  # pruned: its last evaluation, as Optuna's tell keeps it
        value = curve[max(curve)]
    study.add_trial(
        optuna.trial.create_trial(
            state=trial_state("PRUNED" if pruned else "COMPLETE"),
            value=value,
            params=old.params,
            distributions=old.distributions,
            user_attrs={**old.user_attrs, **attrs},
            intermediate_values=old.intermediate_values,
            constraints={MEMORY_CONSTRAINT: violation},
        )
    )
    return len(study.get_trials(deepcopy=False)) - 1


def trial_state(name: str) -> optuna.trial.TrialState:
    """Optuna's trial state ``name`` (Optuna is imported only where a study is used)."""
    import optuna

    return optuna.trial.TrialState[name]


def status_of(trial: optuna.trial.FrozenTrial) -> str:
    """A study trial's status; a failed trial with none recorded was lost at an interruption."""
    import optuna

    recorded = trial.user_attrs.get(STATUS_ATTR)
    if recorded is None and trial.state == optuna.trial.TrialState.FAIL:
        return TrialStatus.LOST_AT_INTERRUPTION.value
    return str(recorded) if recorded is not None else TrialStatus.RUNNING.value


def recipe_recorded(config: Any) -> TrialConfig | None:
    """The recipe a rejected trial's recorded config carries; ``None`` where it carries none
    (knobs the space's rules refused have no recipe)."""
    if not isinstance(config, dict):
        return None
    try:
        return carried_recipe(config, "the study's record")
    except ConfigError:
        return None
