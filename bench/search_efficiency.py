"""Search efficiency on the simulated workload family: regret against compute, every peer
charged alike, the shipped decision code driven on a simulated clock.

One code path: only the training and its clock are simulated (:mod:`simulator`). The search is
:func:`simulate_search`: one trial at a time (a default search on one GPU) and two (on this
machine's two slots),
each trial's reports -- its evaluation marks (where the product's own cadence puts them:
:mod:`simulator`) and its heartbeats between them -- delivered in clock order across the
running trials to the shipped :class:`~raybatch.tuning.scheduler.CappingScheduler` (or a peer's
early-stopping rule), the suggestions from the shipped
:class:`~raybatch.tuning.searcher.RaybatchSearcher` built as the driver builds it (or from a peer's
sampler). A budget's figures are read off the first N trials of one run (in launch order).

Strategies:

- ``max_batch``: Lightning's power finder (double the batch from 2 until OOM, 3 steps a try)
  then one trial at the largest batch that fits, accumulation 1, the rule's LR;
- ``max_batch_lr_sweep``: the same finder, then the largest batch at LR multipliers 0.5, 1, 2
  and 4 of the rule's, two at a time under raybatch's capping (the strong simple baseline,
  capped alike);
- ``random``, ``optuna_tpe`` (Optuna's defaults: 10 random trials, independent TPE): capped
  as raybatch's trials are;
- ``asha`` / ``asha_tpe``: Ray Tune's ``ASHAScheduler`` rule with ``time_attr`` on training
  time (rungs at ``max_t / 3^k``, reduction factor 3) over random and TPE suggestions;
- ``hyperband``: Optuna's ``HyperbandPruner`` on training time (whole seconds) with TPE;
- ``raybatch``: the shipped searcher (the plan, the ladder from the time model -- measured
  inside each trial the searcher asks that reaches the target, the first kept, with the
  member's noise-scale error, its passes charged to that trial -- the pre-screen with the member's
  imperfect estimate and the 20% probe margin, then TPE) and the shipped capping scheduler
  (slack 1.2, equal-time rungs with the hedged 10 % zone and eta 3, trials beside each other
  judged before any incumbent);
- ablations: ``raybatch_no_model`` (the ladder without the time model), ``raybatch_no_fidelity``
  (no rungs: capping on the final time only), ``raybatch_no_plan`` (only the reference and the
  max batch seeded), ``raybatch_no_prescreen``.

Every strategy's pick is confirmed alike, by the shipped code (:func:`confirm`): the
:class:`~raybatch.tuning.confirmation.Race` of its two best on paired seeds (its search runs the
first pair, the challenger capped at 1.2x the leader) and the shipped selection
(:func:`~raybatch.results.selection.select_winner`). The confirmation is charged to every
strategy.

Per strategy and budget: regret (true time to target of the confirmed pick / the true optimum;
median and 90th percentile over seeds), compute (every simulated device second: each trial's
start-up and evaluations, the finder's steps, OOMs, the prior's measurement and the
confirmation; in seconds and in units of the grid optimum's time to target: "trainings"), OOM
crashes per search, and ``compute_to_regret_105``: the median compute, in trainings, of the
shortest prefix of the run whose confirmed pick has regret <= 1.05 (``None`` where fewer than
half the seeds get there).

Run: .venv/bin/python bench/search_efficiency.py   (writes bench/results/search_efficiency.json)
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
import sys
import time
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna

sys.path.insert(0, str(Path(__file__).parent))

from provenance import measured_at, write_result
from ray.tune.schedulers import TrialScheduler
from simulator import (
    ACCUMULATION,
    LR_MULTIPLIER,
    MEMBERS,
    MICRO,
    Member,
    SimulatedEstimator,
    sim_space,
    simulated_time_model,
)

from raybatch import keys
from raybatch.results.rows import TrialRow
from raybatch.results.selection import select_winner
from raybatch.status import TrialStatus, penalty
from raybatch.trial.cadence import heartbeat_for
from raybatch.tuning.confirmation import Race, RaceSearcher
from raybatch.tuning.gates import search_gates
from raybatch.tuning.options import SearchOptions
from raybatch.tuning.plan import Plan, search_plan
from raybatch.tuning.rungs import DEFAULT_ZONE, RungRule, Trajectory, guess_of_b
from raybatch.tuning.scheduler import CappingScheduler
from raybatch.tuning.searcher import RaybatchSearcher
from raybatch.tuning.seeding import (
    searched_knobs,
)
from raybatch.tuning.study import SearchStudy

RESULTS = Path(__file__).parent / "results" / "search_efficiency.json"
BUDGETS = (5, 10, 12, 20, 40, 80)
PREFIXES = (5, 8, 10, 12, 15, 20, 25, 30, 40, 60, 80)
STRATEGIES = ("max_batch", "max_batch_lr_sweep", "random", "optuna_tpe", "asha", "asha_tpe",
              "hyperband", "raybatch", "raybatch_no_model", "raybatch_no_fidelity",
              "raybatch_no_plan", "raybatch_no_prescreen")  # fmt: skip
SLACK = SearchOptions().slack
PROBE_MARGIN = SearchOptions().probe_margin
CONFIRM_TOP = SearchOptions().confirm_top
CONFIRM_SEEDS = SearchOptions().confirm_seeds
SLOTS = 2
"""Trials at once: what a default search runs on this machine's two cores (one CPU each)."""
SLOT_COUNTS = (1, 2)
"""The slot counts measured: one GPU (a default GPU search: one trial at a time), and two."""
SIM_SPACE = sim_space()
SWEEP = (0.5, 1.0, 2.0, 4.0)
ETA = 3

Trial = dict[str, Any]  # knobs + outcome + cost


def _outcome(member: Member, knobs: tuple[int, int, float], rng: random.Random,
             cap_s: float | None = None, stop: Any = None, rung_marks: Sequence[float] = (),
             level: float | None = None) -> Trial:  # fmt: skip
    micro, accumulation, multiplier = knobs
    run = member.run(micro, accumulation, multiplier, rng, cap_s, stop, rung_marks, level)
    return {"knobs": knobs, "warm_s": _warm_s(member, knobs), **run}


def _warm_s(member: Member, knobs: tuple[int, int, float]) -> float:
    """The training seconds the recipe's LR ramps up for: its warmup steps (the space's rule,
    as the product derives them) at the member's step time."""
    micro, accumulation, multiplier = knobs
    steps = _SPACE.derive(micro, accumulation, lr_multiplier=multiplier).warmup_steps
    return steps * member.step_time(micro, accumulation)


_SPACE = sim_space()


def _finder_cost(member: Member) -> float:
    """Lightning's power finder: 3 steps at each doubling from 2, then the step that OOMs."""
    cost, batch = 0.0, 2
    while batch <= 2**20:
        if not member.fits(batch):
            return cost + member.step_time(batch, 1)
        cost += 3 * member.step_time(batch, 1)
        batch *= 2
    return cost


# ---------------------------------------------------------------- the search, on a sim clock


class _Capping:
    """raybatch's capping: the shipped :class:`CappingScheduler`, built as the driver builds it
    for the member's time cap (:meth:`CappingScheduler.for_time_cap`: rungs tied to the cap /
    eta until a trial reaches) and fed each mark as Tune feeds it (``on_trial_result``, then
    ``on_trial_complete``)."""

    def __init__(self, zone: float | None, max_time_s: float, pause: bool = False,
                 **rule: Any) -> None:  # fmt: skip
        """``rule``: the rungs' other settings (``hedge``, ``eta``), where a rule varies."""
        # The target in the simulated metric's units (progress 1), as ``for_trainable`` reads
        # the trainable's.
        rule.setdefault("target", 1.0)
        self.scheduler = CappingScheduler.for_time_cap(
            max_time_s, None, slack=SLACK, pause=pause, rungs=RungRule(zone=zone, **rule)
        )
        self.warm_s: dict[str, float] = {}  # trial -> the training seconds its warmup lasts
        self.searcher: Any = None  # told of pauses, as Tune's searcher is (run_raybatch's)

    def launched(self, trial_id: str, warm_s: float) -> None:
        self.warm_s[trial_id] = warm_s

    def mark(self, trial_id: str, t: float, progress: float | None, beat: bool = False
             ) -> bool | str:  # fmt: skip
        reached = progress is not None and progress >= 1.0
        warming = t < self.warm_s.get(trial_id, 0.0)  # as raybatch's loop says it
        result = {keys.STATUS: "reached" if reached else "running", keys.TRAIN_S: t,
                  keys.METRIC: progress, keys.TIME_TO_TARGET_S: t if reached else None,
                  keys.HEARTBEAT: beat, keys.WARMING_UP: warming}  # fmt: skip
        trial = SimpleNamespace(trial_id=trial_id)
        decision = self.scheduler.on_trial_result(None, trial, result)
        if self.searcher is not None:  # then the searcher, as Tune's controller tells both
            self.searcher.on_trial_result(trial_id, result)
        if reached or decision == TrialScheduler.CONTINUE:
            return False
        if decision == TrialScheduler.PAUSE:
            if self.searcher is not None:  # as the scheduler tells Tune's searcher
                self.searcher.on_pause(trial_id)
            return "pause"
        return True

    def next_to_run(self, pending: bool, running: int) -> tuple[str | None, bool]:
        """As the scheduler's ``choose_trial_to_run`` decides (a chosen trial resumes)."""
        chosen, stop = self.scheduler.next_to_run(pending, running)
        if chosen is not None:
            self.scheduler.promotions.resumed(chosen)
            if self.searcher is not None:
                self.searcher.on_unpause(chosen)
        return chosen, stop

    def removed(self, trial_id: str) -> None:
        """A paused trial stopped for good (Tune's ``on_trial_remove``)."""
        self.scheduler.on_trial_remove(None, SimpleNamespace(trial_id=trial_id))

    def end(self, trial_id: str, reached_s: float | None) -> None:
        status = "reached" if reached_s is not None else "censored"
        result = {keys.STATUS: status, keys.TIME_TO_TARGET_S: reached_s}
        self.scheduler.on_trial_complete(None, SimpleNamespace(trial_id=trial_id), result)


class _AshaOnTime:
    """Ray Tune's ASHA rule with ``time_attr`` on training time: rungs at ``max_t / 3^k``
    seconds, reduction factor 3; a trial below the top third recorded at a rung stops."""

    def __init__(self, max_t: float) -> None:
        self.rungs = [max_t / ETA**k for k in (4, 3, 2, 1)]
        self.recorded: dict[float, list[float]] = {r: [] for r in self.rungs}
        self.passed: dict[str, int] = {}

    def mark(self, trial_id: str, t: float, progress: float | None, beat: bool = False) -> bool:
        progress = progress or 0.0
        i = self.passed.get(trial_id, 0)
        while i < len(self.rungs) and t >= self.rungs[i]:
            rung = self.recorded[self.rungs[i]]
            rung.append(progress)
            i += 1
            self.passed[trial_id] = i
            ordered = sorted(rung)
            cutoff = ordered[min(len(ordered) - 1, int((1 - 1 / ETA) * len(ordered)))]
            if len(rung) > 1 and progress < cutoff and progress < 1.0:
                return True
        return False

    def end(self, trial_id: str, reached_s: float | None) -> None:
        return None


class _HyperbandOnTime:
    """Optuna's HyperbandPruner over TPE, reported on training time (whole seconds)."""

    def __init__(self, trials: dict[str, optuna.Trial]) -> None:
        self.trials = trials

    def mark(self, trial_id: str, t: float, progress: float | None, beat: bool = False) -> bool:
        if progress is None:
            return False
        trial = self.trials[trial_id]
        trial.report(progress, max(int(t), 1))
        return progress < 1.0 and bool(trial.should_prune())

    def end(self, trial_id: str, reached_s: float | None) -> None:
        return None


def simulate_search(member: Member, rng: random.Random, n: int,
                    suggest: Callable[[str], tuple[int, int, float] | None],
                    tell: Callable[[str, Trial], None], rule: Any, slots: int = SLOTS,
                    rung_marks: Mapping[str, Sequence[float]] | None = None,
                    ) -> list[Trial]:  # fmt: skip
    """``n`` trials, ``slots`` at a time, on a simulated clock: each trial's marks arrive in
    clock order across the running trials, and ``rule`` (the capping scheduler, or a peer's
    early-stopping rule) sees them as Tune's scheduler would, beside its neighbours. Returns the
    trials in launch order, each with what it held its device for (``cost``). ``rung_marks``:
    the training times each trial also evaluates at, as its config asks (filled by
    ``suggest``)."""
    clock = 0.0
    running: dict[str, dict[str, Any]] = {}
    paused: dict[str, dict[str, Any]] = {}
    trials: dict[str, Trial] = {}
    order: list[str] = []
    pending: list[tuple[str, tuple[int, int, float]]] = []  # suggested, not yet run (Tune's queue)
    pauses = hasattr(rule, "next_to_run")
    if pauses:
        rule.scheduler.slots = slots  # as the driver tells it

    def launch(knobs: tuple[int, int, float], trial_id: str) -> None:
        marks = (rung_marks or {}).get(trial_id, ())
        full = _outcome(member, knobs, rng, rung_marks=marks)  # uncapped; the rule decides
        order.append(trial_id)
        if hasattr(rule, "launched"):  # the capping scheduler reads the warmup from reports
            rule.launched(trial_id, full["warm_s"])
        running[trial_id] = {"knobs": knobs, "full": full, "i": 0, "start": clock,
                             "reports": _reports(member, full), "starts": 1}  # fmt: skip

    def ask() -> None:
        """A suggestion asked for while none waits (Tune keeps one pending a slot)."""
        if not pending and len(order) + len(pending) < n:
            trial_id = f"t{len(order)}"
            knobs = suggest(trial_id)
            if knobs is not None:
                pending.append((trial_id, knobs))

    def fill() -> None:
        """Free slots get work as Tune gives it: a suggestion is asked for while none waits,
        then the scheduler may choose a paused trial over it (a promotion), or stop the paused
        ones no rung will pass; otherwise the suggestion runs."""
        while len(running) < slots:
            ask()
            if pauses and paused:
                chosen, stop = rule.next_to_run(bool(pending), len(running))
                if stop:
                    for trial_id in list(paused):
                        rule.removed(trial_id)
                        run = paused.pop(trial_id)
                        running[trial_id] = run
                        finish(trial_id, "capped", run["paused_at"], None)
                    continue
                if chosen is not None:
                    run = paused.pop(chosen)
                    run["start"] = clock - run["paused_at"]  # a start-up, then on from its save
                    run["starts"] += 1
                    running[chosen] = run
                    continue
            if not pending:
                return
            launch(pending[0][1], pending.pop(0)[0])

    def finish(trial_id: str, status: str, train: float, reached_s: float | None) -> None:
        run = running.pop(trial_id)
        full = run["full"]
        marks = [m for m in full["marks"] if m[0] <= train]
        cost = full["cost"] if status == full["status"] else (
            member.held_before_training() + train + len(marks) * member.eval_cost())  # fmt: skip
        cost += (run["starts"] - 1) * member.held_before_training()  # each resume starts up
        trial = {"knobs": run["knobs"], "status": status, "time": reached_s, "cost": cost,
                 "train": train, "marks": marks}  # fmt: skip
        trials[trial_id] = trial
        rule.end(trial_id, reached_s)
        tell(trial_id, trial)

    fill()
    while running:

        def next_at(item: tuple[str, dict[str, Any]]) -> float:
            run = item[1]
            reports = run["reports"]
            if run["i"] < len(reports):
                return run["start"] + member.held_before_training() + reports[run["i"]][0]
            return run["start"] + run["full"]["cost"]

        trial_id, run = min(running.items(), key=next_at)
        clock = next_at((trial_id, run))
        reports = run["reports"]
        if run["i"] < len(reports):
            t, progress, beat = reports[run["i"]]
            run["i"] += 1
            verdict = False
            if progress is not None and progress >= 1.0:
                rule.mark(trial_id, t, progress)
                finish(trial_id, "reached", t, t)
            elif (verdict := rule.mark(trial_id, t, progress, beat)) == "pause":
                run["paused_at"] = t
                paused[trial_id] = running.pop(trial_id)
            elif verdict:
                finish(trial_id, "capped", t, None)
            else:
                continue
        else:  # ran out of marks without reaching: censored at its cap, or oom / diverged
            finish(trial_id, run["full"]["status"], run["full"]["train"], None)
        fill()
    return [trials[i] for i in order]


def _reports(member: Member, full: Trial) -> list[tuple[float, float | None, bool]]:
    """What a trial reports, in order: its evaluation marks, and between them a heartbeat at
    least every :func:`~raybatch.trial.reporting.heartbeat_for` its cap, carrying the last
    mark's value (as :class:`~raybatch.trial.reporting.TrialReporter` does), up to where the
    run ended."""
    marks = full["marks"]
    end = marks[-1][0] if full["status"] == "reached" else full["train"]
    beat = heartbeat_for(member.max_time_s)
    out: list[tuple[float, float | None, bool]] = []
    last: float | None = None
    i, t = 0, 0.0
    while True:
        due = t + beat
        if i < len(marks) and marks[i][0] <= due:
            t, last = marks[i]
            out.append((t, last, False))
            i += 1
            if last >= 1.0:
                return out
        elif due < end:
            t = due
            out.append((t, last, True))
        else:
            return out


def run_max_batch(member: Member, rng: random.Random, n: int, sweep: tuple[float, ...] = (1.0,),
                  slots: int = SLOTS) -> list[Trial]:  # fmt: skip
    """Lightning's power finder, then the largest batch that fits at the rule's LR (one trial,
    no capping) or, ``sweep``, at each LR of the sweep, capped and run as raybatch runs its
    trials (two at a time, the same capping scheduler)."""
    largest = member.max_fitting_micro()
    points = [(largest, 1, m) for m in sweep]
    rule = _Capping(DEFAULT_ZONE if len(sweep) > 1 else None, member.max_time_s)
    trials = simulate_search(member, rng, len(points), lambda i: points[int(i[1:])]
                             if int(i[1:]) < len(points) else None, lambda i, t: None,
                             rule, slots=slots if len(sweep) > 1 else 1)  # fmt: skip
    trials[0]["cost"] += _finder_cost(member)
    return trials


def _random_knobs(rng: random.Random) -> tuple[int, int, float]:
    low, high = (math.log(v) for v in LR_MULTIPLIER)
    return rng.choice(MICRO), rng.choice(ACCUMULATION), math.exp(rng.uniform(low, high))


def _tpe_knobs(t: optuna.Trial) -> tuple[int, int, float]:
    return (t.suggest_categorical(keys.MICRO_BATCH_SIZE, MICRO),
            t.suggest_categorical(keys.ACCUMULATION_STEPS, ACCUMULATION),
            t.suggest_float(keys.LR_MULTIPLIER, *LR_MULTIPLIER, log=True))  # fmt: skip


def run_random(member: Member, rng: random.Random, n: int, asha: bool = False,
               slots: int = SLOTS) -> list[Trial]:  # fmt: skip
    """Random search, capped as raybatch is, or under ASHA on training time."""
    rule = _AshaOnTime(member.max_time_s) if asha else _Capping(DEFAULT_ZONE, member.max_time_s)
    return simulate_search(member, rng, n, lambda _: _random_knobs(rng), lambda i, t: None, rule,
                           slots)  # fmt: skip


def run_tpe(member: Member, rng: random.Random, n: int, seed: int, early: str | None = None,
            slots: int = SLOTS) -> list[Trial]:  # fmt: skip
    """TPE as Optuna's defaults give it, capped as raybatch is; ``early``: ``asha`` or
    ``hyperband`` on training time instead."""
    # A heartbeat and a mark within the same whole second report the same step: Optuna keeps
    # the first and warns; the pruner's decision is unchanged.
    warnings.filterwarnings("ignore", message="The reported value is ignored")
    pruner = None
    if early == "hyperband":
        pruner = optuna.pruners.HyperbandPruner(
            min_resource=max(int(member.max_time_s / ETA**4), 1),
            max_resource=int(member.max_time_s), reduction_factor=ETA,
        )  # fmt: skip
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed), pruner=pruner)
    asked: dict[str, optuna.Trial] = {}
    rule: Any = {"asha": _AshaOnTime(member.max_time_s),
                 "hyperband": _HyperbandOnTime(asked)}.get(early or "")  # fmt: skip
    rule = rule or _Capping(DEFAULT_ZONE, member.max_time_s)

    def suggest(trial_id: str) -> tuple[int, int, float]:
        asked[trial_id] = study.ask()
        return _tpe_knobs(asked[trial_id])

    def tell(trial_id: str, trial: Trial) -> None:
        if trial["status"] == "capped" and early == "hyperband":
            study.tell(asked[trial_id], state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(
                asked[trial_id],
                trial["time"] if trial["time"] is not None else penalty(member.max_time_s),
            )

    return simulate_search(member, rng, n, suggest, tell, rule, slots)


def _searcher(member: Member, seed: int, prescreen: bool, plan: bool, model: bool
              ) -> RaybatchSearcher:  # fmt: skip
    """raybatch's searcher for ``member`` as the driver builds it (the time model measured in
    the trials the searcher asks, :func:`run_raybatch`)."""
    space = sim_space()
    # Without the pre-screen there is no estimate anywhere: the opening's "largest batch" is
    # the space's largest, and only OOMs (remembered, replaced) teach the search what fits.
    estimator = SimulatedEstimator(member) if prescreen else None
    # The driver's own plan (search_plan); without one, only the reference and the baseline.
    shipped, baseline, reference = search_plan(
        space, estimator, int(member.budget), PROBE_MARGIN, measure=model,
        horizon_s=guess_of_b(member.max_time_s),
    )  # fmt: skip
    if not plan:
        points = [searched_knobs(space, p) for p in (reference, baseline) if p is not None]
        shipped = Plan(space, points, None, baseline)
    searcher = RaybatchSearcher(
        space, penalty=penalty(member.max_time_s),
        study=SearchStudy(None, f"sim-{member.name}-{seed}", seed),
        plan=shipped,
        gates=search_gates(estimator, int(member.budget), PROBE_MARGIN if prescreen else 0.0),
    )  # fmt: skip
    return searcher


_TUNE_STATUS = {"oom": "infeasible_memory", "capped": "running"}
"""A simulated trial's end as the searcher reads Tune's last result (a capped trial's last
report says ``running``: the scheduler stopped it)."""


def run_raybatch(member: Member, rng: random.Random, n: int, seed: int, prescreen: bool = True,
                 plan: bool = True, model: bool = True, fidelity: bool = True,
                 slots: int = SLOTS) -> list[Trial]:  # fmt: skip
    """The shipped searcher (plan, pre-screen, ladder, TPE) and the shipped capping scheduler,
    ``slots`` trials at a time (one GPU: one; this machine's two slots: two)."""
    searcher = _searcher(member, seed, prescreen, plan, model)
    measuring: set[str] = set()
    rung_marks: dict[str, Sequence[float]] = {}

    def suggest(trial_id: str) -> tuple[int, int, float] | None:
        config = searcher.suggest(trial_id)
        if not isinstance(config, dict):
            return None
        if config.get(keys.MEASURE_TIME_MODEL):
            measuring.add(trial_id)
        rung_marks[trial_id] = config.get(keys.RUNG_MARKS) or ()
        return (config[keys.MICRO_BATCH_SIZE], config[keys.ACCUMULATION_STEPS],
                config[keys.LR_MULTIPLIER])  # fmt: skip

    def tell(trial_id: str, trial: Trial) -> None:
        status = _TUNE_STATUS.get(trial["status"], trial["status"])
        result = {keys.STATUS: status, keys.TIME_TO_TARGET_S: trial["time"],
                  keys.OBJECTIVE: trial["time"], keys.ELAPSED_S: trial["cost"]}  # fmt: skip
        if trial_id in measuring and trial["status"] == "reached":  # measured at the target
            trial["cost"] += member.measure_cost_s(trial["knobs"][0])
            result[keys.TIME_MODEL] = json.dumps(simulated_time_model(member).to_dict())
        searcher.on_trial_complete(trial_id, result)
        trial["prescreened"] = len(searcher.prescreened)

    # As the driver builds it: trials behind at a rung paused (SearchOptions().pause).
    rule = _Capping(DEFAULT_ZONE if fidelity else None, member.max_time_s,
                    pause=SearchOptions().pause)  # fmt: skip
    rule.searcher = searcher
    return simulate_search(member, rng, n, suggest, tell, rule, slots, rung_marks)


def run(strategy: str, member: Member, seed: int, n: int, slots: int = SLOTS) -> list[Trial]:
    rng = random.Random(seed * 7919 + zlib.crc32(member.name.encode()) % 1000)  # stable
    if strategy.startswith("max_batch"):
        return run_max_batch(member, rng, n, SWEEP if strategy.endswith("sweep") else (1.0,),
                             slots)  # fmt: skip
    if strategy in ("random", "asha"):
        return run_random(member, rng, n, asha=strategy == "asha", slots=slots)
    if strategy in ("optuna_tpe", "asha_tpe", "hyperband"):
        early = {"asha_tpe": "asha", "hyperband": "hyperband"}.get(strategy)
        return run_tpe(member, rng, n, seed, early, slots)
    return run_raybatch(member, rng, n, seed, prescreen=strategy != "raybatch_no_prescreen",
                        plan=strategy != "raybatch_no_plan",
                        model=strategy != "raybatch_no_model",
                        fidelity=strategy != "raybatch_no_fidelity", slots=slots)  # fmt: skip


# ---------------------------------------------------------------- the confirmation, shipped

_ROW_STATUS = {"reached": TrialStatus.REACHED, "capped": TrialStatus.CAPPED,
               "censored": TrialStatus.CENSORED, "oom": TrialStatus.INFEASIBLE_MEMORY,
               "diverged": TrialStatus.DIVERGED}  # fmt: skip


def _row(knobs: tuple[int, int, float], phase: str, name: str, trial: Trial, seed: int
         ) -> TrialRow:  # fmt: skip
    micro, accumulation, multiplier = knobs
    return TrialRow.of(
        SIM_SPACE.derive(micro, accumulation, 1, multiplier), phase, name,
        _ROW_STATUS[trial["status"]], time_to_target_s=trial["time"], train_s=trial["train"],
        held_s=trial["cost"], seed=seed,
    )  # fmt: skip


def confirm(member: Member, trials: list[Trial], rng: random.Random
            ) -> tuple[tuple[int, int, float] | None, float]:  # fmt: skip
    """Every strategy's confirmation: the shipped :class:`~raybatch.tuning.confirmation.Race` over
    its trials' rows, run by the shipped :class:`~raybatch.tuning.confirmation.RaceSearcher` (its
    runs in order) with the shipped :class:`CappingScheduler` capping each challenger at its
    leader's time on the same seed (its ``race.cap_s`` once the leader ended), and the shipped
    selection. Returns the pick and what the confirmation runs held their devices for."""
    rows = [_row(t["knobs"], keys.PHASE_SEARCH, f"s{i}", t, 0) for i, t in enumerate(trials)]
    curves = {}  # as the search's phases keep them: each trial's marks (progress 1: target)
    for i, t in enumerate(trials):
        curves[f"s{i}"] = curve = Trajectory()
        for train_s, progress in t.get("marks", []):
            curve.add(train_s, progress)
    race = Race(rows, top=CONFIRM_TOP, seeds=list(range(1, CONFIRM_SEEDS + 1)), slack=SLACK,
                curves=curves)  # fmt: skip
    scheduler = CappingScheduler(SLACK, rungs=RungRule(zone=None))
    searcher = RaceSearcher(race, penalty=penalty(member.max_time_s))  # PAR-10
    cost = 0.0
    for n in itertools.count():
        config = searcher.suggest(f"c{n}")
        if not isinstance(config, dict):  # FINISHED: the race is decided
            break
        knobs = (config[keys.MICRO_BATCH_SIZE], config[keys.ACCUMULATION_STEPS],
                 config[keys.LR_MULTIPLIER])  # fmt: skip
        ran = _outcome(member, knobs, rng, cap_s=scheduler.race.cap_s(config[keys.SEED]),
                       level=config.get(keys.MEET_LEVEL))  # fmt: skip
        cost += ran["cost"]
        result = {keys.TRIAL_ID: f"c{n}", keys.STATUS: _ROW_STATUS[ran["status"]].value,
                  keys.TIME_TO_TARGET_S: ran["time"], keys.TRAIN_S: ran["train"],
                  keys.HELD_S: ran["cost"]}  # fmt: skip
        scheduler.on_trial_complete(None, SimpleNamespace(trial_id=f"c{n}", config=config), result)
        searcher.on_trial_complete(f"c{n}", result)
    winner = select_winner(race.rows, confirmed=True)
    if winner is None:
        return None, cost
    first = winner.runs[0]
    return (first.micro_batch_size, first.accumulation_steps, first.lr_multiplier), cost


def score(member: Member, trials: list[Trial], optimum: float, rng: random.Random
          ) -> dict[str, float]:  # fmt: skip
    """Regret of the confirmed pick, compute (every device second, confirmation included, in
    seconds and in trainings of the grid's optimum) and OOM crashes."""
    chosen, extra = confirm(member, trials, rng)
    cost = sum(t["cost"] for t in trials) + extra
    train = sum(t.get("train", 0.0) for t in trials)
    regret = member.true_time(*chosen) / optimum if chosen is not None else math.inf
    if math.isinf(regret):
        regret = penalty(member.max_time_s) / optimum  # PAR-10: nothing usable was found
    return {
        "regret": regret,
        "compute": cost,
        "compute_train": train,
        "oom_crashes": sum(1 for t in trials if t["status"] == "oom"),
        "prescreened_out": trials[-1].get("prescreened", 0) if trials else 0,
    }


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


Search = Callable[[int, int], list[Trial]]
"""A strategy's search of ``n`` trials on ``seed``: its trials in launch order."""


def pauses(strategy: str) -> bool:
    """Whether the strategy's trials may pause: the shipped search's, as it ships."""
    return strategy.startswith("raybatch") and SearchOptions().pause


def searches(strategy: str, member: Member, seeds: int, longest: int, slots: int) -> Search:
    """Each seed's search of ``n`` trials: the first ``n`` of its longest search where trials
    end for good as they go; a search of ``n`` trials of its own where they pause (once nothing
    new waits, a paused trial goes on: the first ``n`` of a longer search never show that, its
    slots taken by the trials after them). Each search runs once, when first asked for."""
    full = [run(strategy, member, seed, longest, slots) for seed in range(seeds)]
    own: dict[tuple[int, int], list[Trial]] = {}

    def search(n: int, seed: int) -> list[Trial]:
        if n >= longest or not pauses(strategy):
            return full[seed][:n]
        if (n, seed) not in own:
            own[n, seed] = run(strategy, member, seed, n, slots)
        return own[n, seed]

    return search


def _to_regret(member: Member, search: Search, longest: int, optimum: float, seed: int
               ) -> float:  # fmt: skip
    """Compute (in trainings) of the shortest search whose confirmed pick has regret <= 1.05
    (searches of :data:`PREFIXES` trials)."""
    for n in [p for p in PREFIXES if p <= longest] or [longest]:
        s = score(member, search(n, seed), optimum, random.Random(seed * 31 + n))
        if s["regret"] <= 1.05:
            return s["compute"] / optimum
    return math.inf


def _rows(member: Member, strategy: str, search: Search, longest: int, budgets: tuple[int, ...],
          seeds: int, slots: int) -> list[dict[str, Any]]:  # fmt: skip
    optimum, where = member.optimum()
    to_regret = statistics.median(_to_regret(member, search, longest, optimum, s)
                                  for s in range(seeds))  # fmt: skip
    rows = []
    for budget in budgets:
        scores = [score(member, search(budget, seed), optimum, random.Random(seed * 31 + budget))
                  for seed in range(seeds)]  # fmt: skip
        compute = statistics.median(s["compute"] for s in scores)
        rows.append({
            "workload": member.name, "strategy": strategy, "slots": slots,
            "trials": len(search(budget, 0)), "budget": budget, "seeds": seeds,
            "median_regret": statistics.median(s["regret"] for s in scores),
            "p90_regret": _p90([s["regret"] for s in scores]),
            "compute_median": compute, "compute_trainings": compute / optimum,
            "compute_to_regret_105": None if math.isinf(to_regret) else to_regret,
            "oom_median": statistics.median(s["oom_crashes"] for s in scores),
            "oom_p90": _p90([s["oom_crashes"] for s in scores]),
            "estimator_error": member.estimate_error,
            "prescreened_out": statistics.median(s["prescreened_out"] for s in scores),
            "optimum_s": optimum, "optimum_at": list(where),
        })  # fmt: skip
    return rows


def main(
    seeds: int = 20,
    budgets: tuple[int, ...] = BUDGETS,
    members: list[Member] | None = None,
    strategies: tuple[str, ...] = STRATEGIES,
    out: Path = RESULTS,
    slot_counts: tuple[int, ...] = SLOT_COUNTS,
) -> list[dict[str, Any]]:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rows: list[dict[str, Any]] = []
    at = measured_at()
    start = time.perf_counter()
    for member, slots, strategy in itertools.product(members or MEMBERS, slot_counts, strategies):
        search = searches(strategy, member, seeds, max(budgets), slots)
        rows += _rows(member, strategy, search, max(budgets), budgets, seeds, slots)
        last = next(r for r in reversed(rows) if r["budget"] == 20 or r is rows[-1])
        print(f"{member.name:>22} {slots} slot(s) {strategy:>22}: median regret"
              f" {last['median_regret']:.3f} at {last['budget']} trials,"
              f" {last['compute_trainings']:.1f} trainings,"
              f" to 1.05: {last['compute_to_regret_105']}", flush=True)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    members_info = {
        m.name: {"best_lr_multiplier": m.best_multiplier, "estimator_error": m.estimate_error,
                 "noise_scale_error": m.noise_scale_error,
                 "follows_model": m.steps_rise_past is None and m.lr_batch_exponent == 0}
        for m in members or MEMBERS
    }  # fmt: skip
    write_result(out, {"benchmark": "search_efficiency", "seeds": seeds,
                       "slot_counts": list(slot_counts),
                               "strategies": list(strategies), "confirmation": "the shipped Race,"
                               " paired seeds, the search run the first pair, every strategy",
                               "confirmation_charged": True, "members": members_info,
                               "elapsed_s": time.perf_counter() - start, "rows": rows},
                 at)  # fmt: skip
    return rows


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    """Median regret against median compute (trainings), one panel per member, one line per
    strategy through its budgets: the peers compared at equal compute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    members = list(dict.fromkeys(r["workload"] for r in rows))
    cols = 4
    fig, axes = plt.subplots(math.ceil(len(members) / cols), cols, figsize=(14, 3.2 * math.ceil(
        len(members) / cols)), squeeze=False)  # fmt: skip
    for ax, member in zip(axes.flat, members, strict=False):
        for strategy in dict.fromkeys(r["strategy"] for r in rows):
            mine = sorted((r for r in rows if (r["workload"], r["strategy"]) == (member, strategy)),
                          key=lambda r: r["budget"])  # fmt: skip
            style = "-o" if strategy == "raybatch" else ("--" if "raybatch" in strategy else ":.")
            ax.plot([r["compute_trainings"] for r in mine], [r["median_regret"] for r in mine],
                    style, label=strategy, linewidth=2.2 if strategy == "raybatch" else 1.0,
                    markersize=3)  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(member, fontsize=9)
        ax.set_xlabel("compute (trainings of the optimum)", fontsize=8)
        ax.set_ylabel("median regret", fontsize=8)
    for ax in list(axes.flat)[len(members) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    plot(main(), Path(__file__).parent.parent / "docs" / "search_efficiency.png")
