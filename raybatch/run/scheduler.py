"""Adaptive capping on equal-time rungs: stop a trial the moment it cannot win.

Every trial is judged at rungs of its own training time (``train_s``, evaluations excluded)
tied to the target, ``B/9, B/3, B`` with ``B`` the fastest time to target seen, and goes on
only while it is within the indifference zone of the best curve there or in the top 1/eta
(:mod:`raybatch.run.rungs`). Past ``slack x B`` a trial cannot win and is stopped (adaptive
capping, as in ParamILS and SMAC); the searcher records it PRUNED with the PAR-10 penalty. A
trial silent past ``hang_after_s`` is stuck inside a step and no result will stop it: the hang
guard (:class:`~raybatch.run.hang.HangGuard`) stops it at Tune's next scheduling step.

Example::

    from ray import tune
    import raybatch

    fn = raybatch.trainable(workload, space, "accuracy>=0.9", max_time_s=60)
    tuner = tune.Tuner(fn, tune_config=tune.TuneConfig(
        search_alg=raybatch.RaybatchSearcher.for_trainable(fn),
        scheduler=raybatch.CappingScheduler.for_trainable(fn), num_samples=20))
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from raybatch import keys
from raybatch.errors import Issue, OptionError
from raybatch.results.selection import is_packed
from raybatch.run.hang import HangGuard
from raybatch.run.rungs import (
    DEFAULT_ETA,
    DEFAULT_ZONE,
    GUESS_RUNG_COUNT,
    HEDGE,
    Trajectory,
    hedged_zone,
    judged_near,
    passes,
    rung_times,
)
from raybatch.run.tune_state import follow_storage
from raybatch.run.warm import WarmSlots
from raybatch.status import HANG_GRACE_S, TrialStatus
from raybatch.trial.settings import parts_of

DEFAULT_SLACK = 1.2


def race_seed(config: dict[str, Any] | None) -> int | None:
    """The seed of a confirmation run's Tune config (it carries its candidate and seed:
    :class:`~raybatch.run.confirmation.RaceSearcher`); ``None`` for a search trial."""
    if not config or keys.CANDIDATE not in config or config.get(keys.SEED) is None:
        return None
    return int(config[keys.SEED])


class CappingScheduler(FIFOScheduler):
    """A FIFO scheduler that stops a trial as soon as it cannot beat the best time to target.

    Every trial is judged at equal-time rungs and capped at ``slack`` x the incumbent's time.

    Args:
        slack: Multiple of the best time to target past which a trial is stopped.
        enabled: ``False`` keeps the bookkeeping but never stops (for comparisons).
        hang_after_s: Wall seconds without a report (or, before the first, since the trial
            started) after which a running trial counts as hung and is stopped (``None``:
            never). Set it well past the trial's own time cap plus its start-up (model build,
            probe, data loading), which the trial clock excludes.
        zone: The indifference zone at the rungs: a trial at most ``1 + zone`` times slower
            than the best curve to its level goes on (``None``: no rungs; only the final time
            to target caps).
        eta: A trial outside the zone goes on while it is in the top ``1/eta`` at its rung.
        hedge: How much wider the zone is at earlier rungs (:func:`~raybatch.run.rungs.
            hedged_zone`; 0: the same zone at every rung).
        horizon_s: The guess of the optimum's time to target the rungs are tied to until a
            trial has reached the target (``None``: no rungs before then).
        mode: The target's direction (``max`` or ``min``), to read the reported metric.

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
        self.race_best_s: dict[int, float] = {}
        """Confirmation seed -> the first (fastest) time to target of a run on it."""
        self.warm = WarmSlots()
        """Keeps an ended trial's process for the next while the searcher waits."""
        self.experiment: tuple[str, str] | None = None
        """The run's experiment folder (storage path, name), where the driver says it is: each
        trial Tune adds is kept there (:func:`~raybatch.run.tune_state.follow_storage`)."""

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
        kwargs.setdefault("horizon_s", max_time_s / kwargs.get("eta", DEFAULT_ETA))
        return cls(**kwargs)

    def race_cap_s(self, seed: int) -> float | None:
        """The training time past which a confirmation run on ``seed`` is stopped: ``slack`` x
        the first run on that seed to reach (None before one has)."""
        best = self.race_best_s.get(seed)
        return None if best is None else self.slack * best

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
        # A confirmation run (its config carries its seed) is judged at the target only,
        # capped at slack x the first run on its seed to reach, and never moves the search's B.
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
        if rung is not None:
            self.capped[trial.trial_id] = float(trained)
            self.capped_at_rung[trial.trial_id] = rung
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE

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
        """The rungs' training times now (none without a horizon or a zone): ``B/eta^2 .. B``
        once a trial has reached the target (``B`` the fastest time to target); before, the
        guess is only a bound, so the rungs go further down
        (:data:`~raybatch.run.rungs.GUESS_RUNG_COUNT`), and trials started together are
        compared from their first evaluations on."""
        if self.zone is None:
            return []
        if self.best_time_to_target_s is not None:
            return rung_times(self.best_time_to_target_s, self.eta)
        if self.horizon_s is None:
            return []
        return rung_times(self.horizon_s, self.eta, GUESS_RUNG_COUNT)

    def _warm(self, trial_id: str, result: dict[str, Any]) -> None:
        """Follow the trial's warmup from its evaluations (:data:`~raybatch.keys.WARMING_UP`;
        a trial whose loop does not say is taken as warm): before any trial has reached the
        target, while its LR ramps up no rung judges it, and once an evaluation finds the
        warmup over, no rung up to that evaluation does (its value there is interpolated from
        the warmup); once one has, every rung judges it (:meth:`_judges_warmup`). A trial run
        again from its start warms up again."""
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
        next evaluation, and a faster incumbent moves the rungs earlier. A rung the trial
        reached in its warmup (up to its first evaluation past it) does not judge it before
        any trial has reached the target (:meth:`_judges_warmup`): its curve there shows how
        long its LR ramps up, which grows with the LR scale, not how fast it trains (a real search
        stopped nine of twelve trials at chance accuracy, most mid-warmup, at the earliest
        rung). Those rungs are not lost: the trial is judged once at its first evaluation past
        the warmup, against the others' curves at that training time, with the zone of the
        highest rung it was spared at (a recipe whose LR diverged once the ramp was over ran
        at chance accuracy to its time cap, the rungs behind it). Nor is a spared rung
        counted as judged: a rung that moves near it later still judges the trial."""
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
        for index, rung_s in enumerate(rungs):
            below_top = len(rungs) - 1 - index
            if rung_s > trained:  # not yet
                continue
            zone = hedged_zone(self.zone, self.eta, below_top, self.hedge)
            if rung_s <= warm_from and (covered or not self._judges_warmup()):
                spared_zone = zone  # passed in its warmup: judged once it is warm
            elif not judged_near(trajectory.judged, rung_s, self.eta):
                judged.append((rung_s, zone, False))
        if spared_zone is not None and warm_from <= trained and trial_id not in self._warm_judged:
            judged.insert(0, (warm_from, spared_zone, True))
        for rung_s, zone, past_warmup in judged:
            verdict = passes(trajectory, rung_s, self._others(trial_id), zone, self.eta)
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

    def _judges_warmup(self) -> bool:
        """Whether a rung judges a trial still in its warmup: once a trial has reached the
        target in ``B``, every rung does. The warmup grows with the LR scale, and a large batch
        at a large LR can warm up for longer than the optimum trains (the benchmark's wide MLP:
        micro batch 1024 at 4x the rule's LR warms up over 2.8 epochs, where its best recipe
        reaches the target in about 2). Spared at ``B/eta^2``, such trials were judged first at
        ``B/eta`` and held a third of the incumbent's training each: a real 12-trial search of
        the tabular example (``B`` 5.9 s) stopped 7 of its 12 trials between 2.2 and 2.3 s at
        the 2 s rung, 6 of them still warming up at the 0.66 s one. Where the measured optimum
        trains in ``B``, a recipe whose own LR ramp takes a ninth of that is slow, and its
        curve says so; ranked among the curves at the rung, the top third still goes on, and
        the real benchmark's grids replayed with no warmup spared at any rung
        (``bench/rung_replay.py``) picked a recipe within 1.00x of the fastest drawn, median of
        every case. Before any trial has reached, ``B`` is only a bound and every rung spares
        the warmup."""
        return self.best_time_to_target_s is not None

    def _others(self, trial_id: str) -> list[Trajectory]:
        """The curves a trial is judged against: once a trial has reached the target, every
        other seen, running or ended (capped ones included: what they showed up to their stop
        is evidence at the rungs they got to); before, the trials running beside it and those
        that ran to their own time cap short of the target. Judged against curves stopped at
        a rung too, with no incumbent to bound the search, every trial can fall behind some
        curve at some rung while early curves cross: a real search (six trials, four at a
        time, on a loaded machine) had all six stopped and none reached. A curve that ran its
        whole time cap is another matter: a trial clearly behind a recipe that could not reach
        the target in the cap cannot either, and without it a lone trial (one slot: one GPU)
        had nothing to be judged against and ran to its cap. Such curves also join the top
        third a rung ranks, as in ASHA: a trial ahead of them is ranked among more curves than
        its one running neighbour, and goes on more often than it did (the rung replay: 41 %
        of all its verdicts stopped a trial, against 57 % when only running neighbours judged
        before the first reach)."""
        ended = self._ended - self._ran_out if self.best_time_to_target_s is None else set()
        return [t for other, t in self._trajectories.items()
                if other != trial_id and other not in ended]  # fmt: skip

    def _follow(self, trial_id: str, result: dict[str, Any]) -> Trajectory:
        """The trial's trajectory, with this result's evaluation added (if it is one: a
        heartbeat, or a trial's end at its time cap, repeats the last evaluation's value at a
        later time, which would flatten the curve between evaluations)."""
        trajectory = self._trajectories.setdefault(trial_id, Trajectory(self.mode))
        metric, trained = result.get(keys.METRIC), result.get(keys.TRAIN_S)
        evaluated = not result.get(keys.HEARTBEAT) and result.get(keys.STATUS) in (
            TrialStatus.RUNNING.value, TrialStatus.REACHED.value)  # fmt: skip
        if evaluated and metric is not None and trained is not None:
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
        self._warming.pop(trial.trial_id, None)
        self._warm_judged.discard(trial.trial_id)
        self._warm_before_reach.discard(trial.trial_id)
        super().on_trial_error(tune_controller, trial)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Tune pickles the scheduler with the experiment: one saved by an earlier raybatch of
        # the same run format lacks what was added since, and resumes with it empty.
        self.__dict__.update(state)
        self.__dict__.setdefault("_ended", set())
        self.__dict__.setdefault("_ran_out", set())
        self.__dict__.setdefault("_warm_judged", set())
        self.__dict__.setdefault("_warming", {})
        self.__dict__.setdefault("_warm_before_reach", set(self.__dict__["_warm_judged"]))
        self.__dict__.setdefault("warm", WarmSlots())
        self.__dict__.setdefault("experiment", None)

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        follow_storage(trial, self.experiment)  # a copied run's new trials stay in the copy
        self.warm.release(tune_controller, 1)  # its staging reserves a process of its own
        super().on_trial_add(tune_controller, trial)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        self.warm.keep(tune_controller, trial)
        self._ended.add(trial.trial_id)
        if result and result.get(keys.STATUS) == TrialStatus.CENSORED.value:
            self._ran_out.add(trial.trial_id)
        # Its curve stays: what it showed up to its end is evidence at the rungs it got to.
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
        return (
            f"CappingScheduler: cap {cap}, {len(self.capped)} trials capped"
            f" ({len(self.capped_at_rung)} at a rung), {len(self.hung)} hung"
        )
