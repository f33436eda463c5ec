"""Trials Ray Tune ended without telling the searcher: told, so no search waits on them.

Tune reuses a trial's process for the next trial (:data:`raybatch.tuning.warm.REUSE_ACTORS`).
When the process cannot be reset -- the last trial's thread still running after
``TUNE_FUNCTION_THREAD_TIMEOUT_S`` (a trial hung inside a step, stopped by the scheduler) --
Ray Tune 2.60 marks the *next* trial ERROR and calls neither the search algorithm nor the
scheduler (``TuneController._on_trial_reset``). And a trial whose last result came while it
was saving a checkpoint can be set TERMINATED by ``_schedule_trial_stop`` before the cached
STOP reaches ``stop_trial``, which then returns early, the searcher untold (seen in a resumed
search: its last trial ended at its cap with a save, and the race never started). A searcher
that waits for such a trial would wait for ever: the race waits for its running run before
suggesting the next, the race for every search trial, the plan for its opening before
queueing the ladder. At the start and the end of every step of Tune's loop this callback
tells the searcher of each trial in ERROR, and of each TERMINATED one that reported and that it
still waits for (with Tune's last result of it); a searcher ignores a trial it was already
told of.
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback
from ray.tune.utils import flatten_dict

from raybatch import keys


class TellUntold(Callback):
    """A Tune callback: each trial in ERROR is told to ``searcher`` as an error (idempotent),
    each TERMINATED one it still waits for (``searcher.waits_for``) with its last result.

    Args:
        searcher: The search algorithm's searcher (its ``on_trial_complete`` ignores a trial
            it already knows ended).
    """

    def __init__(self, searcher: Any) -> None:
        self.searcher = searcher

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks with the experiment: not a second copy of the searcher
        # (Tune keeps the searcher's own state); a resumed search attaches the restored one.
        return {"searcher": None}

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        # Before Tune asks for trials: with none running and the searcher waiting, Tune would
        # block in that step, asking again each second for up to 600 s (a resumed search whose
        # saved state holds such a trial starts there).
        self.on_step_end(iteration, trials, **info)

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if self.searcher is None:
            return
        waits_for = getattr(self.searcher, "waits_for", None)
        for trial in trials:
            if trial.status == "ERROR":
                self.searcher.on_trial_complete(trial.trial_id, error=True)
            elif trial.status == "TERMINATED" and waits_for is not None:
                last = getattr(trial, "last_result", None) or {}
                # One that ran and reported: a trial Tune ended before it started (an experiment
                # stopped early) is the driver's to close as never run.
                if keys.STATUS in last and waits_for(trial.trial_id):
                    # Flattened, as Tune hands a result to a searcher.
                    self.searcher.on_trial_complete(trial.trial_id, result=flatten_dict(last))


__all__ = ["TellUntold"]
