"""What a suggestion passes before it is launched: gates, and the devices trials take.

The searcher (:class:`raybatch.tuning.searcher.RaybatchSearcher`) puts each recipe Optuna suggests
through its gates in order; the first :class:`Rejection` keeps it from launching, and Optuna is
told why (infeasible where it is about memory, so that TPE steers away). A gate is one question
about one recipe, as a sampler is one way to choose in Optuna: subclass :class:`Gate`, answer
:meth:`Gate.check`, and learn from finished trials in :meth:`Gate.learn`. What a gate learned is
kept in the searcher's Tune checkpoint, so a resumed search rejects what it rejected before.

A search's gates (:func:`search_gates`), in order: :class:`Placement` (data-parallel workers can
be placed now), :class:`MemoryFits` (the memory estimate fits the per-GPU budget) and
:class:`LearnedOutOfMemory` (no less memory than a recipe that ran out for real).

:class:`Devices` is not a gate: it decides a launched trial's share of a GPU where trials are
packed, and whether a data-parallel recipe's workers fit beside the trials running now (the
searcher holds it until they do).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raybatch import keys
from raybatch.cluster.budget import CUDA_CONTEXT_OVERHEAD_BYTES
from raybatch.cluster.placement import placement_problem, running_ray, worker_room
from raybatch.cluster.resources import gpu_fraction
from raybatch.errors import TraceError
from raybatch.memory.estimator import MemoryEstimator
from raybatch.memory.prescreen import RanOut, learned_oom
from raybatch.space.config import TrialConfig
from raybatch.trial.settings import TrialSettings

OOM_VIOLATION = 1.0
"""Constraint told for a recipe refused without a measured size (it ran out of memory for
real, or cannot be placed). Its true need is unknown, only that it is over the budget: any
positive value marks it infeasible to TPE, and 1.0 ("twice the budget") ranks it behind
near-misses."""


@dataclass(frozen=True)
class Rejection:
    """Why a recipe is not launched.

    Attributes:
        reason: Said in the study, ``trials.csv`` and the notes.
        violation: Optuna's constraint value (> 0: infeasible).
        predicted_bytes: The estimate's peak, where the estimate refused it.
        memory: A refusal for memory (the plan's opening steps down to a smaller micro batch
            after one); ``False`` for one that no batch size would change (placement).
    """

    reason: str
    violation: float = OOM_VIOLATION
    predicted_bytes: int | None = None
    memory: bool = True


class Gate:
    """One check every suggestion passes before launch; the base answers "no objection".

    Subclasses override :meth:`check`, and :meth:`learn` where they learn from finished
    trials; a gate is pickled with the searcher in its Tune checkpoint, so what it learned
    is kept through a resume without more code.
    """

    def check(self, recipe: TrialConfig) -> Rejection | None:
        """Why ``recipe`` must not launch, or ``None``."""
        return None

    def learn(
        self, trial_id: str, recipe: TrialConfig, result: dict[str, Any], out_of_memory: bool
    ) -> None:
        """Tune trial ``trial_id`` ran ``recipe`` and ended with ``result`` (Tune's);
        ``out_of_memory``: it ran out of memory and that is its recipe's verdict (not a packed
        trial about to run again alone)."""


class Placement(Gate):
    """A data-parallel recipe's workers can be placed on the cluster now (its GPUs, of the
    pinned model, or its CPUs), checked at every suggestion: also after a resume on a smaller
    cluster."""

    def __init__(self, data_parallel_gpus: bool, gpu_model: str | None = None) -> None:
        self.data_parallel_gpus = data_parallel_gpus
        self.gpu_model = gpu_model

    def check(self, recipe: TrialConfig) -> Rejection | None:
        problem = placement_problem(recipe.world_size, self.data_parallel_gpus, self.gpu_model)
        return None if problem is None else Rejection(problem, memory=False)


class MemoryFits(Gate):
    """The memory estimate of a recipe fits ``budget_bytes``; over it by at most
    ``probe_margin`` (a fraction), the trial's real probe decides. Every probe that fitted
    calibrates the estimate (:meth:`MemoryEstimator.observe`)."""

    def __init__(
        self, estimator: MemoryEstimator, budget_bytes: int, probe_margin: float = 0.0
    ) -> None:
        self.estimator = estimator
        self.budget_bytes = budget_bytes
        self.probe_margin = probe_margin

    def check(self, recipe: TrialConfig) -> Rejection | None:
        verdict = self.estimator.prescreen(recipe, self.budget_bytes)
        if verdict.fits is not False:
            return None
        if verdict.predicted_bytes is None:  # real steps on the device ran out: no margin
            return Rejection(verdict.reason)
        violation = (verdict.predicted_bytes - self.budget_bytes) / self.budget_bytes
        if violation <= self.probe_margin:
            return None
        return Rejection(verdict.reason, violation, verdict.predicted_bytes)

    def learn(
        self, trial_id: str, recipe: TrialConfig, result: dict[str, Any], out_of_memory: bool
    ) -> None:
        measured = result.get(keys.PROBE_RESERVED_BYTES)
        if not measured:
            return
        try:
            self.estimator.observe(recipe, int(measured))
        except TraceError:  # an untraceable workload has no model to calibrate
            return


class LearnedOutOfMemory(Gate):
    """A recipe needing at least the memory of one that ran out for real (micro batch,
    accumulation and world size all no smaller) is refused before launch: the estimate was
    wrong once, the same mistake is not paid twice."""

    def __init__(self) -> None:
        self.out_of_memory: list[RanOut] = []

    def check(self, recipe: TrialConfig) -> Rejection | None:
        learned = learned_oom(recipe, self.out_of_memory)
        return None if learned is None else Rejection(learned)

    def learn(
        self, trial_id: str, recipe: TrialConfig, result: dict[str, Any], out_of_memory: bool
    ) -> None:
        if out_of_memory:
            self.out_of_memory.append(RanOut(trial_id, recipe))


def search_gates(
    estimator: MemoryEstimator | None,
    budget_bytes: int | None,
    probe_margin: float = 0.0,
    data_parallel_gpus: bool | None = None,
    gpu_model: str | None = None,
) -> list[Gate]:
    """The gates of a search, in order: placement (where data-parallel workers' kind is
    known), the memory budget (with an estimator and a budget), what ran out of memory."""
    gates: list[Gate] = []
    if data_parallel_gpus is not None:
        gates.append(Placement(data_parallel_gpus, gpu_model))
    if estimator is not None and budget_bytes is not None:
        gates.append(MemoryFits(estimator, budget_bytes, probe_margin))
    gates.append(LearnedOutOfMemory())
    return gates


def gate_of(gates: Sequence[Gate], kind: type[Gate]) -> Gate | None:
    """The first of ``gates`` of ``kind``, or ``None``."""
    return next((g for g in gates if isinstance(g, kind)), None)


def for_settings(
    settings: TrialSettings,
    estimator: MemoryEstimator | None,
    probe_margin: float = 0.0,
    packed: bool = False,
) -> tuple[list[Gate], Devices]:
    """The gates and devices of a search whose trials run under ``settings`` (the budget, the
    data-parallel workers' kind, the GPU model and CUDA context a :func:`raybatch.trainable`
    carries): how ``raybatch search`` and :meth:`RaybatchSearcher.for_trainable` both build
    them. ``estimator``: the pre-screen's (``None``: none); ``packed``: trials share GPUs, each
    taking the share its calibrated estimate needs."""
    s = settings
    gates = search_gates(estimator, s.budget_bytes, probe_margin, s.data_parallel_gpus, s.gpu_model)
    packing = None
    if packed and estimator is not None and s.budget_bytes is not None:
        packing = (estimator, s.budget_bytes)
    devices = Devices(s.data_parallel_gpus, s.gpu_model, packing, s.cuda_context_bytes)
    return gates, devices


class Devices:
    """How trials take devices: a packed trial's share of a GPU, and room for data-parallel
    workers beside the trials running now.

    Args:
        data_parallel_gpus: Whether data-parallel workers take GPUs or CPUs; ``None``: their
            room is not checked.
        gpu_model: The GPU model trials are pinned to (their room counts its GPUs only).
        packing: ``(estimator, budget_bytes)`` where trials share GPUs (``gpus_per_trial
            ="auto"``): each launched trial's share comes from the calibrated estimate.
        context_bytes: One trial's CUDA context: every packed trial pays one.
    """

    def __init__(
        self,
        data_parallel_gpus: bool | None = None,
        gpu_model: str | None = None,
        packing: tuple[MemoryEstimator, int] | None = None,
        context_bytes: int = CUDA_CONTEXT_OVERHEAD_BYTES,
    ) -> None:
        self.data_parallel_gpus = data_parallel_gpus
        self.gpu_model = gpu_model
        self.packing = packing
        self.context_bytes = context_bytes
        self.held: dict[str, float] = {}  # Tune trial -> the devices it holds

    def share(self, recipe: TrialConfig) -> float | None:
        """A launched trial's share of a GPU where trials are packed, else ``None``."""
        if self.packing is None:
            return None
        estimator, budget = self.packing
        return gpu_fraction(estimator.predict(recipe), budget, context_bytes=self.context_bytes)

    def room_for(self, recipe: TrialConfig) -> bool:
        """Whether a data-parallel recipe's workers fit beside what the trials running now hold
        (data-parallel workers, and single trials' GPUs or CPUs). Tune would otherwise start its
        trial at once (the trial itself holds no GPU) to wait inside ``fit()`` for workers, on
        the hang guard's clock, and be censored as hung for being queued."""
        ray = running_ray()
        if recipe.world_size <= 1 or self.data_parallel_gpus is None or ray is None:
            return True
        room = worker_room(ray, self.data_parallel_gpus, self.gpu_model)
        return sum(self.held.values()) + recipe.world_size <= room

    def take(self, trial_id: str, recipe: TrialConfig, config: dict[str, Any]) -> None:
        """``trial_id`` runs now: every data-parallel worker, or a single trial's share."""
        held = recipe.world_size if recipe.world_size > 1 else config.get(keys.GPU_SHARE, 1.0)
        self.held[trial_id] = float(held)

    def take_whole(self, trial_id: str) -> None:
        """Trial ``trial_id`` runs again alone: it holds a whole GPU."""
        self.held[trial_id] = 1.0

    def free(self, trial_id: str) -> None:
        self.held.pop(trial_id, None)


__all__ = [
    "OOM_VIOLATION", "Devices", "Gate", "LearnedOutOfMemory", "MemoryFits", "Placement",
    "Rejection", "for_settings", "gate_of", "search_gates",
]  # fmt: skip
