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
import math
from collections.abc import Callable
from typing import Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from raybatch import keys
from raybatch.errors import Issue, OptionError
from raybatch.status import HANG_GRACE_S, TrialStatus, is_packed, timed_evaluation
from raybatch.trial.settings import parts_of
from raybatch.tuning.hang import HangGuard
from raybatch.tuning.promotion import Promotions, follow_storage, tell_searcher
from raybatch.tuning.race_record import race_seed
from raybatch.tuning.rungs import (
    DEFAULT_ETA,
    DEFAULT_ZONE,
    HEDGE,
    TOLERANCE,
    Trajectory,
    grid_rungs,
    guess_of_b,
    guessed_rungs,
    hedged_zone,
    lowest_mark,
    passes,
    rung_times,
)
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
        zone: The indifference zone at the rungs: a trial at most ``1 + zone`` times slower
            than the best curve to its level goes on (``None``: no rungs).
        eta: A trial outside the zone goes on while it is in the top ``1/eta`` at its rung.
        hedge: How much wider the zone is at earlier rungs (0: the same at every rung).
        horizon_s: The guess of ``B`` until a trial has reached (``None``: no rungs before).
        target: The target's value (``for_trainable`` reads it): curves extrapolated to it
            add rungs below the guess (:func:`~raybatch.tuning.rungs.guessed_rungs`).
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
        zone: float | None = DEFAULT_ZONE,
        eta: float = DEFAULT_ETA,
        hedge: float = HEDGE,
        horizon_s: float | None = None,
        mode: str = "max",
        pause: bool = False,
        target: float | None = None,
    ) -> None:
        issues = [Issue(name, f"must be {allowed}, got {value!r}")
                  for name, value, allowed, ok in (
                      ("slack", slack, ">= 1", slack >= 1.0),
                      ("zone", zone, ">= 0 or None", zone is None or zone >= 0),
                      ("eta", eta, "> 1", eta > 1.0),
                      ("mode", mode, "'max' or 'min'", mode in ("max", "min")))
                  if not ok]  # fmt: skip
        if issues:
            raise OptionError(issues)
        super().__init__()
        self.slack = slack
        self.enabled = enabled
        self.guard = HangGuard(hang_after_s) if hang_after_s is not None else None
        self.zone = zone
        self.eta = eta
        self.hedge = hedge
        self.horizon_s = horizon_s
        self.mode = mode
        self.target = target
        self.best_time_to_target_s: float | None = None
        self.capped: dict[str, float] = {}
        self.capped_at_rung: dict[str, float] = {}
        """Tune trial -> the rung (seconds of training) it was stopped at."""
        self.rung_zones: dict[str, float] = {}
        """Tune trial -> the zone of the rung it was stopped at (hedged: wider early)."""
        self._trajectories: dict[str, Trajectory] = {}
        self._ended: set[str] = set()  # trials whose curves have ended (completed, stopped)
        self._ran_out: set[str] = set()  # ended at their own time cap, short of the target
        self._warm_judged: set[str] = set()  # judged at their first evaluation past warmup
        self._warm_before_reach: set[str] = set()  # warmup over before any trial reached
        self._warming: dict[str, float] = {}  # trial -> its first evaluation past its warmup
        self.pause = pause
        self.promotions = Promotions()
        self.slots: int | None = None
        """Trials the search runs at once, where the driver says (paused trials go on from
        their pause on a free slot only: :meth:`next_to_run`)."""
        self.race_best_s: dict[int, float] = {}
        """Confirmation seed -> the first (fastest) time to target of a run on it."""
        self.warm = WarmSlots()
        """Keeps an ended trial's process for the next while the searcher waits."""
        self.experiment: tuple[str, str] | None = None
        """The run's experiment folder (storage path, name), where the driver says it is: each
        trial Tune adds is kept there (:func:`~raybatch.tuning.promotion.follow_storage`)."""

    @classmethod
    def for_trainable(
        cls, trainable: Callable[..., Any], hang_grace_s: float = HANG_GRACE_S, **kwargs: Any
    ) -> CappingScheduler:
        """The scheduler for a :func:`raybatch.trainable`: :meth:`for_time_cap` with the
        trainable's time cap and target's direction. ``kwargs`` are this class's other
        arguments (``slack``, ``zone``, ...)."""
        settings = parts_of(
            trainable, "use CappingScheduler.for_time_cap(max_time_s) instead"
        ).settings
        kwargs.setdefault("mode", settings.target.mode)
        kwargs.setdefault("target", settings.target.value)
        return cls.for_time_cap(settings.max_time_s, hang_grace_s, **kwargs)

    @classmethod
    def for_time_cap(
        cls, max_time_s: float, hang_grace_s: float | None = HANG_GRACE_S, **kwargs: Any
    ) -> CappingScheduler:
        """The scheduler for trials capped at ``max_time_s`` of training: the rungs tied to
        ``max_time_s / eta`` until a trial reaches the target (ASHA's rungs below the cap), and
        a trial silent for ``max_time_s`` plus ``hang_grace_s`` counts as hung (``None``: no
        hang guard)."""
        if hang_grace_s is not None:
            kwargs.setdefault("hang_after_s", max_time_s + hang_grace_s)
        kwargs.setdefault("horizon_s", guess_of_b(max_time_s, kwargs.get("eta", DEFAULT_ETA)))
        return cls(**kwargs)

    def race_cap_s(self, seed: int) -> float | None:
        """The training time past which a confirmation run on ``seed`` is stopped: ``slack`` x
        the first run on that seed to reach (None before one has)."""
        best = self.race_best_s.get(seed)
        return None if best is None else self.slack * best

    @property
    def cap_s(self) -> float | None:
        """The training time past which a running trial is stopped (None before any success)."""
        best = self.best_time_to_target_s
        return None if best is None else self.slack * best

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        if self.guard is not None:
            self.guard.alive(trial.trial_id)
        if trial.trial_id in self.promotions.paused:  # Tune restored it itself (a restart)
            self.resume(trial.trial_id)
            tell_searcher(tune_controller, "on_unpause", trial.trial_id)
        if trial.trial_id in self.promotions.promoted:  # it runs again: its pause is over
            self.capped_at_rung.pop(trial.trial_id, None)
        if is_packed(result.get(keys.GPU_SHARE)):  # its clock runs at its neighbours' pace:
            return TrialScheduler.CONTINUE  # not capped, nor an incumbent (its time cap holds)
        # A confirmation run (its config carries its seed) is judged at the target only, capped
        # at slack x the first run on its seed to reach, and never moves the search's B.
        seed = race_seed(getattr(trial, "config", None))
        trajectory = self._follow(trial.trial_id, result) if seed is None else None
        self._warm(trial.trial_id, result)
        if result.get(keys.STATUS) == TrialStatus.REACHED.value:
            self._reached(seed, result.get(keys.TIME_TO_TARGET_S))
            return TrialScheduler.CONTINUE
        cap = self.cap_s if seed is None else self.race_cap_s(seed)
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
        rung = self._failed_rung(trial.trial_id, trajectory, float(trained))
        before, why, yielding = self.best_time_to_target_s is None, "behind at", False
        guess = self.horizon_s if self.pause and before and self.zone is not None else None
        if rung is None and guess and self.promotions.yields(trial.trial_id, trained, guess):
            rung, why, yielding = guess, "yielding its slot (ahead) at", True
        if rung is None:
            return TrialScheduler.CONTINUE
        self.capped_at_rung[trial.trial_id] = rung
        if self.pause and (before or rung < self.rungs()[-1]):
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
            self._record(time_to_target_s)
        else:
            self.race_best_s[seed] = min(self.race_best_s.get(seed, math.inf), time_to_target_s)

    def rungs(self) -> list[float]:
        """The rungs' training times now (none without a horizon or a zone): on the grid below
        ``B`` and ``B`` itself once a trial has reached the target (``B`` the fastest time to
        target); before, the guess (:func:`~raybatch.tuning.rungs.guessed_rungs`)."""
        best, horizon, eta = self.best_time_to_target_s, self.horizon_s, self.eta
        if self.zone is None or (best is None and horizon is None):
            return []
        if best is not None:
            return rung_times(best, eta) if horizon is None else grid_rungs(best, horizon, eta)
        assert horizon is not None
        return guessed_rungs(horizon, eta, self._trajectories.values(), self.target)

    def _warm(self, trial_id: str, result: dict[str, Any]) -> None:
        """Follow the trial's warmup from its evaluations (:data:`~raybatch.keys.WARMING_UP`;
        a loop that does not say is warm): which rungs fell in it (:meth:`_judges_warmup`). A
        trial run again from its start warms up again."""
        trained = result.get(keys.TRAIN_S)
        if result.get(keys.HEARTBEAT) or trained is None or result.get(keys.WARMING_UP) is None:
            return
        if result[keys.WARMING_UP]:
            self._warming[trial_id] = math.inf
            self._warm_judged.discard(trial_id)
            self._warm_before_reach.discard(trial_id)
        elif self._warming.get(trial_id) == math.inf:
            self._warming[trial_id] = float(trained)
            if self.best_time_to_target_s is None:
                self._warm_before_reach.add(trial_id)

    def _failed_rung(self, trial_id: str, trajectory: Trajectory, trained: float) -> float | None:
        """The first rung up to ``trained`` this trial fails at (``None``: it goes on). A rung
        judges a trial once, beside other curves; one it got to first is judged again at its
        next evaluation, and a faster incumbent moves the rungs earlier. A rung reached in the
        trial's LR warmup does not judge it where :meth:`_judges_warmup` says so (its curve
        there shows how long its ramp is, not how fast it trains): it is judged once at its
        first evaluation past the warmup, with the zone of the highest rung it was spared at."""
        if self.zone is None:
            return None
        rungs = self.rungs()
        warm_from = self._warming.get(trial_id, 0.0)
        # Warm before any trial reached: its one judgment past the warmup (done, or still owed
        # where no other curve had got that far) stands for the rungs up to it, which its LR
        # ramp would otherwise be judged at once B appears.
        covered = trial_id in self._warm_before_reach
        judged: list[tuple[float, float, bool]] = []  # (training time, zone, past warmup)
        spared_zone = None  # the zone of the highest rung its warmup spared
        # Promoted past a rung, or judged at a later one: a rung added below (an earlier
        # estimate of B) does not judge it after the fact.
        exempt = self.promotions.exempt_up_to(trial_id)
        later = max(trajectory.judged, default=0.0) * (1.0 - TOLERANCE)
        for index, rung_s in enumerate(rungs):
            below_top = len(rungs) - 1 - index
            if rung_s > trained * (1.0 + TOLERANCE) or rung_s <= exempt or rung_s < later:
                continue
            zone = self._rung_zone(below_top)
            if rung_s <= warm_from and (covered or not self._judges_warmup()):
                spared_zone = zone  # passed in its warmup: judged once it is warm
            elif not any(math.isclose(t, rung_s, rel_tol=TOLERANCE) for t in trajectory.judged):
                judged.append((rung_s, zone, False))
        if spared_zone is not None and warm_from <= trained and trial_id not in self._warm_judged:
            judged.insert(0, (warm_from, spared_zone, True))
        for rung_s, zone, past_warmup in judged:
            verdict = self._verdict(trial_id, trajectory, rung_s, zone)
            if verdict is None:
                continue
            if past_warmup:
                self._warm_judged.add(trial_id)
            else:
                trajectory.judged.add(rung_s)
            if not verdict:
                self.rung_zones[trial_id] = zone
                return rung_s
        return None

    def _verdict(self, trial_id: str, trajectory: Trajectory, rung_s: float, zone: float
                 ) -> bool | None:  # fmt: skip
        """:func:`~raybatch.tuning.rungs.passes` at the rung; where a trial behind is paused,
        before any trial has reached, one of fewer than eta curves at the rung waits there for
        the next trials (successive halving's rounds: the first trial to a rung would otherwise
        go on alone, a slow recipe with it, until it reached the target), unless it went on as
        the leader with nothing new to run (:meth:`Promotions.leads`): none will come."""
        others = self._others(trial_id)
        low = lowest_mark(self.horizon_s, self.eta) if self.horizon_s else 0.0
        first = rung_s <= low * (1.0 + TOLERANCE)  # no curve shows the rung: first values do
        before = self.best_time_to_target_s is None  # a reach, and every curve judges
        if self.pause and before and not self.promotions.leads(trial_id):
            seen = sum(c.value_at(rung_s, first) is not None for c in others)
            if seen + 1 < self.eta and trajectory.value_at(rung_s) is not None:
                return False
        # At B a trial not there yet can at best tie: the zone passes it, not a top third of
        # curves that did not reach either (a real digits search ran 5 on to slack x B, vainly).
        top = not before and math.isclose(rung_s, self.best_time_to_target_s or 0.0)
        return passes(trajectory, rung_s, others, zone, math.inf if top else self.eta, first)

    def _rung_zone(self, below_top: int) -> float:
        """The zone a rung ``below_top`` under the highest judges with: hedged, wider early
        (:func:`~raybatch.tuning.rungs.hedged_zone`); where a trial behind is paused, none but at
        ``B`` once measured (before, the hedge is in the promotion: :meth:`_promotable`)."""
        assert self.zone is not None
        if self.pause and not (below_top == 0 and self.best_time_to_target_s is not None):
            return 0.0
        return hedged_zone(self.zone, self.eta, below_top, self.hedge)

    def _judges_warmup(self) -> bool:
        """Whether a rung judges a trial still in its LR warmup: once ``B`` is measured (a ramp
        of a ninth of it is slow: ``docs/search.md``), or where a trial behind is paused (taken
        back once its ramp is over). Before, ``B`` is only a bound: every rung spares it."""
        return self.pause or self.best_time_to_target_s is not None

    def _others(self, trial_id: str) -> list[Trajectory]:
        """The curves a trial is judged against: once a trial has reached, every other seen
        (a capped one's up to its stop); before, those running or paused beside it and those
        that ran their whole time cap short of the target (early curves cross: one stopped at a
        rung is left out; a real search once had all six trials stopped and none reached)."""
        ended = self._ended - self._ran_out if self.best_time_to_target_s is None else set()
        return [t for other, t in self._trajectories.items()
                if other != trial_id and other not in ended]  # fmt: skip

    def _follow(self, trial_id: str, result: dict[str, Any]) -> Trajectory:
        """The trial's trajectory, with this result's evaluation added (if it is one: a heartbeat
        or an end at the cap repeats the last value later, which would flatten the curve)."""
        trajectory = self._trajectories.setdefault(trial_id, Trajectory(self.mode))
        evaluation = timed_evaluation(result)
        if evaluation is not None:
            trajectory.add(*evaluation)
        return trajectory

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
            self.resume(chosen)
            tell_searcher(tune_controller, "on_unpause", chosen)
            return trials[chosen]
        # FIFO's choice, less its fallback to any paused trial: only a promotion resumes one.
        return next((t for t in trials.values() if t.status == "PENDING"), None)

    def resume(self, trial_id: str) -> None:
        """A paused trial goes on. The rung it was paused at stays its reason until it reports
        again: one chosen that Tune then stopped before it ran ends capped there."""
        self.promotions.resumed(trial_id)

    def next_to_run(self, pending: bool, running: int) -> tuple[str | None, bool]:
        """The paused trial to run next, and whether the paused left are to stop for good
        (:meth:`Promotions.choose` on this search's curves)."""
        hedged, reached = functools.partial(self._promotable, hedged=True), self.cap_s is not None
        return self.promotions.choose(self._promotable, hedged, self._level, pending, running,
                                      reached, self.slots)  # fmt: skip

    def _promotable(self, trial_id: str, hedged: bool = False) -> bool:
        """Whether the rung a paused trial was paused at passes it now, against every curve
        seen since: level with the best or in the top 1/eta (``hedged``: or within the zone
        that rung has, wider early; before a reach, not from the guess's top two rungs)."""
        at = self.promotions.paused[trial_id]
        trajectory = self._trajectories.get(trial_id)
        yielded = trial_id in getattr(self.promotions, "yielded", ())
        if trajectory is None or (yielded and self.best_time_to_target_s is None):
            return trajectory is None  # one that yielded goes on as the leader only
        zone = 0.0
        rungs = self.rungs()
        if hedged and rungs and self.best_time_to_target_s is not None and (
                at < rungs[0] * (1.0 - TOLERANCE)):  # fmt: skip
            return True  # paused below every rung there is now: judged at the lowest instead
        if hedged and self._warming.get(trial_id, 0.0) > at and len(rungs) > 1 and at < rungs[-2]:
            return True  # paused in its LR warmup early: judged once more, further on
        if hedged and trial_id not in getattr(self.promotions, "guessed", ()):
            return False  # paused once B was measured: ASHA's promotion only (promotion.py)
        if hedged and self.best_time_to_target_s is None and len(rungs) > 1 and (
                at >= rungs[-2] * (1.0 - TOLERANCE)):  # fmt: skip
            return False  # from the guess's top two rungs, the dearest: as the leader only
        if hedged and self.zone is not None:
            top = rungs[-1] if rungs else at
            below_top = max(0, round(math.log(max(top / at, 1.0)) / math.log(self.eta)))
            zone = hedged_zone(self.zone, self.eta, below_top, self.hedge)
        return bool(self._verdict(trial_id, trajectory, at, zone))

    def _level(self, trial_id: str) -> float:
        """A paused trial's level at its rung: ranked at equal time, not by how far it got."""
        trajectory, at = self._trajectories.get(trial_id), self.promotions.paused.get(trial_id)
        level = None if trajectory is None or at is None else trajectory.value_at(at)
        return -math.inf if level is None else float(level)

    @property
    def hang_after_s(self) -> float | None:
        """Wall seconds of silence after which a running trial counts as hung (``None``)."""
        return self.guard.after_s if self.guard is not None else None

    @property
    def hung(self) -> dict[str, float]:
        """Tune trial -> the seconds it had been silent when the guard stopped it."""
        return self.guard.hung if self.guard is not None else {}

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        self.promotions.ended(trial.trial_id)
        self._trajectories.pop(trial.trial_id, None)
        self._warming.pop(trial.trial_id, None)
        for judged in (self._warm_judged, self._warm_before_reach):
            judged.discard(trial.trial_id)
        super().on_trial_error(tune_controller, trial)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # One pickled by an earlier raybatch of the same run format resumes with what it lacks.
        self.__dict__.update(state)
        added = {"_ended": set(), "_ran_out": set(), "_warm_judged": set(), "_warming": {},
                 "warm": WarmSlots(), "experiment": None, "pause": False,
                 "promotions": Promotions(), "slots": None}  # fmt: skip
        for name, empty in added.items():
            self.__dict__.setdefault(name, empty)
        self.__dict__.setdefault("_warm_before_reach", set(self.__dict__["_warm_judged"]))

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        follow_storage(trial, self.experiment)  # a copied run's new trials stay in the copy
        self.warm.release(tune_controller, 1)  # its staging reserves a process of its own
        super().on_trial_add(tune_controller, trial)

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        """A paused trial stopped for good (Tune's ``stop_trial``): capped where it paused."""
        if trial.trial_id in self.promotions.paused:
            self.capped[trial.trial_id] = self.promotions.paused[trial.trial_id]
            self._ended.add(trial.trial_id)
        self.promotions.ended(trial.trial_id)
        super().on_trial_remove(tune_controller, trial)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        self.promotions.ended(trial.trial_id)
        self.warm.keep(tune_controller, trial)
        self._ended.add(trial.trial_id)
        if result and result.get(keys.STATUS) == TrialStatus.CENSORED.value:
            self._ran_out.add(trial.trial_id)
        # Its curve stays: evidence at the rungs it got to.
        if result and is_packed(result.get(keys.GPU_SHARE)):
            return
        if result and result.get(keys.STATUS) == TrialStatus.REACHED.value:
            seed = race_seed(getattr(trial, "config", None))
            self._reached(seed, result.get(keys.TIME_TO_TARGET_S))

    def _record(self, time_to_target_s: float | None) -> None:
        """A trial reached the target: a faster time is the new ``B`` (the cap, the rungs)."""
        if time_to_target_s is None:
            return
        if self.best_time_to_target_s is None or time_to_target_s < self.best_time_to_target_s:
            self.best_time_to_target_s = float(time_to_target_s)

    def debug_string(self) -> str:
        cap = "none yet" if self.cap_s is None else f"{self.cap_s:.3f} s"
        counts = len(self.capped), len(self.capped_at_rung), len(self.promotions.paused)
        return (f"CappingScheduler: cap {cap}, {counts[0]} trials capped ({counts[1]} at a rung),"
                f" {counts[2]} paused, {len(self.hung)} hung")  # fmt: skip
