"""The pre-screen loop: ask Optuna for recipes until one passes every gate.

The one place a suggestion is turned from Optuna's knobs into a recipe (derived once, by the
space's define-by-run) and put through the gates (:mod:`raybatch.tuning.gates`). A recipe a gate
refuses is never launched: it is told to Optuna at once, with the penalty and the gate's
constraint (infeasible where the refusal is about memory, so that TPE steers away), and kept
as a typed row for ``trials.csv``. When :data:`MAX_PRESCREEN_ATTEMPTS` suggestions in a row
are refused, the screen gives up and says why, in the study, so that a restored searcher does
not ask again. The screen also teaches its gates how each launched trial ended; what they
learned is pickled with the searcher in its checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raybatch.keys import ACCUMULATION_STEPS, LR_MULTIPLIER, MICRO_BATCH_SIZE, WORLD_SIZE
from raybatch.space.config import TrialConfig
from raybatch.space.search_space import SearchSpace
from raybatch.space.tune_space import OptunaDefineByRun
from raybatch.tuning.gates import Gate, Placement, Rejection, gate_of
from raybatch.tuning.plan import Plan
from raybatch.tuning.study import Prescreened, SearchStudy

if TYPE_CHECKING:
    import optuna

MAX_PRESCREEN_ATTEMPTS = 200
"""Suggestions in a row the pre-screen may reject before the searcher gives up (the space's
smallest recipes do not fit either) and ends the search."""


@dataclass(frozen=True)
class Passed:
    """A suggestion every gate let through: its Optuna trial, Tune config and recipe."""

    trial: optuna.Trial
    config: dict[str, Any]
    recipe: TrialConfig


class Screen:
    """Asks ``record`` for suggestions, derives each recipe, and puts it through ``gates``.

    Args:
        space: Derives each suggestion's recipe from its knobs.
        record: The study suggestions are asked from and refusals told to.
        plan: Told of every opening point asked and of every refusal (the opening steps down
            to a smaller micro batch after a refusal for memory).
        gates: Asked in order; the first :class:`Rejection` refuses the recipe.
        penalty: The objective a refused recipe is told.
    """

    def __init__(
        self,
        space: SearchSpace,
        record: SearchStudy,
        plan: Plan,
        gates: Sequence[Gate],
        penalty: float,
    ) -> None:
        self.space = space
        self.record = record
        self.plan = plan
        self.gates = gates  # the searcher's own list: it teaches them what trials show
        self.penalty = penalty
        self.refused: list[Prescreened] = []  # this process's refusals, typed as rows
        self._define = OptunaDefineByRun(space, record=False)  # the launch stores the config

    def next(self) -> Passed | None:
        """The next suggestion that passes every gate; ``None`` when it gave up (the reason is
        in the study's :meth:`~raybatch.tuning.study.SearchStudy.gave_up_reason`). The plan's points
        are queued in the study first: they are asked before TPE's."""
        self.plan.queue_opening()
        self.plan.queue_ladder()
        self.plan.say_tpe()
        for _ in range(MAX_PRESCREEN_ATTEMPTS):
            ot_trial = self.record.ask()
            knobs, _ = self._define.knobs(ot_trial)
            self.plan.asked(ot_trial)  # its params exist once its knobs are read
            refusal = self.space.refusal(
                knobs[MICRO_BATCH_SIZE], knobs[ACCUMULATION_STEPS], knobs[WORLD_SIZE],
                knobs[LR_MULTIPLIER])  # fmt: skip
            if refusal is not None:  # a combination the space's limits refuse: never run
                self.refuse(ot_trial, dict(ot_trial.params), Rejection(refusal, memory=False))
                continue
            recipe = self.space.derive(**knobs)  # derived once, here, where knobs are chosen
            config = {**ot_trial.params, **recipe.to_dict()}  # what Tune and the study carry
            rejection = self.check(recipe)
            if rejection is None:
                return Passed(ot_trial, config, recipe)
            self.refuse(ot_trial, config, rejection)
        last = self.refused[-1].reason if self.refused else "?"
        self.record.gave_up(
            f"{MAX_PRESCREEN_ATTEMPTS} suggestions in a row were rejected before launch (the last:"
            f" {last}); the space's smallest recipes may already be too large for this cluster"
        )
        return None

    def check(self, recipe: TrialConfig) -> Rejection | None:
        """The first gate's objection to ``recipe``, or ``None``."""
        return next(filter(None, (g.check(recipe) for g in self.gates)), None)

    def placement(self, recipe: TrialConfig) -> Rejection | None:
        """The :class:`Placement` gate's objection to ``recipe`` (``None`` without one)."""
        gate = gate_of(self.gates, Placement)
        return None if gate is None else gate.check(recipe)

    def learn(
        self, trial_id: str, recipe: TrialConfig, result: dict[str, Any], out_of_memory: bool
    ) -> None:
        """Teach every gate how a launched trial ended (:meth:`Gate.learn`)."""
        for gate in self.gates:
            gate.learn(trial_id, recipe, result, out_of_memory)

    def refuse(self, ot_trial: optuna.Trial, config: dict[str, Any], why: Rejection) -> None:
        """Tell Optuna ``ot_trial`` is not launched, and why."""
        self.record.reject(
            ot_trial, why.violation, self.penalty, why.reason, why.predicted_bytes, config
        )
        self.plan.told(ot_trial.number, None, memory=why.memory)
        self.refused.append(
            Prescreened.of(ot_trial.number, config, why.reason, why.predicted_bytes)
        )


__all__ = ["MAX_PRESCREEN_ATTEMPTS", "Passed", "Screen"]
