"""Adaptive capping: stop a trial that can no longer beat the best time to target.

The analogue of adaptive capping in algorithm configuration (ParamILS, Hutter et al. 2009;
SMAC; irace reports 20-45% of the effort saved): once some trial has reached the target in
``T*`` seconds of training, any running trial whose training time (``train_s``, the clock of
the objective: evaluations excluded) passes ``slack x T*`` cannot win, so it is stopped. The
default slack of 1.2 leaves room for timing noise, as SMAC's does. A capped trial is censored
data at its cap; the searcher records it as ``capped`` with the PAR-10 penalty.

It also guards against **hung** trials (:class:`~raybatch.run.hang.HangGuard`): one silent
for longer than ``hang_after_s`` is stuck inside a step and will never report again, so no
result-driven rule can stop it; Ray Tune asks the scheduler which trial to run at every step of
its loop, and there the guard stops it, as ``censored`` with the reason.

**Capping at every level** (the search's cheaper fidelity). Every trial reports the metric at
the same sample marks, so the incumbent's trajectory says how soon each intermediate level of
the metric can be reached. A running trial that, ``level_slack x t`` seconds into training, has
not yet reached the level the incumbent had reached at ``t`` is behind at that level too: the
final cap above is this rule's last level. Trajectories are noisy and a recipe with a long
warmup starts slowly, so the intermediate levels get a wider slack (1.5 by default) than the
final one, and before a third of the incumbent's time only a trial three times behind is
stopped (start-up and warmup make the first marks noise); ``bench/search_efficiency.py``
measures the regret with and without it, same seeds.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from raybatch import keys
from raybatch.errors import Issue, OptionError
from raybatch.results.selection import is_packed
from raybatch.run.hang import HangGuard
from raybatch.status import HANG_GRACE_S, TrialStatus
from raybatch.trial.settings import parts_of

DEFAULT_SLACK = 1.2
DEFAULT_LEVEL_SLACK = 1.5
LEVEL_FROM = 1 / 3
"""Intermediate levels are judged at ``level_slack`` only once a trial has trained this
fraction of the incumbent's time to target, before it at :data:`EARLY_LEVEL_SLACK` (see
:func:`behind`)."""
EARLY_LEVEL_SLACK = 3.0


class Trajectory:
    """A trial's best metric so far against its training time, in the target's direction.

    Values are stored as "progress" (the metric, negated for a ``min`` target), so higher is
    always better and the best-so-far curve is monotone, which makes the incumbent's level at a
    time a binary search.

    Args:
        mode: The target's direction (``max``: accuracy; ``min``: loss).
    """

    def __init__(self, mode: str = "max") -> None:
        self.sign = 1.0 if mode == "max" else -1.0
        self.times: list[float] = []
        self.best: list[float] = []
        self.reached_s: float | None = None  # the time to target, once reached

    def add(self, train_s: float, metric: float) -> None:
        """One report: the metric at ``train_s`` seconds of training (marks come in order)."""
        value = self.sign * float(metric)
        if value != value:  # NaN: no progress
            return
        if self.times and train_s < self.times[-1]:  # a retried trial starts its clock again
            self.times, self.best = [], []
        if self.best and value < self.best[-1]:
            value = self.best[-1]
        self.times.append(float(train_s))
        self.best.append(value)

    @property
    def progress(self) -> float | None:
        """The best level reached so far."""
        return self.best[-1] if self.best else None

    def level_at(self, train_s: float) -> float | None:
        """The best level reached within ``train_s`` seconds of training (``None``: no mark yet)."""
        i = bisect.bisect_right(self.times, train_s)
        return self.best[i - 1] if i else None


def behind(incumbent: Trajectory, trial: Trajectory, train_s: float, level_slack: float) -> bool:
    """Whether ``trial``, at ``train_s``, is slower than ``level_slack`` x the incumbent to some
    level: the incumbent reached a level by ``train_s / level_slack`` that ``trial`` has not.

    Before :data:`LEVEL_FROM` of the incumbent's time to target only a trial grossly behind
    (:data:`EARLY_LEVEL_SLACK`) is stopped: the first marks are dominated by start-up
    (first-step allocation, kernel selection, a neighbour's burst) and by warmup, whose first
    steps have the same small LR at every multiplier, so recipes that part ways later look
    alike there, and a hiccup of a tenth of a second would read as "behind"; a diverging or
    stalled recipe is still stopped early.

    ``incumbent`` need not have reached the target yet: a trial running beside ``trial`` is
    judged up to its latest mark (the trials of a search's opening start together, with no
    incumbent to cap against).
    """
    end = incumbent.reached_s or (incumbent.times[-1] if incumbent.times else None)
    if end is None:
        return False
    if train_s < LEVEL_FROM * end:
        level_slack = max(level_slack, EARLY_LEVEL_SLACK)
    level = incumbent.level_at(train_s / level_slack)
    reached = trial.progress
    return level is not None and (reached is None or reached < level)


def behind_any(incumbent: Trajectory | None, others: Iterable[Trajectory], trajectory: Trajectory,
               trained: float, level_slack: float) -> bool:  # fmt: skip
    """Behind the ``incumbent`` at some level; before any trial has reached the target, behind
    another trial running beside it (``others``: the trials started together are compared with
    each other at equal training time: no trial runs uncapped for want of an incumbent)."""
    if incumbent is not None:
        return behind(incumbent, trajectory, trained, level_slack)
    # A neighbour's time to target is unknown (it may still diverge), and the first marks are
    # start-up and warmup: only a trial grossly behind it is stopped.
    slack = max(level_slack, EARLY_LEVEL_SLACK)
    return any(behind(other, trajectory, trained, slack) for other in others)


class CappingScheduler(FIFOScheduler):
    """A FIFO scheduler that stops trials slower than ``slack`` x the incumbent's time.

    Args:
        slack: Multiple of the best time to target past which a trial is stopped.
        enabled: ``False`` keeps the bookkeeping but never stops (for comparisons).
        hang_after_s: Wall seconds without a report (or, before the first, since the trial
            started) after which a running trial counts as hung and is stopped (``None``:
            never). Set it well past the trial's own time cap plus its start-up (model build,
            probe, data loading), which the trial clock excludes.
        level_slack: Multiple of the incumbent's time to each intermediate level of the
            metric past which a trial that has not reached that level is stopped (``None``:
            only the final level, the target, is capped).
        mode: The target's direction (``max`` or ``min``), to read the reported metric.
    """

    def __init__(
        self,
        slack: float = DEFAULT_SLACK,
        enabled: bool = True,
        hang_after_s: float | None = None,
        level_slack: float | None = DEFAULT_LEVEL_SLACK,
        mode: str = "max",
    ) -> None:
        issues = [Issue(name, f"must be >= 1, got {value}")
                  for name, value in (("slack", slack), ("level_slack", level_slack))
                  if value is not None and value < 1.0]  # fmt: skip
        if issues:
            raise OptionError(issues)
        super().__init__()
        self.slack = slack
        self.enabled = enabled
        self.guard = HangGuard(hang_after_s) if hang_after_s is not None else None
        self.level_slack = level_slack
        self.mode = mode
        self.best_time_to_target_s: float | None = None
        self.capped: dict[str, float] = {}
        self.capped_at_level: dict[str, float] = {}
        self._trajectories: dict[str, Trajectory] = {}
        self._incumbent: Trajectory | None = None

    @classmethod
    def for_trainable(
        cls, trainable: Callable[..., Any], hang_grace_s: float = HANG_GRACE_S, **kwargs: Any
    ) -> CappingScheduler:
        """The scheduler for a :func:`raybatch.trainable`: its target's direction, and a trial
        silent for the trainable's ``max_time_s`` plus ``hang_grace_s`` counts as hung.
        ``kwargs`` are this class's other arguments (``slack``, ...)."""
        settings = parts_of(trainable).settings
        kwargs.setdefault("hang_after_s", settings.max_time_s + hang_grace_s)
        kwargs.setdefault("mode", settings.target.mode)
        return cls(**kwargs)

    def forget_incumbent(self) -> None:
        """Start afresh: no best time, no incumbent. The confirmation's race caps each round's
        challenger against that round's leader, on the same seed, never an earlier round's."""
        self.best_time_to_target_s = None
        self._incumbent = None
        self._trajectories.clear()

    @property
    def cap_s(self) -> float | None:
        """The training time past which a running trial is stopped (None before any success)."""
        if self.best_time_to_target_s is None:
            return None
        return self.slack * self.best_time_to_target_s

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        if self.guard is not None:
            self.guard.alive(trial.trial_id)
        if is_packed(result.get(keys.GPU_SHARE)):
            # Its clock runs at the pace its neighbours leave it: neither capped nor an
            # incumbent (only times measured alone are compared; its own time cap still holds).
            return TrialScheduler.CONTINUE
        trajectory = self._follow(trial.trial_id, result)
        if result.get(keys.STATUS) == TrialStatus.REACHED.value:
            self._record(result.get(keys.TIME_TO_TARGET_S), trajectory)
            return TrialScheduler.CONTINUE
        cap = self.cap_s
        trained = result.get(keys.TRAIN_S)
        running = result.get(keys.STATUS) == TrialStatus.RUNNING.value
        if not (self.enabled and running and trained is not None):
            return TrialScheduler.CONTINUE
        if cap is not None and trained > cap:
            self.capped[trial.trial_id] = float(trained)
            return TrialScheduler.STOP
        if result.get(keys.HEARTBEAT):
            # No new evaluation: not having *shown* a level is not being behind it (a small
            # batch's next mark may be far off); the levels are judged at evaluations.
            return TrialScheduler.CONTINUE
        others = (t for other, t in self._trajectories.items() if other != trial.trial_id)
        if self.level_slack is not None and behind_any(
            self._incumbent, others, trajectory, float(trained), self.level_slack
        ):
            self.capped[trial.trial_id] = float(trained)
            self.capped_at_level[trial.trial_id] = float(trained)
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE

    def _follow(self, trial_id: str, result: dict[str, Any]) -> Trajectory:
        """The trial's trajectory, with this result's mark added (if it carries one)."""
        trajectory = self._trajectories.setdefault(trial_id, Trajectory(self.mode))
        metric, trained = result.get(keys.METRIC), result.get(keys.TRAIN_S)
        if metric is not None and trained is not None:
            trajectory.add(float(trained), float(metric))
        return trajectory

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        """Ray Tune's per-step hook: stop hung trials, then choose as FIFO does."""
        if self.guard is not None:
            self.guard.stop_hung(tune_controller)
        return super().choose_trial_to_run(tune_controller)

    @property
    def hang_after_s(self) -> float | None:
        """Wall seconds of silence after which a running trial counts as hung (``None``)."""
        return self.guard.after_s if self.guard is not None else None

    @property
    def hung(self) -> dict[str, float]:
        """Tune trial -> the seconds it had been silent when the guard stopped it."""
        return self.guard.hung if self.guard is not None else {}

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        self._trajectories.pop(trial.trial_id, None)
        super().on_trial_error(tune_controller, trial)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        trajectory = self._trajectories.pop(trial.trial_id, None)
        if result and is_packed(result.get(keys.GPU_SHARE)):
            return
        if result and result.get(keys.STATUS) == TrialStatus.REACHED.value:
            self._record(result.get(keys.TIME_TO_TARGET_S), trajectory)

    def _record(self, time_to_target_s: float | None, trajectory: Trajectory | None) -> None:
        if time_to_target_s is None:
            return
        if self.best_time_to_target_s is None or time_to_target_s < self.best_time_to_target_s:
            self.best_time_to_target_s = float(time_to_target_s)
            if trajectory is not None:
                trajectory.reached_s = float(time_to_target_s)
            self._incumbent = trajectory

    def debug_string(self) -> str:
        cap = "none yet" if self.cap_s is None else f"{self.cap_s:.3f} s"
        return (
            f"CappingScheduler: cap {cap}, {len(self.capped)} trials capped"
            f" ({len(self.capped_at_level)} at an intermediate level), {len(self.hung)} hung"
        )
