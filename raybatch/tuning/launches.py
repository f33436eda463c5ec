"""Each launch, from the recipe that passed the screen to its end told in the study.

The searcher's bookkeeping between its two records, kept in its Tune checkpoint so that a
resumed search and its study agree:

- **launched trials**: every Tune trial is one Optuna trial, its number kept here; a trial is
  told once (Tune may report an end twice, and a restored trial asks for its config again);
- **a data-parallel recipe held** until its workers fit beside the trials running now
  (:class:`Held`). Tune would otherwise start its trial at once, and the trial would wait
  inside ``fit()`` for workers, on the hang guard's clock. A held recipe is not kept across a
  resume: the searcher asks again, the cluster having changed since;
- **a packed trial that ran out of memory**, to run once more alone on a whole GPU before its
  recipe is taught infeasible: a packed trial's OOM may be its neighbours' doing. Once only:
  a second OOM, alone, is the recipe's;
- **the fastest time to target told so far**: each trial launched once one is known evaluates
  at the rungs it ties (:data:`~raybatch.keys.RUNG_MARKS`): ``B`` itself, and the grid rungs
  below it where they lie under the cap's lowest time mark
  (:func:`~raybatch.tuning.rungs.grid_rungs`, anchored as ``CappingScheduler.for_time_cap``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raybatch import keys
from raybatch.space.config import TrialConfig
from raybatch.status import PAR_FACTOR, TrialStatus, is_packed
from raybatch.tuning.gates import OOM_VIOLATION, Devices
from raybatch.tuning.plan import Plan
from raybatch.tuning.rungs import DEFAULT_ETA, grid_rungs
from raybatch.tuning.screen import Passed, Screen
from raybatch.tuning.study import SearchStudy

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True)
class Held:
    """A data-parallel suggestion waiting for room: its Optuna trial, Tune config and recipe."""

    number: int
    config: dict[str, Any]
    recipe: TrialConfig


class Launches:
    """Launches what passed ``screen`` on ``devices`` (or holds it until its workers fit), and
    tells each end once.

    Tune trial -> Optuna trial (:attr:`numbers`), which are told, the :class:`Held` recipe, and
    the packed trials out of memory to run again alone (:meth:`end`).

    Args:
        record: The study each launch and end is written to (the searcher's).
        plan: Told of each end (the opening's points) and asked whether a launch measures the
            time model.
        screen: Refuses a held recipe the cluster no longer places; its penalty ties the rungs.
        devices: What the running trials hold.
    """

    def __init__(self, record: SearchStudy, plan: Plan, screen: Screen, devices: Devices) -> None:
        self.record = record
        self.plan = plan
        self.screen = screen
        self.devices = devices
        self.numbers: dict[str, int] = {}  # Tune trial -> Optuna trial
        self.held: Held | None = None
        self._told: set[str] = set()
        self._alone: list[int] = []  # Optuna trials to launch again, alone on a GPU
        self._retried: set[int] = set()
        self.fastest_s: float | None = None  # the fastest time to target told so far

    def again(self, trial_id: str) -> dict[str, Any] | None:
        """The config of a trial launched before (a restored one asks again), or of the next
        packed trial that ran out of memory, to run again alone on a whole GPU; else ``None``."""
        if trial_id in self.numbers:
            return self.record.config_of(self.numbers[trial_id])
        if not self._alone:
            return None
        number = self._alone.pop(0)
        self.record.relaunched(number, trial_id)
        self.numbers[trial_id] = number
        self.devices.take_whole(trial_id)
        return {**self.record.config_of(number), keys.ALONE: True, keys.GPU_SHARE: 1.0}

    def release(self, trial_id: str) -> tuple[bool, dict[str, Any] | None]:
        """The held data-parallel recipe: ``(True, None)`` while its workers do not fit beside
        the running trials, its config once they do, ``(False, None)`` when it is gone (told
        while the searcher waited, or refused: the cluster shrank) and a new one is asked."""
        waiting = self.held
        assert waiting is not None
        held = self.record.live(waiting.number)
        if held is not None and not self.devices.room_for(waiting.recipe):
            rejection = None if self.devices.held else self.screen.placement(waiting.recipe)
            if rejection is None:
                return True, None
            # Nothing runs and it still cannot be placed: the cluster shrank since.
            self.screen.refuse(held, waiting.config, rejection)
            held = None
        self.held = None
        if held is None:
            return False, None
        return False, self.launch(held, waiting.config, waiting.recipe, trial_id)

    def start(self, passed: Passed, trial_id: str) -> dict[str, Any] | None:
        """Launch what passed the screen, with its share of a GPU where trials are packed; or
        hold it (``None``) while its data-parallel workers do not fit."""
        share = self.devices.share(passed.recipe)
        config = passed.config if share is None else {**passed.config, keys.GPU_SHARE: share}
        if not self.devices.room_for(passed.recipe):
            self.held = Held(passed.trial.number, config, passed.recipe)
            return None
        return self.launch(passed.trial, config, passed.recipe, trial_id)

    def launch(
        self, ot_trial: optuna.Trial, config: dict[str, Any], recipe: TrialConfig, trial_id: str
    ) -> dict[str, Any]:
        self.record.launched(ot_trial, config, trial_id)  # constraint told at completion
        self.numbers[trial_id] = ot_trial.number
        # Measured alone on its device: a packed trial's step times are its neighbours' too.
        if self.plan.wants_time_model(recipe) and not is_packed(config.get(keys.GPU_SHARE)):
            config = {**config, keys.MEASURE_TIME_MODEL: True}  # for Tune only, not the study
        if self.fastest_s is not None:  # judged at the rungs, not at the first mark past one
            config = {**config, keys.RUNG_MARKS: self.rung_marks(self.fastest_s)}
        self.devices.take(trial_id, recipe, config)
        return config

    def rung_marks(self, fastest_s: float) -> list[float]:
        """The rungs a trial launched now is judged at, once a trial reached in ``fastest_s``:
        on the grid of the trainable's time cap (its penalty's tenth), as the scheduler's."""
        cap = self.screen.penalty / PAR_FACTOR
        return grid_rungs(fastest_s, cap / DEFAULT_ETA)

    def to_tell(self, trial_id: str) -> int | None:
        """The Optuna trial Tune trial ``trial_id`` ran, while it is not told yet; ``None``
        when it ran none of the searcher's, or was told already."""
        number = self.numbers.get(trial_id)
        return None if number is None or trial_id in self._told else number

    def end(
        self, trial_id: str, number: int, status: TrialStatus, value: float, result: dict[str, Any]
    ) -> bool:
        """Tell the study how Tune trial ``trial_id`` (Optuna trial ``number``) ended, and the
        plan whether an opening point reached; whether it ran out of memory as its recipe's
        verdict (the gates learn it).

        ``False`` for a packed trial out of memory (a neighbour's doing, perhaps): it is queued
        to run once more alone on a whole GPU instead, and told then. The caller marks the
        trial :meth:`told` once everything has learned from it, so an end whose telling failed
        half-way is told again when Tune reports it again.
        """
        oom = status is TrialStatus.INFEASIBLE_MEMORY
        if oom and is_packed(result.get(keys.GPU_SHARE)) and number not in self._retried:
            self._alone.append(number)
            self._retried.add(number)
            return False
        time_to_target = result.get(keys.TIME_TO_TARGET_S)
        violation = OOM_VIOLATION if oom else 0.0
        told = self.record.finish(number, status, value, violation, time_to_target,
                                  result.get(keys.REASON))  # fmt: skip
        reached = time_to_target if status is TrialStatus.REACHED else None
        self.plan.told(number, reached, oom)
        if reached is not None and not is_packed(result.get(keys.GPU_SHARE)):
            self.fastest_s = min(float(reached), self.fastest_s or float(reached))
        if told is not None:  # None: told before an interruption Tune's saved state predates
            self.numbers[trial_id] = told
        return oom

    def told(self, trial_id: str) -> None:
        """``trial_id``'s end is told (:meth:`to_tell` answers ``None`` from now on)."""
        self._told.add(trial_id)


__all__ = ["Held", "Launches"]
