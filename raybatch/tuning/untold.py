"""Trials Ray Tune ended in ERROR without telling the searcher: told, so no search waits on them.

Tune reuses a trial's process for the next trial (:data:`raybatch.tuning.warm.REUSE_ACTORS`).
When the process cannot be reset -- the last trial's thread still running after
``TUNE_FUNCTION_THREAD_TIMEOUT_S`` (a trial hung inside a step, stopped by the scheduler) --
Ray Tune 2.60 marks the *next* trial ERROR and calls neither the search algorithm nor the
scheduler (``TuneController._on_trial_reset``). A searcher that waits for that trial would then
wait for ever: the race waits for its running run before suggesting the next, and the plan for
its opening before queueing the ladder. At the end of every step of Tune's loop this callback
tells the searcher of each trial in ERROR; a searcher ignores a trial it was already told of
(Tune itself tells it of every other error, after the retries), and a trial being retried is
PENDING again by then, never seen in ERROR.
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback


class TellUntold(Callback):
    """A Tune callback: each trial in ERROR is told to ``searcher`` as an error (idempotent).

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

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if self.searcher is None:
            return
        for trial in trials:
            if trial.status == "ERROR":
                self.searcher.on_trial_complete(trial.trial_id, error=True)


__all__ = ["TellUntold"]
