"""The searcher: Optuna's TPE over the raw knobs, with a memory pre-screen before every launch.

A Ray Tune ``Searcher`` built directly on Optuna's ask/tell rather than on Ray's
``OptunaSearch``, because:

- **pre-screening** needs to ask Optuna for a point, reject it *without launching a trial*,
  tell Optuna it was infeasible, and ask again inside one ``suggest`` call; ``OptunaSearch``
  maps one Tune trial to one Optuna trial and cannot;
- **infeasibility is taught, not hidden**: a rejected point is told as a completed trial with
  the PAR-10 penalty *and* a positive constraint violation (``Trial.set_constraint``), which
  Optuna's constrained TPE uses to steer away from the region — a silent skip would let the
  sampler propose the same OOM config again, the complaint users have about other tools;
- **a real OOM is remembered**: when a launched trial runs out of memory although the
  estimate said it fits, its constraint is set positive too, and every later suggestion that
  needs at least as much memory (micro batch, accumulation and world size all no smaller) is
  rejected before launch — the estimate was wrong once, the same mistake is not paid twice;
- **a recipe the cluster cannot place is never launched** (``world_size`` above the GPUs or
  CPUs the cluster has now, read at each suggestion), and **a data-parallel recipe waits in
  the searcher** (:mod:`raybatch.run.launches`), held until its workers fit, instead of
  starting to wait inside ``fit()``;
- **packing is decided in the searcher**: probes calibrate the estimator
  (:meth:`MemoryEstimator.observe`) and later suggestions' ``gpu_share`` comes from the
  calibrated prediction; a trial out of memory while packed runs once more *alone* before its
  recipe is taught infeasible;
- **one study is the record**: every Tune trial is one Optuna trial whose number is kept in
  the searcher's checkpoint, so after a resume the study and the Ray experiment agree. A trial
  that reached is COMPLETE with its time to target; one the scheduler capped is PRUNED, with
  the target metric at each evaluation as its intermediate values (what optuna-dashboard
  draws as learning curves), as Optuna's own pruners leave a trial; every other end is
  COMPLETE with the penalty.
- **a plan before TPE** (:mod:`raybatch.run.plan`): the largest batch that fits at a sweep
  of LRs and the reference recipe run first; once they have all finished, the LR multiplier
  that was fastest at the largest batch is carried to a ladder of other batches (the ones the
  time model, measured inside the first trial that reaches the target, predicts fastest); an
  opening point out of memory is replaced by the next smaller micro batch, so the largest
  batch that *really* fits is swept;
- **the pre-screen's error does not hide the optimum**: with ``probe_margin``, a config the
  estimate puts over the budget by less than that margin is launched anyway, and the trial's
  real probe step (one step, before its clock starts) decides; if it runs out of memory it is
  taught infeasible like any OOM.

TPE runs multivariate (the knobs interact: the LR multiplier that works depends on the batch)
with the constant liar for trials still running in parallel, after a short random start.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ray.tune.search import Searcher

from raybatch import keys
from raybatch.errors import Issue, OptionError
from raybatch.memory.estimator import MemoryEstimator
from raybatch.run.gates import Devices, Gate, LearnedOutOfMemory, for_settings
from raybatch.run.launches import Launches
from raybatch.run.plan import Plan
from raybatch.run.screen import Screen
from raybatch.run.study import DEFAULT_STUDY, Prescreened, SearchStudy
from raybatch.space.config import carried_recipe
from raybatch.space.search_space import SearchSpace
from raybatch.status import evaluation_of, final_status
from raybatch.trial.settings import parts_of
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
        study: The search's record (default: a new in-memory study, kept in the searcher's
            Tune checkpoint for a restore).
        penalty: The objective told for prescreened-out, failed or censored trials (PAR-10:
            10x the trainable's time cap). Required; :meth:`for_trainable` reads it.
        plan: What runs before TPE (default: nothing; TPE from the first trial).
        gates: Asked in order before every launch (default: only what ran out of memory is
            refused: :class:`~raybatch.run.gates.LearnedOutOfMemory`).
        devices: How trials take devices (default: whole devices, room not checked).
    """

    def __init__(
        self,
        space: SearchSpace,
        study: SearchStudy | None = None,
        penalty: float | None = None,
        plan: Plan | None = None,
        gates: Sequence[Gate] | None = None,
        devices: Devices | None = None,
    ) -> None:
        super().__init__(metric=keys.OBJECTIVE, mode="min")
        if penalty is None:
            why = "needed: 10x the trainable's max_time_s (for_trainable(fn) reads it from fn)"
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
        self.launches = Launches(self.screen, self.devices)

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
        parts = parts_of(trainable)
        estimator = None
        if prescreen and parts.settings.budget_bytes is not None:
            estimator = MemoryEstimator.for_space(parts.workload, parts.space)
        gates, devices = for_settings(parts.settings, estimator)
        study = SearchStudy(storage_url, study_name, seed)
        return cls(parts.space, study, parts.settings.penalty, None, gates, devices)

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
        """The next config that passes the pre-screen (:class:`~raybatch.run.screen.Screen`);
        ``Searcher.FINISHED`` once it gave up (the reason in :attr:`gave_up`), rather than
        raising inside Tune's controller, which would end the whole experiment as a crash."""
        again = self.launches.again(trial_id)  # a restored trial, or a packed OOM run alone
        if again is not None:
            return again
        if self.gave_up is not None:
            return Searcher.FINISHED
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

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        """Tell Optuna the trial's objective (one the scheduler stopped is PRUNED); one out of
        memory is told infeasible and taught to the gates, or, packed, runs once more alone."""
        self.devices.free(trial_id)
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
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.state(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.restore_state(pickle.load(f), checkpoint_path)

    def state(self) -> dict[str, Any]:
        """What its Tune checkpoint holds (its parts' state, the format stamp)."""
        state = {FORMAT_KEY: RUN_FORMAT, **self.launches.state(), **self.screen.state()}
        state["plan"] = self.plan.state()
        state["memory_storage"] = self.record.memory_storage  # None for a storage URL
        return state

    def restore_state(self, state: dict[str, Any], source: str) -> None:
        """Take back :meth:`state`, read from ``source`` (named where it cannot be read)."""
        check_format(state.get(FORMAT_KEY), source)
        self.screen.restore(state, source)
        self.launches.restore(state)  # a held data-parallel recipe is asked again
        self.plan.restore(state["plan"])
        self.record.use_memory_storage(state["memory_storage"])
