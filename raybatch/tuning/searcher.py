"""The searcher: Optuna's TPE over the raw knobs, with a memory pre-screen before every launch.

Built on Optuna's ask/tell rather than on Ray's ``OptunaSearch``, which maps one Tune trial to
one Optuna trial: a recipe the pre-screen refuses is told to Optuna at once (the penalty and a
positive constraint, so constrained TPE steers away) and another is asked inside the same
``suggest``; a recipe that ran out of memory refuses every larger one after it; a recipe the
cluster cannot place is never launched. One study is the record: a trial that reached is
COMPLETE with its time to target, one the scheduler stopped is PRUNED with its learning curve,
every other end COMPLETE with the penalty. :mod:`raybatch.tuning.plan` says what runs before TPE.

Example::

    from ray import tune
    import raybatch

    fn = raybatch.trainable(workload, space, "accuracy>=0.9", max_time_s=60)
    searcher = raybatch.RaybatchSearcher.for_trainable(fn, storage_url="sqlite:///optuna.db")
    scheduler = raybatch.CappingScheduler.for_trainable(fn)
    tuner = tune.Tuner(fn, tune_config=tune.TuneConfig(
        search_alg=searcher, scheduler=scheduler, num_samples=20))
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from ray import cloudpickle
from ray.tune.search import Searcher

from raybatch import keys
from raybatch.errors import Issue, OptionError, RunDirError, first_line
from raybatch.memory.estimator import MemoryEstimator
from raybatch.space.config import carried_recipe
from raybatch.space.search_space import SearchSpace
from raybatch.status import evaluation_of, final_status
from raybatch.trial.settings import parts_of
from raybatch.tuning.gates import Devices, Gate, LearnedOutOfMemory, for_settings
from raybatch.tuning.launches import Launches
from raybatch.tuning.plan import Plan
from raybatch.tuning.screen import Screen
from raybatch.tuning.study import DEFAULT_STUDY, Prescreened, SearchStudy
from raybatch.version import FORMAT_KEY, RUN_FORMAT, check_format

if TYPE_CHECKING:
    import optuna


class RaybatchSearcher(Searcher):
    """Optuna TPE over a :class:`SearchSpace`, each suggestion put through gates before launch.

    Composed of parts, each with one job and its own saved state, as Ray composes a
    ``ConcurrencyLimiter`` around a searcher: the study (Optuna's record and sampler), the plan
    (what runs before TPE), the screen and its gates (why a recipe must not launch), the
    launches (which trial runs what, on which devices). Built by :meth:`for_trainable`.

    Args:
        space: The coupled space (raw knobs are searched, the rest derived).
        penalty: The objective told for prescreened-out, failed or censored trials (PAR-10:
            10x the trainable's time cap: :meth:`for_trainable` reads it from the trainable).
        study: The search's record (default: a new in-memory study, kept in the searcher's
            Tune checkpoint for a restore).
        plan: What runs before TPE (default: nothing; TPE from the first trial).
        gates: Asked in order before every launch (default: only what ran out of memory is
            refused: :class:`~raybatch.tuning.gates.LearnedOutOfMemory`).
        devices: How trials take devices (default: whole devices, room not checked).

    Example::

        from ray import tune
        import raybatch
        from raybatch.examples.digits import workload

        fn = raybatch.trainable(workload, "digits_cnn_sgd", "accuracy>=0.9", max_time_s=60)
        searcher = raybatch.RaybatchSearcher.for_trainable(fn, storage_url="sqlite:///optuna.db")
        scheduler = raybatch.CappingScheduler.for_trainable(fn)
        config = tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=20)
        tune.Tuner(fn, tune_config=config).fit()  # then: optuna-dashboard sqlite:///optuna.db
    """

    def __init__(
        self,
        space: SearchSpace,
        *,
        penalty: float,
        study: SearchStudy | None = None,
        plan: Plan | None = None,
        gates: Sequence[Gate] | None = None,
        devices: Devices | None = None,
    ) -> None:
        super().__init__(metric=keys.OBJECTIVE, mode="min")
        if not (isinstance(penalty, int | float) and math.isfinite(penalty) and penalty > 0):
            why = f"must be a positive number (10x the trainable's max_time_s), got {penalty!r}"
            raise OptionError([Issue("penalty", why)])
        self.space = space
        self.run_format = RUN_FORMAT  # Tune pickles the searcher whole: a resume reads it here
        self.record = study if study is not None else SearchStudy(None, DEFAULT_STUDY)
        self.penalty = penalty
        self.plan = plan if plan is not None else Plan(space)
        self.plan.attach(self.record)
        self.gates = list(gates) if gates is not None else [LearnedOutOfMemory()]
        self.devices = devices if devices is not None else Devices()
        self.screen = Screen(space, self.record, self.plan, self.gates, penalty)
        self.launches = Launches(self.record, self.plan, self.screen, self.devices)
        self.paused: set[str] = set()
        """Trials the scheduler paused (Ray's ``on_pause``; :mod:`raybatch.tuning.promotion`)."""

    def on_pause(self, trial_id: str) -> None:
        self.paused.add(trial_id)

    def on_unpause(self, trial_id: str) -> None:
        self.paused.discard(trial_id)
        number = self.launches.numbers.get(trial_id)
        if number is not None:
            self.plan.opening.resumed(number)

    @classmethod
    def for_trainable(
        cls,
        trainable: Callable[..., Any],
        *,
        prescreen: bool = True,
        seed: int = 0,
        storage_url: str | None = None,
        study_name: str = DEFAULT_STUDY,
    ) -> RaybatchSearcher:
        """The searcher for a :func:`raybatch.trainable`: its space, the penalty, GPU model and
        CUDA context of its settings and, with ``prescreen`` and a budget there, a pre-screen of
        its workload; TPE seeded with ``seed``, its study in ``storage_url`` (default: in
        memory, kept in the searcher's checkpoint)."""
        parts = parts_of(trainable, "build RaybatchSearcher(space, penalty=..., gates=...) instead")
        estimator = None
        if prescreen and parts.settings.budget_bytes is not None:
            cuda = parts.settings.device != "cpu"  # "auto": a GPU's, where Ray assigns one
            estimator = MemoryEstimator.for_space(parts.workload, parts.space, cuda)
        gates, devices = for_settings(parts.settings, estimator)
        study = SearchStudy(storage_url, study_name, seed)
        return cls(
            parts.space, penalty=parts.settings.penalty, study=study, gates=gates, devices=devices
        )

    @property
    def study(self) -> optuna.Study:
        """The Optuna study (opened on first use; the plan's opening queued if it is new)."""
        self.plan.queue_opening()
        return self.record.study

    @property
    def prescreened(self) -> list[Prescreened]:
        """This process's refusals before launch, typed as rows (:class:`Prescreened`)."""
        return self.screen.refused

    @property
    def gave_up(self) -> str | None:
        """Why the searcher stopped suggesting, if it did (read from the study: a restored
        searcher does not ask Optuna all over again)."""
        return self.record.gave_up_reason()

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        if metric:
            self._metric = metric
        return mode in (None, "min")  # the objective (a time) is always minimised

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]
        """The next config that passes the pre-screen (:class:`~raybatch.tuning.screen.Screen`);
        ``Searcher.FINISHED`` once it gave up (the reason in :attr:`gave_up`), rather than
        raising inside Tune's controller, which would end the whole experiment as a crash."""
        again = self.launches.again(trial_id)  # a restored trial, or a packed OOM run alone
        if again is not None:
            return again
        if self.gave_up is not None:
            return Searcher.FINISHED
        # The opening's trials the scheduler paused count as ended for the ladder's turn.
        self.plan.paused = {self.launches.numbers[t] for t in self.paused
                            if t in self.launches.numbers}  # fmt: skip
        if self.paused and self.plan.awaits_opening():
            return None  # Tune asks again later; the scheduler resumes the opening's leader
        if self.launches.held is not None:  # a data-parallel recipe waiting for its workers
            wait, launched = self.launches.release(trial_id)
            if wait or launched is not None:
                return launched  # None: Tune asks again later; nothing starts only to wait
        passed = self.screen.next()
        if passed is None:
            return Searcher.FINISHED
        return self.launches.start(passed, trial_id)

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """An evaluation's target metric, kept in the study as the trial's intermediate value
        at its samples seen (learning curves in optuna-dashboard)."""
        number = self.launches.numbers.get(trial_id)
        evaluation = evaluation_of(result)
        if number is not None and evaluation is not None:
            self.record.progress(number, evaluation[1], evaluation[0])
            if result.get(keys.TRAIN_S) is not None:
                self.plan.opening.evaluated(number, float(result[keys.TRAIN_S]), evaluation[1])

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        """Tell Optuna the trial's objective (one the scheduler stopped is PRUNED); one out of
        memory is told infeasible and taught to the gates, or, packed, runs once more alone."""
        self.devices.free(trial_id)
        self.paused.discard(trial_id)
        result = result or {}
        self.plan.ended(trial_id, result)
        number = self.launches.to_tell(trial_id)
        if number is None:
            return
        self.on_trial_result(trial_id, result)  # the last evaluation, if Tune sent it here
        status, value = final_status(result, error, self.penalty)
        recipe = carried_recipe(self.record.config_of(number))  # read while the trial is open
        out_of_memory = self.launches.end(trial_id, number, status, value, result)
        self.screen.learn(trial_id, recipe, result, out_of_memory)
        self.launches.told(trial_id)  # once the study and the gates have it

    def save(self, checkpoint_path: str) -> None:
        """Tune's checkpoint: the searcher pickled whole, its parts with it, as Ray's
        ``OptunaSearch`` pickles its ``__dict__``, stamped with the run format
        (:func:`write_checkpoint`)."""
        write_checkpoint(self.checkpoint(), checkpoint_path, self.record)

    def restore(self, checkpoint_path: str) -> None:
        state = read_checkpoint(checkpoint_path, self.record)
        self.restore_checkpoint(state, checkpoint_path)

    def checkpoint(self) -> dict[str, Any]:
        """What its Tune checkpoint holds: the format stamp, the searcher's ``__dict__`` and
        an in-memory study's storage (the study itself is the restoring searcher's)."""
        return {FORMAT_KEY: RUN_FORMAT, "searcher": self.__dict__,
                "memory_storage": self.record.memory_storage}  # fmt: skip

    def restore_checkpoint(self, state: dict[str, Any], source: str) -> None:
        """Take back :meth:`checkpoint`, read from ``source`` (named where it cannot be read):
        every part as it was, but what a new session starts afresh."""
        check_format(state.get(FORMAT_KEY), source)
        self.__dict__.update(state["searcher"])
        self.record.use_memory_storage(state["memory_storage"])
        self.launches.held = None  # a held data-parallel recipe is asked again
        self.plan.said_tpe = False  # said once a session
        self.paused = set()  # Tune runs a restored paused trial again: the scheduler says


STUDY_ID = "raybatch-study"
"""How a checkpoint names the study: not pickled, but the restoring searcher's own, which the
driver points at the run directory the run is resumed in (a copied run's own ``optuna.db``):
every part that holds the study takes that one."""


class _Checkpointer(cloudpickle.CloudPickler):
    """Ray's cloudpickle, as Tune pickles the searcher it is given (a gate of your own defined
    in a notebook or a function pickles too), naming ``study`` by :data:`STUDY_ID`."""

    def __init__(self, file: BinaryIO, study: SearchStudy) -> None:
        super().__init__(file)
        self.study = study

    def persistent_id(self, obj: Any) -> str | None:
        return STUDY_ID if obj is self.study else None


class _Reader(pickle.Unpickler):
    """Reads what :class:`_Checkpointer` wrote, with ``study`` where it names the study."""

    def __init__(self, file: BinaryIO, study: SearchStudy) -> None:
        super().__init__(file)
        self.study = study

    def persistent_load(self, pid: Any) -> Any:
        if pid != STUDY_ID:
            raise pickle.UnpicklingError(f"unknown reference {pid!r}")
        return self.study


def write_checkpoint(state: dict[str, Any], path: str, study: SearchStudy) -> None:
    """Pickle ``state`` to ``path``, ``study`` named, not pickled (:class:`_Checkpointer`)."""
    with open(path, "wb") as f:
        _Checkpointer(f, study).dump(state)


def read_checkpoint(path: str, study: SearchStudy) -> dict[str, Any]:
    """A searcher's Tune checkpoint (:func:`write_checkpoint`), unpickled with ``study`` where
    it names the study.

    Raises:
        RunDirError: ``path`` does not unpickle here (written by a raybatch whose classes
            lived elsewhere, or cut short), named; a format this one cannot read is refused
            where it is taken back.
    """
    try:
        with open(path, "rb") as f:
            state = _Reader(f, study).load()
    except (ImportError, AttributeError, EOFError, pickle.UnpicklingError) as exc:
        why = (f"unreadable ({type(exc).__name__}: {first_line(exc)}): written by another"
               " raybatch version, or cut short; start a new search")  # fmt: skip
        raise RunDirError([Issue(FORMAT_KEY, why)], path) from None
    return state if isinstance(state, dict) else {}
