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
  CPUs the cluster has now, read at each suggestion), and **a data-parallel recipe waits
  here**, held until its workers fit, instead of starting to wait inside ``fit()``;
- **packing is decided here**: probes calibrate the estimator (:meth:`MemoryEstimator.observe`)
  and later suggestions' ``gpu_share`` comes from the calibrated prediction; a trial out of
  memory while packed runs once more *alone* before its recipe is taught infeasible;
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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ray.tune.search import Searcher

from raybatch import keys
from raybatch.errors import ConfigError, Issue, OptionError, TraceError
from raybatch.memory.budget import CUDA_CONTEXT_OVERHEAD_BYTES
from raybatch.memory.estimator import MemoryEstimator
from raybatch.memory.prescreen import PrescreenResult, learned_oom
from raybatch.results.selection import is_packed
from raybatch.run.plan import Plan
from raybatch.run.resources import gpu_fraction
from raybatch.run.seeding import Ladder
from raybatch.run.study import DEFAULT_STUDY, Prescreened, SearchStudy
from raybatch.space.config import TrialConfig
from raybatch.space.search_space import SearchSpace
from raybatch.space.tune_space import OptunaDefineByRun
from raybatch.status import TrialStatus, final_status
from raybatch.trial.placement import placement_problem, running_ray, worker_room
from raybatch.trial.settings import parts_of

if TYPE_CHECKING:
    import optuna

MAX_PRESCREEN_ATTEMPTS = 200
"""Suggestions in a row the pre-screen may reject before the searcher gives up (the space's
smallest recipes do not fit either) and ends the search."""
OOM_VIOLATION = 1.0
"""Constraint told for a trial that ran out of memory for real. Its true need is unknown (the
allocation that failed is not the peak), only that it is over the budget: any positive value
marks it infeasible to TPE, and 1.0 ("twice the budget") ranks it behind near-misses."""


CHECKPOINTED = {
    "trial_numbers": "_trial_numbers",
    "completed": "_completed",
    "prescreened": "prescreened",
    "out_of_memory": "out_of_memory",
    "retry_alone": "_retry_alone",
    "retried": "_retried",
    "running_workers": "_running_workers",
}
"""What the searcher's Tune checkpoint holds: key -> attribute (the plan's state and an
in-memory study are added beside them)."""


class RaybatchSearcher(Searcher):
    """Optuna TPE over a :class:`SearchSpace`, pre-screening every suggestion for memory.

    Args:
        space: The coupled space (raw knobs are searched, the rest derived).
        storage_url: Optuna storage (``sqlite:///RUN_DIR/optuna.db`` for ``raybatch search``);
            ``None``: in memory, kept in the searcher's Tune checkpoint for a restore.
        study_name: The study's name in that storage.
        penalty: The objective told for prescreened-out, failed or censored trials (PAR-10:
            10x the trainable's time cap). Required; :meth:`for_trainable` reads it.
        estimator: Memory estimator for the pre-screen (``None``: no pre-screen).
        budget_bytes: The per-GPU budget the pre-screen compares against.
        points_to_evaluate: Raw-knob dicts to run first (reference recipe, max-batch
            baseline); enqueued once, when the study is new.
        seed: Sampler seed.
        metric: The result field to minimise (``objective``).
        data_parallel_gpus: Whether data-parallel workers take GPUs (placement is checked
            against GPUs) or CPUs; ``None``: placement is not checked.
        pack_gpus: Decide each trial's GPU share here (``gpus_per_trial="auto"``).
        ladder: The plan's second stage, queued once ``points_to_evaluate`` have all finished
            (``None``: TPE goes on alone).
        probe_margin: Launch a config the estimate puts over the budget by at most this
            fraction, for its trial's real probe to decide (0: the estimate decides; only
            meaningful where trials probe on a real device).
        baseline: The largest batch's integer knobs, all of them (a knob with one choice is
            not among the searched ones); default: read from the first opening point.
        gpu_model: The GPU model the search is pinned to (``--gpu-model``): data-parallel
            recipes are placed against that model's GPUs only.
        context_bytes: One trial's CUDA context (measured by the search): packing pays one each.
    """

    def __init__(
        self,
        space: SearchSpace,
        storage_url: str | None = None,
        study_name: str = DEFAULT_STUDY,
        penalty: float | None = None,
        estimator: MemoryEstimator | None = None,
        budget_bytes: int | None = None,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        seed: int = 0,
        metric: str = keys.OBJECTIVE,
        data_parallel_gpus: bool | None = None,
        pack_gpus: bool = False,
        ladder: Ladder | None = None,
        probe_margin: float = 0.0,
        baseline: dict[str, Any] | None = None,
        gpu_model: str | None = None,
        context_bytes: int = CUDA_CONTEXT_OVERHEAD_BYTES,
    ) -> None:
        super().__init__(metric=metric, mode="min")
        if penalty is None:
            why = "needed: 10x the trainable's max_time_s (for_trainable(fn) reads it from fn)"
            raise OptionError([Issue("penalty", why)])
        self.space = space
        self.record = SearchStudy(storage_url, study_name, seed)
        self.penalty = penalty
        self.estimator = estimator
        self.budget_bytes = budget_bytes
        self._define = OptunaDefineByRun(space, record=False)  # suggest() stores the config
        self._trial_numbers: dict[str, int] = {}
        self._completed: set[str] = set()
        self.prescreened: list[Prescreened] = []  # this process's rejections, typed as rows
        self.out_of_memory: list[dict[str, Any]] = []  # launched configs that ran out for real
        self._pending_points = list(points_to_evaluate or [])
        self.data_parallel_gpus = data_parallel_gpus
        self.gpu_model = gpu_model  # data-parallel recipes are placed on this model's GPUs
        self.context_bytes = context_bytes
        self._running_workers: dict[str, float] = {}  # Tune trial -> devices it holds
        self._held: tuple[int, dict[str, Any], TrialConfig] | None = None
        self.pack_gpus = pack_gpus
        self._retry_alone: list[int] = []  # Optuna trials to launch again, alone on a GPU
        self._retried: set[int] = set()
        self.probe_margin = probe_margin
        self.plan = Plan(space, self.record, points_to_evaluate or [], ladder, baseline)

    @classmethod
    def for_trainable(
        cls, trainable: Callable[..., Any], *, prescreen: bool = True, **kwargs: Any
    ) -> RaybatchSearcher:
        """The searcher for a :func:`raybatch.trainable`: its space, the penalty, GPU model and
        CUDA context of its settings and, with ``prescreen`` and a budget there, a pre-screen of
        its workload; ``kwargs`` are the other arguments (``seed``, ...), or override these."""
        parts = parts_of(trainable)
        s = parts.settings
        if prescreen and s.budget_bytes is not None:
            kwargs.setdefault("estimator", MemoryEstimator.for_space(parts.workload, parts.space))
        mine = {"budget_bytes": s.budget_bytes, "context_bytes": s.cuda_context_bytes,
                "gpu_model": s.gpu_model, "data_parallel_gpus": s.data_parallel_gpus}  # fmt: skip
        return cls(parts.space, penalty=s.penalty, **{**mine, **kwargs})

    @property
    def study(self) -> optuna.Study:
        """The Optuna study (opened on first use; the first points queued if it is new)."""
        self._queue_first_points()
        return self.record.study

    @property
    def gave_up(self) -> str | None:
        """Why the searcher stopped suggesting, if it did; read from the study, so that a
        searcher restored from a checkpoint does not ask Optuna all over again."""
        return self.record.gave_up_reason()

    def _queue_first_points(self) -> None:
        if self._pending_points:
            self.record.enqueue_if_new(self._pending_points)
            self._pending_points = []

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        if metric:
            self._metric = metric
        return mode in (None, "min")  # the objective (a time) is always minimised

    # ------------------------------------------------------------------ suggest

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]
        """The next config that passes the pre-screen; rejected ones are told as infeasible.

        When :data:`MAX_PRESCREEN_ATTEMPTS` suggestions in a row are rejected, the search
        ends (``Searcher.FINISHED``) with the reason in :attr:`gave_up`, rather than raising
        inside Tune's controller, which would end the whole experiment as a crash.
        """
        if trial_id in self._trial_numbers:  # a restored, unfinished trial asks again
            return self.record.config_of(self._trial_numbers[trial_id])
        if self._retry_alone:
            number = self._retry_alone.pop(0)
            self.record.relaunched(number, trial_id)
            self._trial_numbers[trial_id] = number
            self._running_workers[trial_id] = 1.0  # a whole GPU, alone
            return {**self.record.config_of(number), keys.ALONE: True, keys.GPU_SHARE: 1.0}
        if self.gave_up is not None:
            return Searcher.FINISHED
        if self._held is not None:  # a data-parallel recipe waiting for room for its workers
            number, config, recipe = self._held
            held = self.record.live(number)
            if held is not None and not self._room_for(recipe):
                problem = None if self._running_workers else self._placement(recipe)
                if problem is None:
                    return None  # Tune asks again later; nothing starts only to wait
                # Nothing runs and it still cannot be placed: the cluster shrank since.
                self._reject(held, config, OOM_VIOLATION, problem, None, memory=False)
                held = None
            self._held = None
            if held is not None:
                return self._launch(held, config, recipe, trial_id)
        self._queue_first_points()
        self.plan.queue_ladder()
        for _ in range(MAX_PRESCREEN_ATTEMPTS):
            ot_trial = self.record.ask()
            try:  # the recipe, derived once, here, where the knobs are chosen
                constants = self._define(ot_trial)
            except ConfigError as exc:  # a combination the space's limits refuse: never run
                self.plan.note_opening(ot_trial)
                params = dict(ot_trial.params)
                self._reject(ot_trial, params, OOM_VIOLATION, str(exc), None, memory=False)
                continue
            self.plan.note_opening(ot_trial)
            config = {**ot_trial.params, **constants}
            recipe = TrialConfig.from_dict(config)  # the define-by-run's, derived once
            problem = self._placement(recipe)
            if problem is not None:
                self._reject(ot_trial, config, OOM_VIOLATION, problem, None, memory=False)
                continue
            verdict = self._screen(recipe)
            if verdict is not None and verdict.fits is False:
                assert verdict.predicted_bytes is not None and self.budget_bytes is not None
                violation = (verdict.predicted_bytes - self.budget_bytes) / self.budget_bytes
                if violation > self.probe_margin:
                    self._reject(
                        ot_trial, config, violation, verdict.reason, verdict.predicted_bytes
                    )
                    continue
            learned = learned_oom(config, self.out_of_memory)
            if learned is not None:
                self._reject(ot_trial, config, OOM_VIOLATION, learned, None)
                continue
            if self.pack_gpus and self.estimator is not None and self.budget_bytes is not None:
                predicted = self.estimator.predict(recipe)
                share = gpu_fraction(predicted, self.budget_bytes, context_bytes=self.context_bytes)
                config[keys.GPU_SHARE] = share
            if not self._room_for(recipe):
                self._held = (ot_trial.number, config, recipe)
                return None
            return self._launch(ot_trial, config, recipe, trial_id)
        last = self.prescreened[-1].reason if self.prescreened else "?"
        self.record.gave_up(
            f"{MAX_PRESCREEN_ATTEMPTS} suggestions in a row were rejected before launch (the last:"
            f" {last}); the space's smallest recipes may already be too large for this cluster"
        )
        return Searcher.FINISHED

    def _launch(
        self, ot_trial: optuna.Trial, config: dict[str, Any], recipe: TrialConfig, trial_id: str
    ) -> dict[str, Any]:
        self.record.launched(ot_trial, config, trial_id)  # constraint told at completion
        self._trial_numbers[trial_id] = ot_trial.number
        # Measured alone on its device: a packed trial's step times are its neighbours' too.
        if self.plan.wants_time_model(recipe) and not is_packed(config.get(keys.GPU_SHARE)):
            config = {**config, keys.MEASURE_TIME_MODEL: True}  # for Tune only, not the study
            self.plan.measuring = trial_id
        # What it holds: every data-parallel worker, or a single trial's share of a GPU.
        held = recipe.world_size if recipe.world_size > 1 else config.get(keys.GPU_SHARE, 1.0)
        self._running_workers[trial_id] = float(held)
        return config

    def _room_for(self, recipe: TrialConfig) -> bool:
        """Whether a data-parallel recipe's workers fit beside what the trials running now hold
        (data-parallel workers, and single trials' GPUs or CPUs). Tune would otherwise start its
        trial at once (the trial itself holds no GPU) to wait inside ``fit()`` for workers, on
        the hang guard's clock, and be censored as hung for being queued."""
        ray = running_ray()
        if recipe.world_size <= 1 or self.data_parallel_gpus is None or ray is None:
            return True
        room = worker_room(ray, self.data_parallel_gpus, self.gpu_model)
        return sum(self._running_workers.values()) + recipe.world_size <= room

    # ------------------------------------------------------------------ placement

    def _placement(self, recipe: TrialConfig) -> str | None:
        if self.data_parallel_gpus is None:
            return None
        return placement_problem(recipe.world_size, self.data_parallel_gpus, self.gpu_model)

    def _screen(self, recipe: TrialConfig) -> PrescreenResult | None:
        if self.estimator is None or self.budget_bytes is None:
            return None
        return self.estimator.prescreen(recipe, self.budget_bytes)

    def _reject(
        self,
        ot_trial: optuna.Trial,
        config: dict[str, Any],
        violation: float,
        reason: str,
        predicted_bytes: int | None,
        memory: bool = True,
    ) -> None:
        self.record.reject(ot_trial, violation, self.penalty, reason, predicted_bytes, config)
        self.plan.opening_done(ot_trial.number, None, memory=memory)
        self.prescreened.append(Prescreened.of(ot_trial.number, config, reason, predicted_bytes))

    # ------------------------------------------------------------------ results

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """An evaluation's target metric, kept in the study as the trial's intermediate value
        at its samples seen (learning curves in optuna-dashboard); heartbeats are not
        evaluations."""
        number = self._trial_numbers.get(trial_id)
        metric = result.get(keys.METRIC)
        if number is None or metric is None or result.get(keys.HEARTBEAT):
            return
        self.record.progress(number, float(metric), int(result.get(keys.SAMPLES_SEEN) or 0))

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        """Tell Optuna the trial's objective; a trial stopped mid-run by the scheduler is capped
        (PRUNED in the study).

        A trial that ran out of memory is told infeasible (positive constraint) and remembered,
        so that no later suggestion needing as much memory is launched.
        """
        self._running_workers.pop(trial_id, None)
        self.plan.ended(trial_id, result or {})
        number = self._trial_numbers.get(trial_id)
        if number is None or trial_id in self._completed:
            return
        self.on_trial_result(trial_id, result or {})  # the last evaluation, if Tune sent it here
        status, value = final_status(result, error, self.penalty)
        oom = status is TrialStatus.INFEASIBLE_MEMORY
        self._calibrate(number, result or {})
        if oom and is_packed((result or {}).get(keys.GPU_SHARE)) and number not in self._retried:
            self._completed.add(trial_id)
            self._retry_alone.append(number)
            self._retried.add(number)  # once: a second OOM is the recipe's
            return
        time_to_target = (result or {}).get(keys.TIME_TO_TARGET_S)
        told = self.record.finish(
            number, status, value, OOM_VIOLATION if oom else 0.0, time_to_target
        )
        self._completed.add(trial_id)
        reached = time_to_target if status is TrialStatus.REACHED else None
        self.plan.opening_done(number, reached, oom)
        if told is None:
            return  # told before an interruption that Tune's saved state predates
        self._trial_numbers[trial_id] = told
        if oom:
            config = self.record.config_of(told)
            self.out_of_memory.append({**config, keys.TUNE_TRIAL_ID: trial_id})

    def _calibrate(self, number: int, result: dict[str, Any]) -> None:
        measured = result.get(keys.PROBE_RESERVED_BYTES)
        if self.estimator is None or not measured:
            return
        recipe = TrialConfig.from_dict(self.record.config_of(number))  # the launched recipe
        try:
            self.estimator.observe(recipe, int(measured))
        except TraceError:  # an untraceable workload has no model to calibrate
            return

    # ------------------------------------------------------------------ checkpoint

    def save(self, checkpoint_path: str) -> None:
        state = {key: getattr(self, attr) for key, attr in CHECKPOINTED.items()}
        state["plan"] = self.plan.state()
        state["memory_storage"] = self.record.memory_storage  # None for a storage URL
        state["probed"] = dict(self.estimator.probed) if self.estimator is not None else {}
        with open(checkpoint_path, "wb") as f:
            pickle.dump(state, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        for key, attr in CHECKPOINTED.items():
            setattr(self, attr, state[key])
        self.plan.restore(state["plan"])
        if self.estimator is not None:  # what the probes taught before the interruption
            self.estimator.probed.update(state["probed"])
        self.record.use_memory_storage(state["memory_storage"])
        self._held = None  # a held data-parallel recipe is asked again
        self._pending_points = []
