"""Paused trials, and which goes on next: successive halving that can take a verdict back.

A trial that falls behind at a rung below the top is paused, not stopped (Tune's ``PAUSE``: its
state is saved with its last report, :mod:`raybatch.trial.pause`, and its slot goes to the next
trial). What a stop loses for good, a pause keeps for nothing until it is needed:

- **Promotion** (as ASHA promotes): a paused trial goes on, before any new trial, as soon as
  its rung passes it with the curves seen since (more trials got there behind it).
- **Before any trial has reached the target** the rungs are tied to a guess: when the searcher
  has no new trial to run, the paused trial that got furthest goes on toward the target.
- **The hedge** (a wider zone early on) takes back, once no new trial waits, only a pause at
  a rung tied to the guess (before a reach, below its top two: from there a trial goes on as
  the leader only) or in the trial's LR warmup. A pause once ``B`` is measured is ASHA's: a
  search's trials are counted, so after its last no new trial ever waits, and the hedge there
  sent every trial within 1.45x at ``B/3`` on to ``B`` (``docs/search.md``).
- **Once the search has nothing left to run**, a paused trial no rung passes is stopped: it
  ends as a trial capped at the rung it was paused at.

A promoted trial is not judged again at or below the rung it was promoted from (it may resume
from a save a little before it, :data:`~raybatch.trial.pause.SAVE_RATIO`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from copy import copy as shallow_copy
from typing import Any

from raybatch.tuning.rungs import TOLERANCE


class Promotions:
    """The paused trials of a search and the trials promoted from a pause."""

    def __init__(self) -> None:
        self.paused: dict[str, float] = {}
        """Tune trial -> the rung (training seconds) it fell behind at and was paused."""
        self.promoted: dict[str, float] = {}
        """Tune trial -> the rung it was last promoted from."""
        self.leading: set[str] = set()
        """Trials that went on as the leader of the highest rung, before any trial reached,
        with nothing new to run: they do not wait at a rung for others to get there."""
        self.guessed: set[str] = set()
        """Paused trials that fell behind at a rung tied to the guess of ``B``: the hedge may
        promote them."""
        self.yielded: set[str] = set()
        """Trials paused once past the guess of ``B`` before any trial reached, for the new
        trials the searcher has by then (:meth:`yields`)."""

    def pause(self, trial_id: str, rung_s: float, guessed: bool = False) -> None:
        """Paused at the rung at ``rung_s``, one tied to the guess of ``B`` where ``guessed``."""
        self.paused[trial_id] = float(rung_s)
        if guessed:
            self.guessed.add(trial_id)
        else:
            self.guessed.discard(trial_id)

    def resumed(self, trial_id: str) -> None:
        """A paused trial runs again (promoted here, or restored by Tune after a restart)."""
        if trial_id in self.paused:
            self.promoted[trial_id] = self.paused.pop(trial_id)

    def ended(self, trial_id: str) -> None:
        """The trial ended or failed. What it was promoted from and whether it yielded stay: a
        retry goes on from its last save, and a stopped trial's reason reads them."""
        self.paused.pop(trial_id, None)
        self.leading.discard(trial_id)
        self.guessed.discard(trial_id)

    def yields(self, trial_id: str, trained_s: float, guess_s: float) -> bool:
        """Whether a trial ahead at every rung, with none reached yet, pauses now to free its
        slot: once, at its first evaluation past the guess of ``B``, the top of the rungs
        before a reach. From there to its time cap is the dearest stretch of a search, taken
        last, as successive halving takes its top rung: the new trials go first, and a reach
        among them judges it at that rung like any pause (a trial that ran on took its slot to
        the cap: on the digits CNN, two or three a real search, 2.5-3.5 trainings of its best).
        With nothing new to run it goes on as the leader."""
        # Once only; not either where it went on from a pause at or past the guess: it gave its
        # slot there once already.
        if trial_id in self.yielded or trained_s < guess_s or (
                self.exempt_up_to(trial_id) >= guess_s * (1.0 - TOLERANCE)):  # fmt: skip
            return False
        self.yielded.add(trial_id)
        return True

    def leads(self, trial_id: str) -> bool:
        """Whether the trial went on as the leader (:attr:`leading`)."""
        return trial_id in self.leading

    def exempt_up_to(self, trial_id: str) -> float:
        """The training time up to which no rung judges the trial again (-1: none)."""
        return self.promoted.get(trial_id, -1.0)

    def choose(self, promotable: Callable[[str], bool], hedged: Callable[[str], bool],
               level: Callable[[str], float], pending: bool, running: int, reached: bool,
               slots: int | None = None) -> tuple[str | None, bool]:  # fmt: skip
        """What runs next: ``(paused trial to resume, whether the paused left should stop)``.

        Args:
            promotable: Whether the rung a paused trial was paused at passes it now (level with
                the best curve there, or in the top 1/eta): it goes before any new trial.
            hedged: Whether it passes within the indifference zone: it goes on once no new
                trial waits (the search has first seen every trial's start). The scheduler
                hedges only a pause at a rung tied to the guess (:attr:`guessed`), or one in
                the trial's LR warmup.
            level: A paused trial's best level at its pause (the higher the better).
            pending: Whether a new trial waits to run (the searcher suggested one).
            running: Trials running now.
            reached: Whether any trial has reached the target.
            slots: Trials the search runs at once (``None``: unknown); a trial goes on from
                its pause without a promotion only on a free slot no new trial will take (a
                new trial that starts at once leaves none waiting).
        """
        ready = [t for t in self.paused if promotable(t)]
        if ready:
            return self._furthest(ready, level), False
        free = running == 0 if slots is None else running < slots
        if pending or not self.paused or not free:
            return None, False
        ready = [t for t in self.paused if hedged(t)]
        if ready:
            return self._furthest(ready, level), False
        if not reached:  # nothing new to run: the leader of the highest rung goes on
            leader = self._furthest(self.paused, level)
            self.leading.add(leader)
            return leader, False
        return None, running == 0  # nothing will pass them any more

    def _furthest(self, trials: Iterable[str], level: Callable[[str], float]) -> str:
        return max(trials, key=lambda t: (self.paused[t], level(t)))


def tell_searcher(tune_controller: Any, hook: str, trial_id: str) -> None:
    """Ray's searcher hooks for a paused trial (``on_pause``, ``on_unpause``: how
    ``HyperBandForBOHB`` tells its searcher), on the searcher and every one it wraps."""
    searcher = getattr(getattr(tune_controller, "search_alg", None), "searcher", None)
    while searcher is not None:
        getattr(searcher, hook, lambda _trial_id: None)(trial_id)
        searcher = getattr(searcher, "searcher", None)


def follow_storage(trial: Any, experiment: tuple[str, str] | None) -> None:
    """Point a trial Tune has just added at the run's own experiment folder, ``experiment``
    (the storage path and the experiment's name; ``None``: left as Tune made it).

    Restored from a copied or moved run directory, Tune re-points the trials it restores, but
    builds each new one from the experiment its search algorithm saved, with the storage of the
    directory the run was copied from: the trial's checkpoints (its saved state,
    :mod:`raybatch.trial.pause`) would be written there. Re-pointed as Tune re-points a
    restored trial (``Trial.set_storage``), they stay in the run's own directory.
    """
    mine = getattr(trial, "storage", None)
    if experiment is None or mine is None:
        return
    path, name = experiment
    if (mine.storage_fs_path, mine.experiment_dir_name) == (path, name):
        return
    moved = shallow_copy(mine)
    moved.storage_fs_path, moved.experiment_dir_name = path, name
    trial.set_storage(moved)


__all__ = ["Promotions", "follow_storage", "tell_searcher"]
