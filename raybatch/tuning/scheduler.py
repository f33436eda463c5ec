"""Adaptive capping on equal-time rungs: stop a trial the moment it cannot win.

Every trial is judged at rungs of its own training time (``train_s``, evaluations excluded)
tied to the target (``B``, the fastest time to target seen, and about ``B/3`` and ``B/9`` on a
fixed grid: :func:`~raybatch.tuning.rungs.grid_rungs`), and goes on only while within the
indifference zone of the best curve there or (below ``B``) in the top 1/eta
(:mod:`raybatch.tuning.rungs`); one behind below the top rung is paused instead where ``pause``
(:mod:`raybatch.tuning.promotion`). Past ``slack x B`` a trial cannot win and is stopped (adaptive
capping, as in ParamILS and SMAC); the searcher records it PRUNED with the PAR-10 penalty. A
trial silent past ``hang_after_s`` is stuck inside a step: the hang guard
(:class:`~raybatch.tuning.hang.HangGuard`) stops it at Tune's next scheduling step.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from raybatch import keys
from raybatch.errors import Issue, OptionError
from raybatch.status import HANG_GRACE_S, TrialStatus, is_packed
from raybatch.trial.settings import parts_of
from raybatch.tuning.hang import HangGuard
from raybatch.tuning.judge import RungJudge
from raybatch.tuning.promotion import Promotions, follow_storage, tell_searcher
from raybatch.tuning.race_record import RaceCaps, race_seed
from raybatch.tuning.rungs import RungRule, guess_of_b
from raybatch.tuning.warm import WarmSlots

DEFAULT_SLACK = 1.2
log = logging.getLogger("raybatch.progress")


class CappingScheduler(FIFOScheduler):
    """A FIFO scheduler that stops a trial as soon as it cannot beat the best time to target.

    Every trial is judged at equal-time rungs and capped at ``slack`` x the incumbent's time.

    Args:
        slack: Multiple of the best time to target past which a trial is stopped.
        enabled: ``False`` keeps the bookkeeping but never stops (for comparisons).
        hang_after_s: Wall seconds without a report (or, before the first, since it started)
            after which a running trial is hung and stopped (``None``: never); well past the
            trial's time cap plus its start-up, which its clock excludes.
        rungs: The rungs' rule (:class:`~raybatch.tuning.rungs.RungRule`: the zone, eta, the
            hedge, the guess of ``B``, the target); ``RungRule(zone=None)``: no rungs.
        mode: The target's direction (``max`` or ``min``), to read the reported metric.
        pause: A trial behind at a rung below the top is paused, not stopped, and goes on
            when the rung passes it later (:mod:`~raybatch.tuning.promotion`); Tune's
            ``max_concurrent_trials`` counts paused trials: bound concurrency otherwise.

    Example::

        from ray import tune
        import raybatch
        from raybatch.examples.digits import workload

        fn = raybatch.trainable(workload, "digits_cnn_sgd", "accuracy>=0.9", max_time_s=60)
        scheduler = raybatch.CappingScheduler.for_trainable(fn, slack=1.5)  # fn's time cap
        searcher = raybatch.RaybatchSearcher.for_trainable(fn)
        config = tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=20)
        tune.Tuner(fn, tune_config=config).fit()
    """

    def __init__(
        self,
        slack: float = DEFAULT_SLACK,
        enabled: bool = True,
        hang_after_s: float | None = None,
        rungs: RungRule | None = None,
        mode: str = "max",
        pause: bool = False,
    ) -> None:
        issues = [Issue(name, f"must be {allowed}, got {value!r}")
                  for name, value, allowed, ok in (
                      ("slack", slack, ">= 1", slack >= 1.0),
                      ("mode", mode, "'max' or 'min'", mode in ("max", "min")))
                  if not ok]  # fmt: skip
        if issues:
            raise OptionError(issues)
        super().__init__()
        self.slack = slack
        self.enabled = enabled
        self.guard = HangGuard(hang_after_s) if hang_after_s is not None else None
        self.mode = mode
        self.pause = pause
        self.promotions = Promotions()
        self.judge = RungJudge(rungs or RungRule(), mode, pause, self.promotions)
        """The rungs' verdicts, the curves and ``B`` (:mod:`~raybatch.tuning.judge`)."""
        self.capped: dict[str, float] = {}
        self.capped_at_rung: dict[str, float] = {}
        """Tune trial -> the rung (seconds of training) it was stopped at."""
        self.slots: int | None = None
        """Trials the search runs at once, where the driver says (paused trials go on from
        their pause on a free slot only: :meth:`next_to_run`)."""
        self.race = RaceCaps(slack)
        """The confirmation's runs, capped per seed (:mod:`~raybatch.tuning.race_record`)."""
        self.warm = WarmSlots()
        """Keeps an ended trial's process for the next while the searcher waits."""
        self.experiment: tuple[str, str] | None = None
        """The run's experiment folder (storage path, name), where the driver says it is: each
        trial Tune adds is kept there (:func:`~raybatch.tuning.promotion.follow_storage`)."""

    @property
    def best_time_to_target_s(self) -> float | None:
        """``B``: the fastest time to target of a search trial (None before one reached)."""
        return self.judge.best_s

    def rungs(self) -> list[float]:
        """The rungs' training times now (:meth:`RungJudge.rungs`)."""
        return self.judge.rungs()

    @classmethod
    def for_trainable(
        cls, trainable: Callable[..., Any], hang_grace_s: float = HANG_GRACE_S, **kwargs: Any
    ) -> CappingScheduler:
        """The scheduler for a :func:`raybatch.trainable`: :meth:`for_time_cap` with the
        trainable's time cap and target (its direction; the rule's target where it names
        none). ``kwargs`` are this class's other arguments (``slack``, ``rungs``, ...)."""
        settings = parts_of(
            trainable, "use CappingScheduler.for_time_cap(max_time_s) instead"
        ).settings
        kwargs.setdefault("mode", settings.target.mode)
        rule = kwargs.get("rungs") or RungRule()
        if rule.target is None:
            kwargs["rungs"] = replace(rule, target=settings.target.value)
        return cls.for_time_cap(settings.max_time_s, hang_grace_s, **kwargs)

    @classmethod
    def for_time_cap(
        cls, max_time_s: float, hang_grace_s: float | None = HANG_GRACE_S, **kwargs: Any
    ) -> CappingScheduler:
        """The scheduler for trials capped at ``max_time_s`` of training: the rungs tied to
        ``max_time_s / eta`` until a trial reaches the target (ASHA's rungs below the cap)
        where the rule names no guess (build ``CappingScheduler`` itself for rungs without
        one), and a trial silent for ``max_time_s`` plus ``hang_grace_s`` counts as hung
        (``None``: no hang guard)."""
        if hang_grace_s is not None:
            kwargs.setdefault("hang_after_s", max_time_s + hang_grace_s)
        rule = kwargs.get("rungs") or RungRule()
        if rule.horizon_s is None:
            kwargs["rungs"] = replace(rule, horizon_s=guess_of_b(max_time_s, rule.eta))
        return cls(**kwargs)

    @property
    def cap_s(self) -> float | None:
        """The training time past which a running trial is stopped (None before any success)."""
        best = self.best_time_to_target_s
        return None if best is None else self.slack * best

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        if self.guard is not None:
            self.guard.alive(trial.trial_id)
        if trial.trial_id in self.promotions.paused:  # Tune restored it itself (a restart)
            self.promotions.resumed(trial.trial_id)
            tell_searcher(tune_controller, "on_unpause", trial.trial_id)
        if trial.trial_id in self.promotions.promoted:  # it runs again: its pause is over
            self.capped_at_rung.pop(trial.trial_id, None)
        if is_packed(result.get(keys.GPU_SHARE)):  # its clock runs at its neighbours' pace:
            return TrialScheduler.CONTINUE  # not capped, nor an incumbent (its time cap holds)
        # A confirmation run (its config carries its seed) is judged at the target only, capped
        # at slack x the first run on its seed to reach, and never moves the search's B.
        seed = race_seed(getattr(trial, "config", None))
        judge = self.judge
        trajectory = judge.follow(trial.trial_id, result) if seed is None else None
        judge.warm(trial.trial_id, result)
        if result.get(keys.STATUS) == TrialStatus.REACHED.value:
            self._reached(seed, result.get(keys.TIME_TO_TARGET_S))
            return TrialScheduler.CONTINUE
        cap = self.cap_s if seed is None else self.race.cap_s(seed)
        trained = result.get(keys.TRAIN_S)
        running = result.get(keys.STATUS) == TrialStatus.RUNNING.value
        if not (self.enabled and running and trained is not None):
            return TrialScheduler.CONTINUE
        if cap is not None and trained > cap:
            self.capped[trial.trial_id] = float(trained)
            return TrialScheduler.STOP
        if trajectory is None or result.get(keys.HEARTBEAT):
            # No new evaluation: not having *shown* a level is not being behind it (a small
            # batch's next mark may be far off); the rungs are judged at evaluations.
            return TrialScheduler.CONTINUE
        rung = judge.failed_rung(trial.trial_id, trajectory, float(trained))
        before, why, yielding = judge.best_s is None, "behind at", False
        rule = judge.rule
        guess = rule.horizon_s if self.pause and before and rule.zone is not None else None
        if rung is None and guess and self.promotions.yields(trial.trial_id, trained, guess):
            rung, why, yielding = guess, "yielding its slot (ahead) at", True
        if rung is None:
            return TrialScheduler.CONTINUE
        self.capped_at_rung[trial.trial_id] = rung
        if self.pause and (before or rung < judge.rungs()[-1]):
            self.promotions.pause(trial.trial_id, rung, before and not yielding)
            log.debug("trial %s paused at %.3f s, %s the %.3f s rung",
                      trial.trial_id, trained, why, rung)  # fmt: skip
            tell_searcher(tune_controller, "on_pause", trial.trial_id)
            return TrialScheduler.PAUSE
        self.capped[trial.trial_id] = float(trained)
        return TrialScheduler.STOP

    def _reached(self, seed: int | None, time_to_target_s: float | None) -> None:
        """A run reached the target: a search trial's time may be the new ``B`` (the cap, the
        rungs); a confirmation run's, the first on its seed."""
        if time_to_target_s is None:
            return
        if seed is None:
            self.judge.record(time_to_target_s)
        else:
            self.race.reached(seed, time_to_target_s)

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        """Tune's per-step hook: stop hung trials, then choose (:meth:`next_to_run`)."""
        if self.guard is not None:
            self.guard.stop_hung(tune_controller)
        if not self.promotions.paused:
            return super().choose_trial_to_run(tune_controller)
        trials = {t.trial_id: t for t in tune_controller.get_trials()}
        status = {i: t.status for i, t in trials.items()}
        states = list(status.values())
        chosen, stop = self.next_to_run("PENDING" in states, states.count("RUNNING"))
        if stop:
            for trial_id in list(self.promotions.paused):
                if status.get(trial_id) == "PAUSED":
                    tune_controller.stop_trial(trials[trial_id])  # on_trial_remove: capped
        if chosen is not None and status.get(chosen) == "PAUSED":
            log.debug("trial %s goes on from its pause", chosen)
            # The rung it was paused at stays its reason until it reports again: one chosen
            # that Tune then stopped before it ran ends capped there.
            self.promotions.resumed(chosen)
            tell_searcher(tune_controller, "on_unpause", chosen)
            return trials[chosen]
        # FIFO's choice, less its fallback to any paused trial: only a promotion resumes one.
        return next((t for t in trials.values() if t.status == "PENDING"), None)

    def next_to_run(self, pending: bool, running: int) -> tuple[str | None, bool]:
        """The paused trial to run next, and whether the paused left are to stop for good
        (:meth:`Promotions.choose` on this search's curves)."""
        judge = self.judge
        hedged, reached = functools.partial(judge.promotable, hedged=True), self.cap_s is not None
        return self.promotions.choose(judge.promotable, hedged, judge.level, pending, running,
                                      reached, self.slots)  # fmt: skip

    @property
    def hung(self) -> dict[str, float]:
        """Tune trial -> the seconds it had been silent when the guard stopped it."""
        return self.guard.hung if self.guard is not None else {}

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        self.promotions.ended(trial.trial_id)
        self.judge.forget(trial.trial_id)
        super().on_trial_error(tune_controller, trial)

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        follow_storage(trial, self.experiment)  # a copied run's new trials stay in the copy
        self.warm.release(tune_controller, 1)  # its staging reserves a process of its own
        super().on_trial_add(tune_controller, trial)

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        """A paused trial stopped for good (Tune's ``stop_trial``): capped where it paused."""
        if trial.trial_id in self.promotions.paused:
            self.capped[trial.trial_id] = self.promotions.paused[trial.trial_id]
            self.judge.ended.add(trial.trial_id)
        self.promotions.ended(trial.trial_id)
        super().on_trial_remove(tune_controller, trial)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        self.promotions.ended(trial.trial_id)
        self.warm.keep(tune_controller, trial)
        self.judge.ended.add(trial.trial_id)
        if result and result.get(keys.STATUS) == TrialStatus.CENSORED.value:
            self.judge.ran_out.add(trial.trial_id)
        # Its curve stays: evidence at the rungs it got to.
        if result and is_packed(result.get(keys.GPU_SHARE)):
            return
        if result and result.get(keys.STATUS) == TrialStatus.REACHED.value:
            seed = race_seed(getattr(trial, "config", None))
            self._reached(seed, result.get(keys.TIME_TO_TARGET_S))

    def debug_string(self) -> str:
        cap = "none yet" if self.cap_s is None else f"{self.cap_s:.3f} s"
        counts = len(self.capped), len(self.capped_at_rung), len(self.promotions.paused)
        return (f"CappingScheduler: cap {cap}, {counts[0]} trials capped ({counts[1]} at a rung),"
                f" {counts[2]} paused, {len(self.hung)} hung")  # fmt: skip
