"""Which Tune trial runs which Optuna trial, and the recipes chosen but not launched yet.

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
  a second OOM, alone, is the recipe's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raybatch.space.config import TrialConfig


@dataclass(frozen=True)
class Held:
    """A data-parallel suggestion waiting for room: its Optuna trial, Tune config and recipe."""

    number: int
    config: dict[str, Any]
    recipe: TrialConfig


class Launches:
    """Tune trial -> Optuna trial, which are told, the :class:`Held` recipe, and the Optuna
    trials to run again alone (:meth:`retry_alone`, :meth:`next_alone`)."""

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}  # Tune trial -> Optuna trial
        self.held: Held | None = None
        self._told: set[str] = set()
        self._alone: list[int] = []  # Optuna trials to launch again, alone on a GPU
        self._retried: set[int] = set()

    def launched(self, trial_id: str, number: int) -> None:
        self.numbers[trial_id] = number

    def to_tell(self, trial_id: str) -> int | None:
        """The Optuna trial Tune trial ``trial_id`` ran, while it is not told yet; ``None``
        when it ran none of the searcher's, or was told already (:meth:`told`)."""
        number = self.numbers.get(trial_id)
        return None if number is None or trial_id in self._told else number

    def told(self, trial_id: str) -> None:
        """``trial_id``'s end is told (marked once the study has it, so an end whose telling
        failed half-way is told again when Tune reports it again)."""
        self._told.add(trial_id)

    def retry_alone(self, number: int) -> bool:
        """Queue Optuna trial ``number`` to run again alone, unless it already has; whether it
        was queued (``False``: its second OOM, the recipe's verdict)."""
        if number in self._retried:
            return False
        self._alone.append(number)
        self._retried.add(number)
        return True

    def next_alone(self) -> int | None:
        """The next trial to run again alone, taken off the queue, or ``None``."""
        return self._alone.pop(0) if self._alone else None

    def state(self) -> dict[str, Any]:
        """What the searcher's checkpoint keeps (all but a held recipe, which is asked again)."""
        return {
            "trial_numbers": dict(self.numbers),
            "completed": set(self._told),
            "retry_alone": list(self._alone),
            "retried": set(self._retried),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.numbers = dict(state["trial_numbers"])
        self._told = set(state["completed"])
        self._alone = list(state["retry_alone"])
        self._retried = set(state["retried"])
        self.held = None


__all__ = ["Held", "Launches"]
