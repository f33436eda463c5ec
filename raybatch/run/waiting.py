"""Recipes the searcher chose but has not launched yet, and why they wait.

Two kinds wait, each for devices, and both belong to the searcher's saved state:

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


class Waiting:
    """What waits to launch: at most one :class:`Held` recipe, and Optuna trials to run again
    alone (:meth:`retry_alone`, :meth:`next_alone`)."""

    def __init__(self) -> None:
        self.held: Held | None = None
        self._alone: list[int] = []  # Optuna trials to launch again, alone on a GPU
        self._retried: set[int] = set()

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
        """What the searcher's checkpoint keeps (the retries; a held recipe is asked again)."""
        return {"retry_alone": list(self._alone), "retried": set(self._retried)}

    def restore(self, state: dict[str, Any]) -> None:
        self._alone = list(state["retry_alone"])
        self._retried = set(state["retried"])
        self.held = None


__all__ = ["Held", "Waiting"]
