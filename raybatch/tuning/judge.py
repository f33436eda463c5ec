"""The rungs' verdicts: which rung a trial falls behind at, and whether a paused one passes now.

The capping scheduler (:mod:`raybatch.tuning.scheduler`) holds Tune's side (the cap, the race,
pauses and stops); the judge holds the curves, the fastest time to target (``B``) and the rule
(:class:`~raybatch.tuning.rungs.RungRule`), and answers from them alone, so each decision of
the rungs is read in one place. A rung reached in a trial's LR warmup is judged once the trial
is warm where :meth:`RungJudge.judges_warmup` says so (its curve there shows how long its ramp
is, not how fast it trains).
"""

from __future__ import annotations

import math
from typing import Any

from raybatch import keys
from raybatch.status import timed_evaluation
from raybatch.tuning.promotion import Promotions
from raybatch.tuning.rungs import (
    TOLERANCE,
    RungRule,
    Trajectory,
    grid_rungs,
    guessed_rungs,
    hedged_zone,
    lowest_mark,
    passes,
    rung_times,
)


class RungJudge:
    """A search's curves and ``B``, judged at its rungs.

    Args:
        rule: The rungs' rule (``rule.zone`` ``None``: no rungs).
        mode: The target's direction (``max`` or ``min``), to read the reported metric.
        pause: Whether a trial behind is paused (the search's successive halving rounds) or
            stopped; it changes how the zone and the warmup are read.
        promotions: The scheduler's paused and promoted trials (what a promotion exempts).
    """

    def __init__(self, rule: RungRule, mode: str, pause: bool, promotions: Promotions) -> None:
        self.rule = rule
        self.mode = mode
        self.pause = pause
        self.promotions = promotions
        self.best_s: float | None = None
        """``B``: the fastest time to target of a search trial (None before one reached)."""
        self.rung_zones: dict[str, float] = {}
        """Tune trial -> the zone of the rung it fell behind at (hedged: wider early)."""
        self.trajectories: dict[str, Trajectory] = {}
        self.ended: set[str] = set()  # trials whose curves have ended (completed, stopped)
        self.ran_out: set[str] = set()  # ended at their own time cap, short of the target
        self.warm_judged: set[str] = set()  # judged at their first evaluation past warmup
        self.warm_before_reach: set[str] = set()  # warmup over before any trial reached
        self.warming: dict[str, float] = {}  # trial -> its first evaluation past its warmup

    def record(self, time_to_target_s: float | None) -> None:
        """A search trial reached the target: a faster time is the new ``B``."""
        if time_to_target_s is not None and (self.best_s is None or time_to_target_s < self.best_s):
            self.best_s = float(time_to_target_s)

    def rungs(self) -> list[float]:
        """The rungs' training times now (none without a horizon or a zone): on the grid below
        ``B`` and ``B`` itself once a trial has reached the target (``B`` the fastest time to
        target); before, the guess (:func:`~raybatch.tuning.rungs.guessed_rungs`)."""
        best, horizon, eta = self.best_s, self.rule.horizon_s, self.rule.eta
        if self.rule.zone is None or (best is None and horizon is None):
            return []
        if best is not None:
            return rung_times(best, eta) if horizon is None else grid_rungs(best, horizon, eta)
        assert horizon is not None
        return guessed_rungs(horizon, eta, self.trajectories.values(), self.rule.target)

    def follow(self, trial_id: str, result: dict[str, Any]) -> Trajectory:
        """The trial's trajectory, with this result's evaluation added (if it is one: a heartbeat
        or an end at the cap repeats the last value later, which would flatten the curve)."""
        trajectory = self.trajectories.setdefault(trial_id, Trajectory(self.mode))
        evaluation = timed_evaluation(result)
        if evaluation is not None:
            trajectory.add(*evaluation)
        return trajectory

    def warm(self, trial_id: str, result: dict[str, Any]) -> None:
        """Follow the trial's warmup from its evaluations (:data:`~raybatch.keys.WARMING_UP`;
        a loop that does not say is warm): which rungs fell in it. A trial run again from its
        start warms up again."""
        trained = result.get(keys.TRAIN_S)
        if result.get(keys.HEARTBEAT) or trained is None or result.get(keys.WARMING_UP) is None:
            return
        if result[keys.WARMING_UP]:
            self.warming[trial_id] = math.inf
            self.warm_judged.discard(trial_id)
            self.warm_before_reach.discard(trial_id)
        elif self.warming.get(trial_id) == math.inf:
            self.warming[trial_id] = float(trained)
            if self.best_s is None:
                self.warm_before_reach.add(trial_id)

    def forget(self, trial_id: str) -> None:
        """A trial failed (Tune may run it again from its start): its curve and warmup go."""
        self.trajectories.pop(trial_id, None)
        self.warming.pop(trial_id, None)
        self.warm_judged.discard(trial_id)
        self.warm_before_reach.discard(trial_id)

    def failed_rung(self, trial_id: str, trajectory: Trajectory, trained: float) -> float | None:
        """The first rung up to ``trained`` this trial fails at (``None``: it goes on). A rung
        judges a trial once, beside other curves; one it got to first is judged again at its
        next evaluation, and a faster incumbent moves the rungs earlier. A rung reached in the
        trial's LR warmup does not judge it where :meth:`judges_warmup` says so: it is judged
        once at its first evaluation past the warmup, with the zone of the highest rung it was
        spared at."""
        if self.rule.zone is None:
            return None
        rungs = self.rungs()
        warm_from = self.warming.get(trial_id, 0.0)
        # Warm before any trial reached: its one judgment past the warmup (done, or still owed
        # where no other curve had got that far) stands for the rungs up to it, which its LR
        # ramp would otherwise be judged at once B appears.
        covered = trial_id in self.warm_before_reach
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
            zone = self.rung_zone(below_top)
            if rung_s <= warm_from and (covered or not self.judges_warmup()):
                spared_zone = zone  # passed in its warmup: judged once it is warm
            elif not any(math.isclose(t, rung_s, rel_tol=TOLERANCE) for t in trajectory.judged):
                judged.append((rung_s, zone, False))
        if spared_zone is not None and warm_from <= trained and trial_id not in self.warm_judged:
            judged.insert(0, (warm_from, spared_zone, True))
        for rung_s, zone, past_warmup in judged:
            verdict = self.verdict(trial_id, trajectory, rung_s, zone)
            if verdict is None:
                continue
            if past_warmup:
                self.warm_judged.add(trial_id)
            else:
                trajectory.judged.add(rung_s)
            if not verdict:
                self.rung_zones[trial_id] = zone
                return rung_s
        return None

    def verdict(self, trial_id: str, trajectory: Trajectory, rung_s: float, zone: float
                ) -> bool | None:  # fmt: skip
        """:func:`~raybatch.tuning.rungs.passes` at the rung; where a trial behind is paused,
        before any trial has reached, one of fewer than eta curves at the rung waits there for
        the next trials (successive halving's rounds: the first trial to a rung would otherwise
        go on alone, a slow recipe with it, until it reached the target), unless it went on as
        the leader with nothing new to run (:meth:`Promotions.leads`): none will come."""
        others = self.others(trial_id)
        eta, horizon = self.rule.eta, self.rule.horizon_s
        low = lowest_mark(horizon, eta) if horizon else 0.0
        first = rung_s <= low * (1.0 + TOLERANCE)  # no curve shows the rung: first values do
        before = self.best_s is None  # a reach, and every curve judges
        if self.pause and before and not self.promotions.leads(trial_id):
            seen = sum(c.value_at(rung_s, first) is not None for c in others)
            if seen + 1 < eta and trajectory.value_at(rung_s) is not None:
                return False
        # At B a trial not there yet can at best tie: the zone passes it, not a top third of
        # curves that did not reach either (a real digits search ran 5 on to slack x B, vainly).
        top = not before and math.isclose(rung_s, self.best_s or 0.0)
        return passes(trajectory, rung_s, others, zone, math.inf if top else eta, first)

    def rung_zone(self, below_top: int) -> float:
        """The zone a rung ``below_top`` under the highest judges with: hedged, wider early
        (:func:`~raybatch.tuning.rungs.hedged_zone`); where a trial behind is paused, none but at
        ``B`` once measured (before, the hedge is in the promotion: :meth:`promotable`)."""
        assert self.rule.zone is not None
        if self.pause and not (below_top == 0 and self.best_s is not None):
            return 0.0
        return hedged_zone(self.rule.zone, self.rule.eta, below_top, self.rule.hedge)

    def judges_warmup(self) -> bool:
        """Whether a rung judges a trial still in its LR warmup: once ``B`` is measured (a ramp
        of a ninth of it is slow: ``docs/search.md``), or where a trial behind is paused (taken
        back once its ramp is over). Before, ``B`` is only a bound: every rung spares it."""
        return self.pause or self.best_s is not None

    def others(self, trial_id: str) -> list[Trajectory]:
        """The curves a trial is judged against: once a trial has reached, every other seen
        (a capped one's up to its stop); before, those running or paused beside it and those
        that ran their whole time cap short of the target (early curves cross: one stopped at a
        rung is left out; a real search once had all six trials stopped and none reached)."""
        ended = self.ended - self.ran_out if self.best_s is None else set()
        return [t for other, t in self.trajectories.items()
                if other != trial_id and other not in ended]  # fmt: skip

    def promotable(self, trial_id: str, hedged: bool = False) -> bool:
        """Whether the rung a paused trial was paused at passes it now, against every curve
        seen since: level with the best or in the top 1/eta (``hedged``: or within the zone
        that rung has, wider early; before a reach, not from the guess's top two rungs)."""
        at = self.promotions.paused[trial_id]
        trajectory = self.trajectories.get(trial_id)
        reached = self.best_s is not None
        if trajectory is None or (trial_id in self.promotions.yielded and not reached):
            return trajectory is None  # one that yielded goes on as the leader only
        zone = 0.0
        rungs = self.rungs()
        if hedged and rungs and reached and at < rungs[0] * (1.0 - TOLERANCE):
            return True  # paused below every rung there is now: judged at the lowest instead
        if hedged and self.warming.get(trial_id, 0.0) > at and len(rungs) > 1 and at < rungs[-2]:
            return True  # paused in its LR warmup early: judged once more, further on
        if hedged and trial_id not in self.promotions.guessed:
            return False  # paused once B was measured: ASHA's promotion only (promotion.py)
        if hedged and not reached and len(rungs) > 1 and at >= rungs[-2] * (1.0 - TOLERANCE):
            return False  # from the guess's top two rungs, the dearest: as the leader only
        if hedged and self.rule.zone is not None:
            top = rungs[-1] if rungs else at
            below_top = max(0, round(math.log(max(top / at, 1.0)) / math.log(self.rule.eta)))
            zone = hedged_zone(self.rule.zone, self.rule.eta, below_top, self.rule.hedge)
        return bool(self.verdict(trial_id, trajectory, at, zone))

    def level(self, trial_id: str) -> float:
        """A paused trial's level at its rung: ranked at equal time, not by how far it got."""
        trajectory, at = self.trajectories.get(trial_id), self.promotions.paused.get(trial_id)
        level = None if trajectory is None or at is None else trajectory.value_at(at)
        return -math.inf if level is None else float(level)


__all__ = ["RungJudge"]
