"""Warm slots through a searcher's wait: a trial's process is kept until the next trial comes.

Tune reuses a finished trial's process for the next trial (``reuse_actors``), but it keeps an
idle process only while a trial is waiting for one, and at most one beyond that. When the
searcher has nothing to suggest for a while -- the race waits for the search's last trial
(its entrants are chosen from all of them), the ladder waits for the time model -- every slot
that ends meanwhile but the first loses its process, and the next trial on it starts a cold one:
Python, torch, raybatch and the workload imported, the data built again. On the benchmark's MLPs
that was 3-5 s on a slot, more than a whole training of the recipe found.

:class:`WarmSlots` reserves a place in Tune's cache of idle processes for each trial that ends
while more trials may come, and gives the reservation back as soon as the next trial is added
(whatever its resources: a process of another shape is then let go as Tune would have, so it
never holds resources a new trial needs). The cache is Tune's own (``TuneController.
_actor_cache``, not a public API): where it is missing, nothing is reserved and Tune behaves as
it would without this.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

REUSE_ACTORS = True
"""Tune's ``reuse_actors`` for the search's and the race's trials. Ray Tune defaults to a new
actor per trial: a fresh process that imports torch, builds the workload's data and warms
torch up again, about 2 s a trial on a CPU (a CUDA context on a GPU), which in a search of
short trials was a third of every device second. A trial of the same resources reuses the
last one's process instead (Ray resets the function trainable), so the workload's cached data
and the warm process carry over; each trial still frees its GPU memory when it ends
(:func:`raybatch.memory.probe.release_memory`), and a trial whose CUDA context broke ends its
process (:func:`raybatch.trial.wrapper.run_trial`), so the next one starts clean."""


class WarmSlots:
    """Reservations in Tune's cache of idle trial processes (see the module's docstring)."""

    def __init__(self) -> None:
        self._reserved: list[Any] = []  # the placement group factories reserved, in order

    @staticmethod
    def _controller(tune_controller: Any) -> Any:
        """Tune's controller itself: schedulers are handed a wrapper that warns on the
        terminal at any attribute outside its list (the wrapped one is its own attribute)."""
        return getattr(tune_controller, "_tune_controller", tune_controller)

    @classmethod
    def _cache(cls, tune_controller: Any) -> Any | None:
        cache = getattr(cls._controller(tune_controller), "_actor_cache", None)
        ok = all(hasattr(cache, name) for name in ("increase_max", "decrease_max"))
        return cache if ok else None

    def keep(self, tune_controller: Any, trial: Any) -> None:
        """A trial ended: keep its process for the next trial while the search may go on."""
        cache = self._cache(tune_controller)
        search = getattr(self._controller(tune_controller), "_search_alg", None)
        key = getattr(trial, "placement_group_factory", None)
        if cache is None or key is None or search is None or search.is_finished():
            self.release(tune_controller)
            return
        cache.increase_max(key)
        self._reserved.append(key)

    def release(self, tune_controller: Any, count: int | None = None) -> None:
        """Give back ``count`` reservations, the oldest first (``None``: all): a trial was
        added (its staging reserves its own), or the search is over."""
        cache = self._cache(tune_controller)
        if cache is None:
            self._reserved.clear()
            return
        count = len(self._reserved) if count is None else min(count, len(self._reserved))
        for key in self._reserved[:count]:
            cache.decrease_max(key)
        del self._reserved[:count]

    @property
    def reserved(self) -> int:
        """Reservations held now: processes kept beyond what Tune itself would keep."""
        return len(self._reserved)

    def __getstate__(self) -> dict[str, Any]:
        return {"_reserved": []}  # a reservation lives in this Tuner's cache only


@contextlib.contextmanager
def pending_trials(pausing: bool, in_flight: int) -> Iterator[None]:
    """Where the scheduler pauses trials, Tune's ``max_concurrent_trials`` is off (it counts
    paused trials), and with it the pending trials it allows: one, for a searcher of its own,
    and a search of two slots ran one trial at a time. Tune's ``TUNE_MAX_PENDING_TRIALS_PG``
    gives back one per slot (the user's own setting stands)."""
    name = "TUNE_MAX_PENDING_TRIALS_PG"
    if not pausing or name in os.environ:
        yield
        return
    os.environ[name] = str(in_flight)
    try:
        yield
    finally:
        os.environ.pop(name, None)


__all__ = ["REUSE_ACTORS", "WarmSlots", "pending_trials"]
