"""The searcher's logic, driven directly (suggest -> complete) as Ray Tune's own tests do."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path
from typing import Any

import optuna
import pytest

import raybatch
from raybatch import keys
from raybatch.examples.digits import DigitsWorkload
from raybatch.memory.estimator import MemoryEstimator
from raybatch.memory.prescreen import RanOut
from raybatch.space.config import TrialConfig
from raybatch.space.search_space import SearchSpace
from raybatch.status import TrialStatus, final_status
from raybatch.trial.settings import parts_of
from raybatch.tuning import gates as gates_module
from raybatch.tuning import screen as screen_module
from raybatch.tuning.gates import (
    LearnedOutOfMemory,
    MemoryFits,
    for_settings,
    gate_of,
    search_gates,
)
from raybatch.tuning.plan import Plan
from raybatch.tuning.progress import LOGGER
from raybatch.tuning.searcher import RaybatchSearcher
from raybatch.tuning.seeding import max_batch_point, reference_point
from raybatch.tuning.sessions import sessions_recorded
from raybatch.tuning.study import REASON_ATTR, STATUS_ATTR, SearchStudy, status_of
from raybatch.tuning.study_file import close_unrun

PRESCREENED_OUT = TrialStatus.PRESCREENED_OUT.value

SPACE = raybatch.load_space("digits_cnn_sgd")


def _searcher(
    tmp_path: Path,
    budget: int | None = None,
    penalty: float = 600.0,
    *,
    space: SearchSpace = SPACE,
    estimator: MemoryEstimator | None = None,
    points_to_evaluate: list[dict[str, Any]] | None = None,
    ladder: Any = None,
    baseline: dict[str, Any] | None = None,
    probe_margin: float = 0.0,
    seed: int = 0,
    pack_gpus: bool = False,
    data_parallel_gpus: bool | None = None,
    db: str = "optuna.db",
) -> RaybatchSearcher:
    """A searcher composed as the driver composes it: a trainable's settings (the budget, the
    data-parallel workers' kind, the time cap whose 10x is the penalty) read by
    :func:`~raybatch.tuning.gates.for_settings`, the driver's own function."""
    if budget is not None and estimator is None:
        estimator = MemoryEstimator(DigitsWorkload(), SPACE.reference_config(), anchors=(16, 256))
    fn = raybatch.trainable(
        DigitsWorkload(), space, 0.9, max_time_s=penalty / 10, gpu_budget_bytes=budget,
        data_parallel_gpus=data_parallel_gpus,
    )  # fmt: skip
    settings = parts_of(fn).settings
    gates, devices = for_settings(settings, estimator, probe_margin, packed=pack_gpus)
    return RaybatchSearcher(
        space,
        penalty=settings.penalty,
        study=SearchStudy(f"sqlite:///{tmp_path / db}", "t", seed),
        plan=Plan(space, points_to_evaluate or [], ladder, baseline),
        gates=gates,
        devices=devices,
    )


def _out_of_memory(searcher: RaybatchSearcher) -> list[RanOut]:
    """What the searcher learnt ran out of memory (its gate's record)."""
    gate = gate_of(searcher.gates, LearnedOutOfMemory)
    assert isinstance(gate, LearnedOutOfMemory)
    return gate.out_of_memory


def _result(status: str, ttt: float | None = None) -> dict[str, Any]:
    return {keys.STATUS: status, keys.TIME_TO_TARGET_S: ttt,
            keys.OBJECTIVE: ttt if ttt is not None else 600.0}  # fmt: skip


def test_suggestions_are_coupled_recipes_recorded_in_the_study(tmp_path: Path) -> None:
    searcher = _searcher(tmp_path)
    for i in range(5):
        config = searcher.suggest(f"t{i}")
        assert config is not None
        assert raybatch.TrialConfig.from_dict(config) == SPACE.derive_from(config)
        searcher.on_trial_complete(f"t{i}", _result("reached", 1.0 + i))
    trials = searcher.study.trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 5
    assert [t.value for t in trials] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert all(t.user_attrs[STATUS_ATTR] == "reached" for t in trials)


def test_evaluations_are_the_studys_learning_curves_and_heartbeats_are_not(tmp_path: Path) -> None:
    """Each evaluation's target metric is the Optuna trial's intermediate value at its samples
    seen (optuna-dashboard draws them); a heartbeat repeats the last value and is not kept, nor
    a step that is not past the last (a trial run again restarts its count)."""
    searcher = _searcher(tmp_path)
    assert searcher.suggest("t0") is not None

    def report(metric: float, samples: int, heartbeat: bool = False) -> None:
        searcher.on_trial_result("t0", {keys.METRIC: metric, keys.SAMPLES_SEEN: samples,
                                        keys.HEARTBEAT: heartbeat})  # fmt: skip

    report(0.5, 512)
    report(0.5, 700, heartbeat=True)
    report(0.8, 1024)
    report(0.1, 256)  # a restart's first evaluation
    report(0.97, 1536)
    searcher.on_trial_complete("t0", _result("reached", 2.0))
    (trial,) = searcher.study.trials
    assert trial.intermediate_values == {512: 0.5, 1024: 0.8, 1536: 0.97}
    assert trial.state == optuna.trial.TrialState.COMPLETE and trial.value == 2.0


def test_reference_and_max_batch_baseline_are_evaluated_first(tmp_path: Path) -> None:
    reference = reference_point(SPACE)
    baseline = max_batch_point(SPACE, lambda recipe: True)
    assert reference == {"micro_batch_size": 64, "accumulation_steps": 1, "world_size": 1}
    assert baseline == {"micro_batch_size": 256, "accumulation_steps": 1, "world_size": 1}
    seeds = [{k: v for k, v in p.items() if k != "world_size"} | {"lr_multiplier": 1.0}
             for p in (reference, baseline)]  # fmt: skip
    searcher = _searcher(tmp_path, points_to_evaluate=seeds)
    first, second = searcher.suggest("a"), searcher.suggest("b")
    assert first is not None and second is not None
    assert (first["micro_batch_size"], first["lr"]) == (64, 0.025)
    assert (second["micro_batch_size"], second["accumulation_steps"]) == (256, 1)


def test_suggestions_over_the_budget_are_told_infeasible_and_never_launched(
    tmp_path: Path,
) -> None:
    estimator = MemoryEstimator(DigitsWorkload(), SPACE.reference_config(), anchors=(16, 256))
    # Micro batches up to 64 fit at any accumulation (which keeps gradients alive), above not.
    budget = estimator.predict(SPACE.derive(64, 4))
    assert estimator.predict(SPACE.derive(128, 1)) > budget
    searcher = _searcher(tmp_path, budget=budget)
    launched = []
    for i in range(12):
        config = searcher.suggest(f"t{i}")
        assert config is not None
        launched.append(config["micro_batch_size"])
        searcher.on_trial_complete(f"t{i}", _result("reached", 1.0))
    assert max(launched) <= 64
    assert searcher.prescreened and all(
        p.params["micro_batch_size"] > 64 for p in searcher.prescreened
    )
    # Optuna was told: each rejection is a completed trial with a positive constraint.
    rejected = [
        t for t in searcher.study.trials if t.user_attrs.get(STATUS_ATTR) == PRESCREENED_OUT
    ]
    assert len(rejected) == len(searcher.prescreened)
    assert all(t.constraints["memory"] > 0 and t.value == 600.0 for t in rejected)
    launched_trials = [
        t for t in searcher.study.trials if t.user_attrs.get(STATUS_ATTR) == "reached"
    ]
    assert all(t.constraints["memory"] == 0 for t in launched_trials)


def test_prescreened_rows_carry_the_recipes_the_searcher_derived_not_derived_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raybatch.tuning.phases import prescreened_rows

    estimator = MemoryEstimator(DigitsWorkload(), SPACE.reference_config(), anchors=(16, 256))
    searcher = _searcher(tmp_path, budget=estimator.predict(SPACE.derive(64, 4)))
    for i in range(12):
        assert searcher.suggest(f"t{i}") is not None
        searcher.on_trial_complete(f"t{i}", _result("reached", 1.0))
    expected = [p.recipe for p in searcher.prescreened]

    def derived_again(*args: Any, **kw: Any) -> None:
        raise AssertionError("a pre-screened recipe was derived a second time")

    monkeypatch.setattr(SearchSpace, "derive", derived_again)
    rows = prescreened_rows(searcher.record)  # read back from the study, as after a resume
    assert rows and [r.config for r in rows] == expected
    assert all(r.status is TrialStatus.PRESCREENED_OUT and r.reason for r in rows)


def test_the_sampler_learns_the_infeasible_region(tmp_path: Path) -> None:
    """Told as infeasible, rejected regions are proposed less often than by chance.

    Two of the five micro-batch choices (128, 256) do not fit, so a sampler that learned
    nothing would propose them 40% of the time. Every launched trial scores 1.0 and the
    penalty a rejected point is told is 1.0 too, so the objective cannot tell them apart:
    only the constraint can teach TPE to avoid them. Pooled over four seeds (the last 20
    suggestions of each), the bar of 25% is one a sampler proposing at chance clears with a
    probability of about 0.3% (binomial, 80 draws at 0.4); measured, TPE proposes them 20-25%
    of the time per seed, 21% over these four, and 32.5% with the constraint switched off
    (``Study.reject`` not setting it), which fails this test.
    """
    estimator = MemoryEstimator(DigitsWorkload(), SPACE.reference_config(), anchors=(16, 256))
    budget = estimator.predict(SPACE.derive(64, 4))
    late_rejections = 0
    for seed in range(4):
        (tmp_path / str(seed)).mkdir()
        searcher = _searcher(tmp_path / str(seed), budget=budget, seed=seed, penalty=1.0)
        for i in range(40):
            searcher.suggest(f"t{i}")
            searcher.on_trial_complete(f"t{i}", _result("reached", 1.0))
        asked = len(searcher.study.trials)
        late_rejections += sum(p.number >= asked - 20 for p in searcher.prescreened)
    assert late_rejections / 80 < 0.25, late_rejections


def test_a_real_oom_is_told_infeasible_and_never_launched_again(tmp_path: Path) -> None:
    """No estimate at all here: only the OOM of a launched trial can teach the searcher."""
    searcher = _searcher(tmp_path, points_to_evaluate=[
        {"micro_batch_size": 128, "accumulation_steps": 2, "lr_multiplier": 1.0}])  # fmt: skip
    first = searcher.suggest("oom")
    assert first is not None and first["micro_batch_size"] == 128
    searcher.on_trial_complete("oom", _result("infeasible_memory"))
    told = searcher.study.trials[0]
    assert told.constraints["memory"] > 0 and told.value == 600.0
    launched = []
    for i in range(30):
        config = searcher.suggest(f"t{i}")
        assert config is not None
        launched.append((config["micro_batch_size"], config["accumulation_steps"]))
        searcher.on_trial_complete(f"t{i}", _result("reached", 1.0))
    # Never again anything needing as much memory: micro >= 128 with accumulation > 1 ...
    assert not [c for c in launched if c[0] >= 128 and c[1] > 1]
    # ... while what may still fit (128 x 1 keeps no gradient buffer alive) stays allowed.
    rejected = searcher.prescreened
    knobs = [p.params for p in rejected]
    assert knobs and all(k["micro_batch_size"] >= 128 and k["accumulation_steps"] > 1
                         for k in knobs)  # fmt: skip
    assert all("trial oom (micro batch 128 x 2), which ran out of memory" in str(p.reason)
               for p in rejected)  # fmt: skip
    feasible = [t for t in searcher.study.trials[1:] if t.user_attrs[STATUS_ATTR] == "reached"]
    assert all(t.constraints["memory"] == 0 for t in feasible)


def test_a_learned_oom_survives_a_checkpoint(tmp_path: Path) -> None:
    searcher = _searcher(tmp_path, points_to_evaluate=[
        {"micro_batch_size": 64, "accumulation_steps": 1, "lr_multiplier": 1.0}])  # fmt: skip
    searcher.suggest("oom")
    searcher.on_trial_complete("oom", _result("infeasible_memory"))
    searcher.save(str(tmp_path / "ckpt.pkl"))
    fresh = _searcher(tmp_path)
    fresh.restore(str(tmp_path / "ckpt.pkl"))
    for i in range(10):
        config = fresh.suggest(f"t{i}")
        assert config is not None and config["micro_batch_size"] < 64
        fresh.on_trial_complete(f"t{i}", _result("reached", 1.0))


def test_a_trial_the_scheduler_stopped_is_pruned_with_its_learning_curve(tmp_path: Path) -> None:
    """Capped is Optuna's PRUNED, with the metric at each evaluation (as Optuna's own pruners
    leave a trial; optuna-dashboard draws it as one); the same after a resume, where the trial
    has no live handle and is added anew with the curve it reported before."""
    searcher = _searcher(tmp_path)
    searcher.suggest("a")
    searcher.on_trial_result("a", {keys.METRIC: 0.4, keys.SAMPLES_SEEN: 512})
    searcher.on_trial_complete("a", {keys.STATUS: "running", keys.ELAPSED_S: 3.0,
                                     keys.METRIC: 0.6, keys.SAMPLES_SEEN: 1024})  # fmt: skip
    trial = searcher.study.trials[0]
    assert trial.state == optuna.trial.TrialState.PRUNED
    assert trial.user_attrs[STATUS_ATTR] == "capped"
    assert trial.intermediate_values == {512: 0.4, 1024: 0.6}
    searcher.on_trial_complete("a", _result("reached", 1.0))  # told once only
    assert searcher.study.trials[0].state == optuna.trial.TrialState.PRUNED
    searcher.suggest("b")
    searcher.on_trial_result("b", {keys.METRIC: 0.3, keys.SAMPLES_SEEN: 256})
    searcher.save(str(tmp_path / "ckpt.pkl"))
    fresh = _searcher(tmp_path)
    fresh.restore(str(tmp_path / "ckpt.pkl"))
    fresh.on_trial_complete("b", {keys.STATUS: "running"})
    lost, told = fresh.study.trials[1:]
    assert status_of(lost) == "lost_at_interruption"
    assert told.state == optuna.trial.TrialState.PRUNED and told.params == lost.params
    assert told.intermediate_values == {256: 0.3} and told.user_attrs[STATUS_ATTR] == "capped"
    # Each keeps its last evaluation as its value, as Optuna's tell keeps a pruned trial's.
    assert told.value == 0.3 and trial.value == 0.6


@pytest.mark.parametrize(
    ("result", "error", "expected"),
    [
        (_result("reached", 2.5), False, (TrialStatus.REACHED, 2.5)),
        (_result("censored"), False, (TrialStatus.CENSORED, 600.0)),
        (_result("diverged"), False, (TrialStatus.DIVERGED, 600.0)),
        ({keys.STATUS: "running"}, False, (TrialStatus.CAPPED, 600.0)),
        (None, True, (TrialStatus.ERROR, 600.0)),
    ],
)
def test_final_status_and_objective(result: Any, error: bool, expected: Any) -> None:
    assert final_status(result, error, 600.0) == expected


def test_checkpoint_restores_the_trial_map_and_prescreened_list(tmp_path: Path) -> None:
    searcher = _searcher(tmp_path)
    config = searcher.suggest("a")
    searcher.save(str(tmp_path / "ckpt.pkl"))
    fresh = _searcher(tmp_path)
    fresh.restore(str(tmp_path / "ckpt.pkl"))
    assert fresh.suggest("a") == config  # a restored unfinished trial gets its own config back
    fresh.on_trial_complete("a", _result("reached", 1.5))
    # No live handle in the new process: the old entry is closed, the result added anew with
    # the same parameters, so TPE learns from it and the record names the lost entry.
    lost, told = fresh.study.trials
    assert status_of(lost) == "lost_at_interruption"
    assert told.state == optuna.trial.TrialState.COMPLETE and told.value == 1.5
    assert told.params == lost.params and told.user_attrs["tune_trial_id"] == "a"
    assert told.user_attrs[STATUS_ATTR] == "reached" and told.constraints == {"memory": 0.0}
    fresh.on_trial_complete("a", _result("reached", 9.0))  # told once only
    assert len(fresh.study.trials) == 2


def test_a_search_that_cannot_fit_anything_finishes_instead_of_crashing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(screen_module, "MAX_PRESCREEN_ATTEMPTS", 20)
    searcher = _searcher(tmp_path, budget=1)  # one byte: nothing fits
    assert searcher.suggest("a") == searcher.FINISHED
    assert searcher.gave_up is not None and "rejected before launch" in searcher.gave_up
    assert "does not fit the budget of 1 B" in searcher.gave_up
    assert searcher.record.gave_up_reason() == searcher.gave_up
    assert len(searcher.study.trials) == 20
    assert searcher.suggest("b") == searcher.FINISHED  # and asks Optuna no more
    assert len(searcher.study.trials) == 20
    searcher.save(str(tmp_path / "ckpt.pkl"))
    restored = _searcher(tmp_path, budget=1)  # a resumed search remembers it gave up
    restored.restore(str(tmp_path / "ckpt.pkl"))
    assert restored.suggest("c") == restored.FINISHED
    assert len(restored.study.trials) == 20


def test_orphans_of_an_interrupted_driver_are_closed_as_failed(tmp_path: Path) -> None:
    searcher = _searcher(tmp_path)
    searcher.suggest("a")
    searcher.suggest("b")
    # The driver died with "b" running; the resumed experiment knows only Tune trial "a".
    assert searcher.record.close_orphans({"a"}) == 1
    states = [t.state for t in searcher.study.trials]
    assert states == [optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.FAIL]


def test_a_packed_oom_is_retried_alone_once_before_it_is_taught(tmp_path: Path) -> None:
    """A trial that ran out of memory while sharing its GPU may have lost to a neighbour: the
    same Optuna trial is launched again on a whole GPU; only that run's OOM is told."""
    searcher = _searcher(tmp_path, points_to_evaluate=[
        {"micro_batch_size": 128, "accumulation_steps": 1, "lr_multiplier": 1.0}])  # fmt: skip
    first = searcher.suggest("packed")
    assert first is not None and keys.ALONE not in first
    searcher.on_trial_complete("packed", {**_result("infeasible_memory"), keys.GPU_SHARE: 0.25})
    assert searcher.study.trials[0].state is optuna.trial.TrialState.RUNNING  # not told yet
    assert _out_of_memory(searcher) == []

    again = searcher.suggest("alone")
    assert again is not None and again[keys.ALONE] is True and again[keys.GPU_SHARE] == 1.0
    assert {k: again[k] for k in first} | {keys.GPU_SHARE: 1.0} == {**first, keys.GPU_SHARE: 1.0}
    assert len(searcher.study.trials) == 1  # the same Optuna trial, not a new one
    searcher.on_trial_complete("alone", {**_result("infeasible_memory"), keys.GPU_SHARE: 1.0})
    told = searcher.study.trials[0]
    assert told.state is optuna.trial.TrialState.COMPLETE and told.constraints["memory"] > 0
    assert [o.trial_id for o in _out_of_memory(searcher)] == ["alone"]
    following = searcher.suggest("next")
    assert following is not None and keys.ALONE not in following  # retried once, not again


def test_a_packed_oom_retried_alone_that_fits_is_told_as_measured(tmp_path: Path) -> None:
    searcher = _searcher(tmp_path)
    searcher.suggest("packed")
    searcher.on_trial_complete("packed", {**_result("infeasible_memory"), keys.GPU_SHARE: 0.5})
    searcher.suggest("alone")
    searcher.on_trial_complete("alone", {**_result("reached", 3.0), keys.GPU_SHARE: 1.0})
    told = searcher.study.trials[0]
    assert told.value == 3.0 and told.constraints["memory"] == 0
    assert _out_of_memory(searcher) == []


def test_the_trials_probes_calibrate_the_share_of_later_suggestions(tmp_path: Path) -> None:
    """Each probe's reserved peak calibrates the estimator (the most it reserved above the
    trace at a batch is kept there, and added near it), and the searcher sets every later
    suggestion's GPU share from the calibrated prediction."""
    from raybatch.cluster.resources import gpu_fraction

    estimator = MemoryEstimator(DigitsWorkload(), SPACE.reference_config(), anchors=(16, 256))
    budget = 8 * 2**30
    searcher = _searcher(tmp_path, budget=budget, estimator=estimator, pack_gpus=True)
    config = searcher.suggest("a")
    assert config is not None
    recipe = SPACE.derive_from(config)
    predicted = estimator.predict(recipe)
    assert config[keys.GPU_SHARE] == gpu_fraction(predicted, budget)
    measured = 40 * predicted  # the probe reserved far more than the trace predicts
    searcher.on_trial_complete("a", {**_result("reached", 1.0),
                                     keys.PROBE_RESERVED_BYTES: measured})  # fmt: skip
    assert estimator.predict(recipe) == pytest.approx(measured, rel=1e-6)
    later = searcher.suggest("b")
    assert later is not None
    assert later[keys.GPU_SHARE] == gpu_fraction(
        estimator.predict(SPACE.derive_from(later)), budget
    )
    assert later[keys.GPU_SHARE] > config[keys.GPU_SHARE]  # fewer trials per GPU now
    searcher.on_trial_complete("b", {**_result("reached", 1.0),
                                     keys.PROBE_RESERVED_BYTES: predicted})  # fmt: skip
    assert estimator.predict(recipe) == pytest.approx(measured, rel=1e-6)  # the max is kept


def _first_probe(tmp_path: Path) -> tuple[RaybatchSearcher, MemoryEstimator, Any]:
    """A packing searcher with a real digits estimator, and the recipe of its first trial."""
    estimator = MemoryEstimator(DigitsWorkload(), SPACE.reference_config(), anchors=(16, 256))
    searcher = _searcher(tmp_path, budget=8 * 2**30, estimator=estimator, pack_gpus=True)
    config = searcher.suggest("a")
    assert isinstance(config, dict)
    return searcher, estimator, SPACE.derive_from(config)


def test_what_the_probes_taught_survives_a_checkpoint(tmp_path: Path) -> None:
    """A resumed search predicts as before: the probes' excess is in the searcher's state."""
    searcher, estimator, recipe = _first_probe(tmp_path)
    measured = 3 * estimator.predict(recipe)
    searcher.on_trial_complete("a", {**_result("reached", 1.0),
                                     keys.PROBE_RESERVED_BYTES: measured})  # fmt: skip
    searcher.save(str(tmp_path / "searcher.pkl"))
    fresh = MemoryEstimator(DigitsWorkload(), SPACE.reference_config(), anchors=(16, 256))
    restored = _searcher(tmp_path, budget=8 * 2**30, estimator=fresh, pack_gpus=True)
    restored.restore(str(tmp_path / "searcher.pkl"))
    fits = gate_of(restored.gates, MemoryFits)
    assert fits is not None and fits.estimator is not fresh  # the checkpoint's, pickled whole
    assert fits.estimator.predict(recipe) == pytest.approx(measured, rel=1e-6)


def test_a_probe_below_the_prediction_never_shrinks_the_estimate(tmp_path: Path) -> None:
    """A calibration below 1 would over-pack every later trial: the trace's figure stands."""
    searcher, estimator, recipe = _first_probe(tmp_path)
    predicted = estimator.predict(recipe)
    searcher.on_trial_complete("a", {**_result("reached", 1.0),
                                     keys.PROBE_RESERVED_BYTES: predicted // 2})  # fmt: skip
    assert estimator.predict(recipe) == pytest.approx(predicted, rel=1e-6)


@pytest.mark.usefixtures("ray_session")
def test_a_world_size_the_cluster_cannot_place_is_prescreened_with_the_count(
    tmp_path: Path,
) -> None:
    """The session's Ray has 3 CPUs and no GPU: data-parallel GPU recipes cannot be placed,
    2 CPU workers can, 4 and 8 cannot."""
    space = raybatch.load_space("deit_vit_adamw")
    for gpus, allowed in ((True, {1}), (False, {1, 2})):
        searcher = _searcher(tmp_path, space=space, db=f"{gpus}.db", data_parallel_gpus=gpus)
        for i in range(12):
            config = searcher.suggest(f"t{i}")
            assert config is not None and config[keys.WORLD_SIZE] in allowed
            searcher.on_trial_complete(f"t{i}", _result("reached", 1.0))
        kind = "GPUs" if gpus else "CPUs"
        rejected = {p.params[keys.WORLD_SIZE]: p.reason for p in searcher.prescreened}
        assert rejected, "the sampler proposed no unplaceable world size in 12 trials"
        for world, reason in rejected.items():
            assert reason == f"needs {world} {kind}, the cluster has {0 if gpus else 3}"


# ---------------------------------------------------------------- the plan


def _plan_searcher(tmp_path: Path, model: Any = None, **kw: Any) -> RaybatchSearcher:
    from raybatch.tuning.seeding import Ladder, opening_points

    baseline = max_batch_point(SPACE, lambda recipe: True)
    points = opening_points(SPACE, baseline, reference_point(SPACE))
    return _searcher(tmp_path, points_to_evaluate=points, ladder=Ladder(SPACE, model=model),
                     baseline=baseline, **kw)  # fmt: skip


def _knobs(config: dict[str, Any]) -> tuple[int, int, float]:
    return config["micro_batch_size"], config["accumulation_steps"], config["lr_multiplier"]


def _run_reaching(searcher: RaybatchSearcher, numbers: range) -> list[tuple[int, int, float]]:
    """Trials ``o<i>`` suggested and completed one by one, each reaching in 2 s; their knobs."""
    launched = []
    for i in numbers:
        config = searcher.suggest(f"o{i}")
        assert isinstance(config, dict)
        launched.append(_knobs(config))
        searcher.on_trial_complete(f"o{i}", _result("reached", 2.0))
    return launched


def test_the_plan_sweeps_the_largest_batch_then_climbs_the_ladder_at_its_best_lr(
    tmp_path: Path,
) -> None:
    """The largest batch (256) at 1 and 2x the rule's LR, the reference (the likeliest to give
    an incumbent soon), then 256 at 4 and 0.5x run first; 4x was fastest, so the ladder runs a
    quarter and a sixteenth of the batch at 4x (the rule's carry) and at 256's own LR (the
    constant carry: 16x and 64x, within the space's 8x)."""
    searcher = _plan_searcher(tmp_path)
    times = {1.0: 3.0, 2.0: 2.0, 4.0: 1.5, 0.5: None}
    opening = []
    for i in range(5):
        config = searcher.suggest(f"o{i}")
        assert isinstance(config, dict)
        opening.append(_knobs(config))
        t = times.get(config["lr_multiplier"], 2.5) if config["micro_batch_size"] == 256 else 2.5
        searcher.on_trial_complete(f"o{i}", _result("reached" if t else "censored", t))
    assert opening == [(256, 1, 1.0), (256, 1, 2.0), (64, 1, 1.0), (256, 1, 4.0), (256, 1, 0.5)]
    ladder = []
    for i in range(4):
        config = searcher.suggest(f"l{i}")
        assert isinstance(config, dict)
        ladder.append(_knobs(config))
        searcher.on_trial_complete(f"l{i}", _result("reached", 2.0))
    assert ladder == [(64, 1, 4.0), (64, 1, 8.0), (16, 1, 4.0), (16, 1, 8.0)]


def test_the_ladder_comes_once_the_opening_has_finished_and_tpe_fills_in_meanwhile(
    tmp_path: Path,
) -> None:
    """With the whole opening launched and one trial still running, a free slot gets TPE's
    suggestion (no slot idles); once the opening has finished, the ladder comes next."""
    searcher = _plan_searcher(tmp_path)
    for i in range(5):
        assert isinstance(searcher.suggest(f"o{i}"), dict)
    for i in (0, 1, 2, 4):  # the largest batch at 1x was fastest; 0.5x is still running
        searcher.on_trial_complete(f"o{i}", _result("reached", 1.0 if i == 0 else 2.0))
    meanwhile = searcher.suggest("tpe")
    assert isinstance(meanwhile, dict)
    assert not searcher.record.ladder_queued()
    searcher.on_trial_complete("o3", _result("reached", 2.0))
    config = searcher.suggest("l0")
    # The ladder at 1x: 64 (a quarter of 256) at 1x is the reference, already run, so 64 at
    # 256's own LR (4x) comes first.
    assert isinstance(config, dict) and _knobs(config) == (64, 1, 4.0)
    assert searcher.record.ladder_queued()


def test_an_opening_point_that_runs_out_of_memory_is_replaced_by_a_smaller_batch(
    tmp_path: Path,
) -> None:
    """The estimate chose 256 and it ran out of memory for real: the rest of the sweep runs at
    128, which becomes the baseline the search compares with (recorded in the study)."""
    searcher = _plan_searcher(tmp_path)
    first = searcher.suggest("o0")
    assert isinstance(first, dict) and first["micro_batch_size"] == 256
    searcher.on_trial_complete("o0", _result("infeasible_memory"))
    batches = _run_reaching(searcher, range(1, 9))
    # 256 x 2/4/0.5 are rejected as needing the memory that ran out, each replaced at 128.
    assert batches[:5] == [(64, 1, 1.0), (128, 1, 1.0), (128, 1, 2.0), (128, 1, 4.0),
                           (128, 1, 0.5)]  # fmt: skip
    assert searcher.record.baseline() == {"micro_batch_size": 128, "accumulation_steps": 1,
                                          "world_size": 1}  # fmt: skip
    # 256 was pre-screened out each time the queue offered it again: nothing ran at 256.
    assert all(p.params["micro_batch_size"] == 256 for p in searcher.prescreened)


def test_a_config_over_the_budget_by_less_than_the_margin_is_launched_for_its_probe(
    tmp_path: Path,
) -> None:
    """The estimate may be off: within the probe margin a config is launched (the trial's real
    probe decides), beyond it rejected as before."""
    estimator = MemoryEstimator(DigitsWorkload(), SPACE.reference_config(), anchors=(16, 256))
    over = estimator.predict(SPACE.derive(128, 1))
    budget = int(over / 1.01)  # 128 is predicted 1% over, 256 about 3.5% over
    assert estimator.predict(SPACE.derive(256, 1)) > 1.02 * budget
    points = [{"micro_batch_size": 128, "accumulation_steps": 1, "lr_multiplier": 1.0},
              {"micro_batch_size": 256, "accumulation_steps": 1, "lr_multiplier": 1.0}]  # fmt: skip
    with_margin = _searcher(tmp_path, budget=budget, points_to_evaluate=points, probe_margin=0.02)
    config = with_margin.suggest("a")
    assert isinstance(config, dict) and config["micro_batch_size"] == 128
    with_margin.on_trial_complete("a", _result("reached", 1.0))
    config = with_margin.suggest("b")
    assert isinstance(config, dict) and config["micro_batch_size"] != 256
    assert next(p.params["micro_batch_size"] for p in with_margin.prescreened) == 256
    (tmp_path / "strict").mkdir()
    strict = _searcher(tmp_path / "strict", budget=budget, points_to_evaluate=points)
    config = strict.suggest("a")
    assert isinstance(config, dict) and config["micro_batch_size"] < 128
    assert [p.params["micro_batch_size"] for p in strict.prescreened][:2] == [128, 256]


def test_a_replacement_that_is_already_planned_does_not_stall_the_ladder(tmp_path: Path) -> None:
    """256 runs out of memory; 128 at the rule's LR is the reference, already planned, so the
    sweep's point is not replaced (Optuna would not queue it twice) and the ladder still comes."""
    from raybatch.tuning.seeding import Ladder, opening_points

    data = SPACE.model_dump()
    data["reference"]["batch_size"] = 128
    space = raybatch.SearchSpace.from_dict(data)
    baseline = max_batch_point(space, lambda recipe: True)
    points = opening_points(space, baseline, reference_point(space))
    searcher = _searcher(tmp_path, space=space, points_to_evaluate=points, ladder=Ladder(space),
                         baseline=baseline)  # fmt: skip
    for i in range(9):
        config = searcher.suggest(f"t{i}")
        assert isinstance(config, dict)
        oom = config["micro_batch_size"] == 256
        searcher.on_trial_complete(f"t{i}", _result("infeasible_memory" if oom else "reached", 1.0))
    assert searcher.record.ladder_queued()


def test_the_ladder_works_when_the_micro_batch_is_not_searched(tmp_path: Path) -> None:
    from raybatch.tuning.seeding import Ladder, opening_points

    data = SPACE.model_dump()
    data["search"]["micro_batch_size"] = [64]
    space = raybatch.SearchSpace.from_dict(data)
    baseline = max_batch_point(space, lambda recipe: True)
    searcher = _searcher(tmp_path, space=space, points_to_evaluate=opening_points(
        space, baseline, None), ladder=Ladder(space), baseline=baseline)  # fmt: skip
    for i in range(6):
        config = searcher.suggest(f"t{i}")
        assert isinstance(config, dict) and config["micro_batch_size"] == 64
        searcher.on_trial_complete(f"t{i}", _result("reached", 1.0 + i))
    assert searcher.record.ladder_queued()


def test_a_recipe_the_space_refuses_is_told_infeasible_and_the_search_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe is derived once, where the knobs are chosen; one the space's limits refuse
    (what ``derive`` would raise for) is recorded with the reason and never launched, instead
    of ending the search as a crash."""
    from raybatch.errors import ConfigError, Issue
    from raybatch.space import search_space

    limits = search_space._limit_issues

    def refusing(space: SearchSpace, m: int, a: int, w: int, lr: float) -> list[Issue]:
        refused = [Issue(keys.MICRO_BATCH_SIZE, "refused by this test")] if m == 256 else []
        return [*refused, *limits(space, m, a, w, lr)]

    monkeypatch.setattr(search_space, "_limit_issues", refusing)
    with pytest.raises(ConfigError, match="refused by this test"):  # the rule derive() keeps
        SPACE.derive(256)
    searcher = _searcher(tmp_path)
    launched = []
    for i in range(6):
        config = searcher.suggest(f"t{i}")
        assert isinstance(config, dict)
        launched.append(config[keys.MICRO_BATCH_SIZE])
        searcher.on_trial_complete(f"t{i}", _result("reached", 1.0 + i))
    assert 256 not in launched
    refused = [p for p in searcher.prescreened if "refused by this test" in str(p.reason)]
    assert refused and all(p.params[keys.MICRO_BATCH_SIZE] == 256 for p in refused)
    assert all(p.recipe is None for p in refused)  # the rules refused it: no recipe
    # The run's rows at the end leave them out (no recipe to show), instead of failing there.
    from raybatch.tuning.phases import prescreened_rows

    assert all(r.micro_batch_size != 256 for r in prescreened_rows(searcher.record))


@pytest.mark.usefixtures("ray_session")
def test_a_data_parallel_recipe_waits_in_the_searcher_until_its_workers_fit(
    tmp_path: Path,
) -> None:
    """On 3 CPUs a world-size-2 trial running leaves no room for another one's workers: the
    next is held (``suggest`` says "nothing now"), so no trial starts only to wait inside
    ``fit()`` on the hang guard's clock; it launches once the first has ended."""
    from raybatch.space.search_space import SearchSpace

    from .conftest import minimal_space

    space = SearchSpace.from_dict(
        minimal_space(search={"micro_batch_size": [32, 64], "world_size": [2]})
    )
    searcher = _searcher(tmp_path, space=space, data_parallel_gpus=False)
    first = searcher.suggest("a")
    assert isinstance(first, dict) and first[keys.WORLD_SIZE] == 2
    assert searcher.suggest("b") is None and searcher.suggest("c") is None
    searcher.on_trial_complete("a", _result("reached", 1.0))
    second = searcher.suggest("d")
    assert isinstance(second, dict) and second[keys.WORLD_SIZE] == 2
    assert len(searcher.study.trials) == 2  # the held one was not asked twice


@pytest.mark.usefixtures("ray_session")
def test_a_held_recipe_the_cluster_can_no_longer_place_is_told_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node lost while a data-parallel suggestion is held: with nothing running, waiting
    would stall the search forever; the held recipe is pre-screened with the count instead."""
    from raybatch.space.search_space import SearchSpace
    from raybatch.tuning.launches import Held

    from .conftest import minimal_space

    space = SearchSpace.from_dict(
        minimal_space(search={"micro_batch_size": [32, 64], "world_size": [1, 2]})
    )
    searcher = _searcher(tmp_path, space=space, data_parallel_gpus=False)
    config = {**space.derive(32, 1, 2).to_dict()}
    trial = searcher.record.ask()
    searcher.launches.held = Held(trial.number, config, space.derive(32, 1, 2))
    monkeypatch.setattr(gates_module, "worker_room", lambda *a: 1)  # a node was lost
    monkeypatch.setattr(gates_module, "placement_problem",
                        lambda *a: "needs 2 CPUs, the cluster has 1")  # fmt: skip
    assert searcher.suggest("x") is not None  # the search goes on
    told = [p for p in searcher.prescreened if p.number == trial.number]
    assert told and told[0].reason == "needs 2 CPUs, the cluster has 1"


def test_a_data_parallel_trial_waiting_for_its_workers_gets_a_second_hang_window() -> None:
    from types import SimpleNamespace

    from raybatch.tuning.hang import placement_allowance

    tune_fields = {"trial_id": "a", "pid": 1234, "hostname": "n"}  # Tune's, from the start
    waiting = SimpleNamespace(config={keys.WORLD_SIZE: 2}, last_result=tune_fields)
    assert placement_allowance(waiting) == 2.0
    reported = SimpleNamespace(config={keys.WORLD_SIZE: 2},
                               last_result={**tune_fields, keys.STATUS: "running"})  # fmt: skip
    assert placement_allowance(reported) == 1.0  # placed and reporting: the usual window
    single = SimpleNamespace(config={keys.WORLD_SIZE: 1}, last_result={})
    assert placement_allowance(single) == 1.0


def test_a_trial_starting_up_is_given_the_startup_allowance_on_top_of_its_hang_window() -> None:
    """A slow ``build_model`` is not a hang: before its first report a trial may be silent
    for its window plus the start-up allowance; from its first report on, the window alone."""
    from types import SimpleNamespace

    from raybatch.tuning.hang import HangGuard

    guard = HangGuard(after_s=8.0, startup_s=100.0)
    tune_fields = {"trial_id": "a", "pid": 1234, "hostname": "n"}
    starting = SimpleNamespace(config={}, last_result=tune_fields)
    assert guard.window_s(starting) == 108.0
    reported = SimpleNamespace(config={}, last_result={**tune_fields, keys.STATUS: "running"})
    assert guard.window_s(reported) == 8.0
    placing = SimpleNamespace(config={keys.WORLD_SIZE: 2}, last_result=tune_fields)
    assert guard.window_s(placing) == 116.0  # two windows waiting for its workers, and start-up


def _driver_searcher(tmp_path: Path, prior: bool = False) -> RaybatchSearcher:
    """The searcher exactly as ``raybatch search`` builds it: through the driver's own plan
    (the opening points leave out ``world_size``, a single-choice knob of this space, while
    the driver's baseline names it: the case that kept the LR carry from running)."""
    from raybatch.examples.digits import workload
    from raybatch.metric import resolve_target
    from raybatch.run.driver import _plan
    from raybatch.tuning.options import SearchOptions

    target = resolve_target("accuracy>=0.9", workload.metrics)
    plan = _plan(tmp_path, workload, SPACE, target, SearchOptions(trials=12, prior=prior))
    opening = plan.searcher.plan.opening.points
    assert plan.baseline[keys.WORLD_SIZE] == 1 and keys.WORLD_SIZE not in opening[0]
    return plan.searcher


@pytest.mark.usefixtures("ray_session")
def test_the_driver_built_searcher_carries_the_largest_batchs_best_lr_to_the_ladder(
    tmp_path: Path,
) -> None:
    """256 reached fastest at 2x the rule's LR: the ladder runs its batches at 2x (the rule's
    carry) and at the largest batch's own LR (the constant carry), not at 1x."""
    searcher = _driver_searcher(tmp_path)
    times = {1.0: 3.0, 2.0: 1.5, 4.0: 2.0, 0.5: 4.0}
    for i in range(len(searcher.plan.opening.points)):
        config = searcher.suggest(f"o{i}")
        assert isinstance(config, dict)
        t = times[config["lr_multiplier"]] if config["micro_batch_size"] == 256 else 2.5
        searcher.on_trial_complete(f"o{i}", _result("reached", t))
    assert searcher.plan.opening.best_multiplier() == 2.0
    ladder = []
    for i in range(4):
        config = searcher.suggest(f"l{i}")
        assert isinstance(config, dict)
        ladder.append(_knobs(config))
        searcher.on_trial_complete(f"l{i}", _result("reached", 2.0))
    # A quarter (64) and a sixteenth (16) of 256, each at 2x and at 256's absolute LR.
    assert ladder == [(64, 1, 2.0), (64, 1, 8.0), (16, 1, 2.0), (16, 1, 8.0)]


@pytest.mark.usefixtures("ray_session")
def test_the_driver_built_searcher_has_every_trial_measure_the_time_model_until_one_has(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The time model is measured inside a trial once it reaches the target: every trial
    launched until one has is asked (the one asked first is often stopped while the one beside
    it reaches), the first model back is kept and no trial is asked after it, what it brings
    back survives the searcher's checkpoint, and the ladder is ranked by it (here: the
    smallest batches, where the geometric ladder without a model would run 64 and 16). Each
    phase says so as it begins: the time model measured, the ladder, then TPE."""
    from raybatch.timemodel.model import MeasuredTimeModel, NoiseScale, TimeModel

    caplog.set_level(logging.INFO, logger=LOGGER)
    searcher = _driver_searcher(tmp_path, prior=True)
    asked = [searcher.suggest("o0"), searcher.suggest("o1")]
    assert all(isinstance(c, dict) for c in asked)
    assert [bool(c.get(keys.MEASURE_TIME_MODEL)) for c in asked] == [True, True]  # type: ignore[union-attr]
    searcher.on_trial_complete("o0", _result("capped"))
    third = searcher.suggest("o2")
    assert isinstance(third, dict) and third.get(keys.MEASURE_TIME_MODEL) is True
    # No noise to average away, and a pass that costs more the larger the micro batch: the
    # model predicts the smallest batches fastest.
    micro_s = {m: 0.01 * m**0.5 for m in SPACE.search.micro_batch_size}
    model = TimeModel(NoiseScale(0.0, 0.0, 0.0, 16, 128, 16), micro_s, 0.001, cost_s=0.5)
    measured = {**_result("reached", 2.0), keys.TIME_MODEL: json.dumps(model.to_dict())}
    searcher.on_trial_complete("o2", measured)
    later = TimeModel(NoiseScale(9.0, 8.0, 10.0, 16, 128, 16), micro_s, 0.001, cost_s=0.5)
    searcher.on_trial_complete("o1", {**_result("reached", 2.0),
                                      keys.TIME_MODEL: json.dumps(later.to_dict())})  # fmt: skip
    assert searcher.plan.time_model == MeasuredTimeModel(model, "o2")  # the first one back
    fourth = searcher.suggest("o3")
    assert isinstance(fourth, dict) and keys.MEASURE_TIME_MODEL not in fourth
    searcher.on_trial_complete("o3", _result("reached", 2.0))
    searcher.save(str(tmp_path / "searcher.pkl"))
    restored = _driver_searcher(tmp_path, prior=True)
    restored.restore(str(tmp_path / "searcher.pkl"))
    assert restored.plan.time_model == searcher.plan.time_model
    launched = _run_reaching(restored, range(4, 4 + len(restored.plan.opening.points) - 4 + 4))
    ladder = launched[-4:]
    assert {m for m, _, _ in ladder} == {16, 32}
    assert isinstance(restored.suggest("tpe"), dict)
    said = [m for m in caplog.messages if not m.startswith("trial ")]
    assert said == [
        "time model measured in trial o2 (gradient noise scale 0): the ladder's batches come"
        " from it once the opening has ended",
        "the opening has ended: the ladder next, 4 recipe(s): the batches the time model"
        " predicts fastest, each at the largest batch's fastest LR (0.5x) carried by the rule and"
        " as is",
        "the plan's recipes have all been asked: Optuna's TPE suggests from here",
    ]


@pytest.mark.usefixtures("ray_session")
def test_with_the_opening_paused_before_any_reach_its_leader_goes_on_before_the_ladder(
    tmp_path: Path,
) -> None:
    """Every opening point paused at a rung and none reached: the searcher suggests nothing
    (the scheduler resumes the opening's leader) rather than a geometric ladder at the default
    LR. Once a point reaches (here the reference), with its time model, the ladder is queued
    from the model at the LR of the sweep's leader, while the other points stay paused."""
    from raybatch.timemodel.model import NoiseScale, TimeModel

    searcher = _driver_searcher(tmp_path, prior=True)
    points = len(searcher.plan.opening.points)
    for i in range(points):
        config = searcher.suggest(f"o{i}")
        assert isinstance(config, dict) and config.get(keys.MEASURE_TIME_MODEL) is True
        searcher.on_pause(f"o{i}")  # the scheduler paused it at a rung (Ray's searcher hook)
    assert searcher.suggest("next") is None  # Tune asks again later
    assert not searcher.record.ladder_queued()
    assert searcher.plan.phase() == "the opening"  # as an interruption now would say
    searcher.on_unpause("o1")  # the leader goes on (256 at 2x), and so does the reference
    searcher.on_unpause("o2")
    assert searcher.suggest("next") is None  # still no reach: no new trial meanwhile
    micro_s = {m: 0.01 * m**0.5 for m in SPACE.search.micro_batch_size}
    model = TimeModel(NoiseScale(0.0, 0.0, 0.0, 16, 128, 16), micro_s, 0.001, cost_s=0.5)
    searcher.on_trial_complete("o2", {**_result("reached", 2.0),
                                      keys.TIME_MODEL: json.dumps(model.to_dict())})  # fmt: skip
    ladder = searcher.suggest("l0")
    assert isinstance(ladder, dict) and searcher.record.ladder_queued()
    assert searcher.plan.ladder is not None and searcher.plan.ladder.model == model
    assert ladder["micro_batch_size"] in (16, 32) and ladder["lr_multiplier"] == 2.0
    assert searcher.plan.phase() == "the ladder"
    for i in range(1, 4):
        assert isinstance(searcher.suggest(f"l{i}"), dict)
    assert searcher.plan.phase() == "Optuna's TPE"


def _evaluated(searcher: RaybatchSearcher, trial_id: str, train_s: float, metric: float) -> None:
    """One evaluation reported, as Tune hands it to the searcher."""
    searcher.on_trial_result(trial_id, {keys.TRAIN_S: train_s, keys.METRIC: metric,
                                        keys.SAMPLES_SEEN: int(train_s * 1000)})  # fmt: skip


def _opening_asked(searcher: RaybatchSearcher) -> dict[tuple[float, int], str]:
    """Every opening point asked, each paused at once: trial ids by (LR multiplier, batch)."""
    numbers = {}
    for i in range(len(searcher.plan.opening.points)):
        config = searcher.suggest(f"o{i}")
        assert isinstance(config, dict)
        numbers[config["lr_multiplier"], config["micro_batch_size"]] = f"o{i}"
        searcher.on_pause(f"o{i}")
    return numbers


@pytest.mark.usefixtures("ray_session")
def test_a_reach_of_the_reference_ends_the_wait_once_no_sweep_point_runs(tmp_path: Path) -> None:
    """The reference reached while the sweep's leader (the first the scheduler resumed: 256 at
    4x) was paused again: the ladder is queued at once, at the leader's LR."""
    searcher = _driver_searcher(tmp_path, prior=True)
    numbers = _opening_asked(searcher)
    leader, reference = numbers[4.0, 256], numbers[1.0, 64]
    searcher.on_unpause(leader)
    searcher.on_unpause(reference)
    assert searcher.suggest("next") is None
    searcher.on_pause(leader)  # behind the reference at its next rung
    searcher.on_trial_complete(reference, _result("reached", 2.0))
    ladder = searcher.suggest("l0")
    assert isinstance(ladder, dict) and searcher.record.ladder_queued()
    assert searcher.plan.opening.best_multiplier() == 4.0


@pytest.mark.usefixtures("ray_session")
def test_a_reach_ends_the_wait_while_the_slow_largest_batch_trains_on(tmp_path: Path) -> None:
    """The reference reached while the sweep's leader (256 at 4x) still trains, past the time
    the sweep's curves were compared at: the ladder is queued at once, at the LR ahead there,
    not held until the largest batch reaches (on a digits CNN it took 3-4x the optimum's
    training, and the whole search waited for it)."""
    searcher = _driver_searcher(tmp_path, prior=True)
    ids = _opening_asked(searcher)
    for (lr, batch), trial_id in ids.items():
        if batch == 256:
            _evaluated(searcher, trial_id, 1.0, {4.0: 0.6, 2.0: 0.5}.get(lr, 0.3))
    searcher.on_unpause(ids[4.0, 256])
    searcher.on_unpause(ids[1.0, 64])
    assert searcher.suggest("next") is None  # nothing reached: the leaders go on
    _evaluated(searcher, ids[4.0, 256], 2.5, 0.8)
    searcher.on_trial_complete(ids[1.0, 64], _result("reached", 2.0))
    ladder = searcher.suggest("l0")
    assert isinstance(ladder, dict) and searcher.record.ladder_queued()
    assert searcher.plan.opening.best_multiplier() == 4.0


@pytest.mark.usefixtures("ray_session")
def test_a_sweep_point_running_short_of_the_compared_time_holds_the_ladder_till_it_gets_there(
    tmp_path: Path,
) -> None:
    """The reference reached while 256 at 0.5x, started late, had trained less than the rest of
    the sweep: the ladder waits until its curve gets to the time the others were compared at,
    and carries its LR where it is ahead there (a simulated member whose best LR is the
    sweep's lowest otherwise ran its ladder at 1x, 2.8x slower than the optimum)."""
    searcher = _driver_searcher(tmp_path, prior=True)
    ids = _opening_asked(searcher)
    for lr in (1.0, 2.0, 4.0):
        _evaluated(searcher, ids[lr, 256], 1.0, 0.4)
    late = ids[0.5, 256]
    searcher.on_unpause(late)
    _evaluated(searcher, late, 0.3, 0.2)
    searcher.on_trial_complete(ids[1.0, 64], _result("reached", 2.0))
    assert searcher.suggest("next") is None and not searcher.record.ladder_queued()
    _evaluated(searcher, late, 1.1, 0.7)
    assert isinstance(searcher.suggest("l0"), dict) and searcher.record.ladder_queued()
    assert searcher.plan.opening.best_multiplier() == 0.5


@pytest.mark.usefixtures("ray_session")
def test_the_opening_settles_at_a_rung_without_waiting_for_a_reach(tmp_path: Path) -> None:
    """Every sweep point paused at a rung, compared there: the ladder is queued at the LR ahead
    at equal time, though nothing has reached. The wait for a reach kept the opening's slow
    recipes training: on a digits CNN the largest batch's sweep and the reference trained 6.9
    trainings of the optimum before the first reach, half the search. While a sweep point
    still runs short of the time compared at, the ladder waits for it."""
    searcher = _driver_searcher(tmp_path, prior=True)
    ids = _opening_asked(searcher)
    for lr, level in ((0.5, 0.2), (1.0, 0.3), (2.0, 0.5), (4.0, 0.4)):
        _evaluated(searcher, ids[lr, 256], 0.6, level)
    searcher.on_unpause(ids[2.0, 256])  # the scheduler resumed the furthest: it runs on
    assert searcher.suggest("next") is None and not searcher.record.ladder_queued()
    _evaluated(searcher, ids[2.0, 256], 1.8, 0.7)
    searcher.on_pause(ids[2.0, 256])  # paused at its next rung: every sweep point paused
    assert isinstance(searcher.suggest("l0"), dict) and searcher.record.ladder_queued()
    assert not searcher.plan.opening.reached
    assert searcher.plan.opening.best_multiplier() == 2.0


@pytest.mark.usefixtures("ray_session")
def test_the_opening_settles_at_the_guess_of_b_without_waiting_for_a_reach(tmp_path: Path) -> None:
    """A leader that trained as long as the guess of ``B`` (the default 60 s cap / 3) without
    reaching ends the wait while it runs on: the ladder is queued at its LR once every sweep
    point has been evaluated and each still running has trained as long as the sweep's curves
    are compared at. The wait for no sweep point to run at all kept each sweep point in turn
    training to its cap on a digits CNN, whose largest batch reaches at no LR in the cap (the
    scheduler resumes the leader into the slot the withheld ladder leaves free: 4 caps, 60 of
    a search's 107 training seconds). Short of the guess the wait stands: a sweep point that
    reaches measures the time model the ladder is ranked by."""
    searcher = _driver_searcher(tmp_path, prior=True)
    ids = _opening_asked(searcher)
    for lr, level in ((0.5, 0.2), (1.0, 0.3), (2.0, 0.5)):
        _evaluated(searcher, ids[lr, 256], 0.6, level)
    searcher.on_unpause(ids[2.0, 256])  # the scheduler resumed the furthest: it runs on
    _evaluated(searcher, ids[2.0, 256], 12.0, 0.7)
    assert searcher.suggest("next") is None  # short of the guess, a sweep point runs: it waits
    _evaluated(searcher, ids[2.0, 256], 20.5, 0.8)  # past the guess, short of the target
    assert searcher.suggest("next") is None  # 256 at 4x not evaluated yet: not compared
    searcher.on_unpause(ids[4.0, 256])
    _evaluated(searcher, ids[4.0, 256], 0.3, 0.4)
    assert searcher.suggest("next") is None  # running short of the 0.6 s the others got to
    assert not searcher.record.ladder_queued()
    _evaluated(searcher, ids[4.0, 256], 0.62, 0.45)
    assert isinstance(searcher.suggest("l0"), dict) and searcher.record.ladder_queued()
    assert not searcher.plan.opening.reached
    assert searcher.plan.opening.best_multiplier() == 2.0


@pytest.mark.usefixtures("ray_session")
def test_the_sweeps_curves_survive_the_searchers_checkpoint(tmp_path: Path) -> None:
    """What the sweep showed before an interruption still chooses the ladder's LR after it."""
    searcher = _driver_searcher(tmp_path, prior=True)
    ids = _opening_asked(searcher)
    _evaluated(searcher, ids[2.0, 256], 1.0, 0.7)
    _evaluated(searcher, ids[1.0, 256], 1.5, 0.5)
    path = tmp_path / "searcher.pkl"
    searcher.save(str(path))
    again = _driver_searcher(tmp_path / "again", prior=True)
    again.restore(str(path))
    assert again.plan.opening.ahead() == searcher.plan.opening.ahead()
    assert again.plan.opening.best_multiplier() == 2.0


def test_once_a_trial_reached_each_launch_names_the_rungs_it_ties(tmp_path: Path) -> None:
    """Before any reach a trial evaluates at the geometric marks only; once one reached in 2 s,
    each trial launched evaluates at the rungs too (B, and the grid of the 60 s cap below it:
    60/81 and 60/243 s, as the scheduler judges), and a restored searcher goes on naming them;
    a packed trial's time, its neighbours' pace in it, ties no rungs."""
    from raybatch.tuning.scheduler import CappingScheduler

    scheduler = CappingScheduler.for_time_cap(60.0)  # the searcher's penalty: 10x a 60 s cap
    scheduler.judge.record(2.0)
    rungs = scheduler.rungs()
    assert rungs == pytest.approx([60 / 243, 60 / 81, 2.0])

    searcher = _searcher(tmp_path)
    first = searcher.suggest("a")
    assert isinstance(first, dict) and keys.RUNG_MARKS not in first
    searcher.on_trial_complete("a", {**_result("reached", 1.0), keys.GPU_SHARE: 0.5})
    assert keys.RUNG_MARKS not in (searcher.suggest("b") or {})
    searcher.on_trial_complete("b", _result("reached", 2.0))
    later = searcher.suggest("c")
    assert isinstance(later, dict) and later[keys.RUNG_MARKS] == pytest.approx(rungs)
    assert keys.RUNG_MARKS not in searcher.study.trials[-1].params  # for Tune, not the study
    path = tmp_path / "searcher.pkl"
    searcher.save(str(path))
    again = _searcher(tmp_path)
    again.restore(str(path))
    assert (again.suggest("d") or {})[keys.RUNG_MARKS] == pytest.approx(rungs)


def test_without_pauses_the_searcher_never_waits_for_a_reach(tmp_path: Path) -> None:
    """Trials that end for good (no pause) leave nothing to resume: a free slot gets a trial."""
    searcher = _plan_searcher(tmp_path)
    for i in range(5):
        assert isinstance(searcher.suggest(f"o{i}"), dict)
    assert isinstance(searcher.suggest("tpe"), dict)


@pytest.mark.usefixtures("ray_session")
def test_the_driver_built_searcher_steps_the_sweep_down_when_the_largest_batch_runs_out(
    tmp_path: Path,
) -> None:
    """The largest batch ran out of memory for real: the rest of its LR sweep runs at 128."""
    searcher = _driver_searcher(tmp_path)
    first = searcher.suggest("o0")
    assert isinstance(first, dict) and first["micro_batch_size"] == 256
    searcher.on_trial_complete("o0", _result("infeasible_memory"))
    launched = _run_reaching(searcher, range(1, 6))
    assert {(128, 1, 1.0), (128, 1, 2.0), (128, 1, 4.0), (128, 1, 0.5)} <= set(launched)
    assert searcher.plan.opening.baseline[keys.MICRO_BATCH_SIZE] == 128


@pytest.mark.usefixtures("ray_session")
def test_a_data_parallel_recipe_waits_for_the_devices_single_trials_hold_too(
    tmp_path: Path,
) -> None:
    """On 3 CPUs, two single trials running hold two: a world-size-2 recipe is held until one
    ends, instead of starting to wait inside ``fit()`` and being censored as hung."""
    from raybatch.space.search_space import SearchSpace

    from .conftest import minimal_space

    space = SearchSpace.from_dict(
        minimal_space(search={"micro_batch_size": [32, 64], "world_size": [1, 2]})
    )
    points = [{"micro_batch_size": 32, "world_size": 1}, {"micro_batch_size": 64, "world_size": 1},
              {"micro_batch_size": 64, "world_size": 2}]  # fmt: skip
    searcher = _searcher(tmp_path, space=space, points_to_evaluate=points,
                         data_parallel_gpus=False)  # fmt: skip
    for trial in ("a", "b"):
        config = searcher.suggest(trial)
        assert isinstance(config, dict) and config[keys.WORLD_SIZE] == 1
    assert searcher.suggest("c") is None  # 2 held + 2 workers > 3
    searcher.on_trial_complete("a", _result("reached", 1.0))
    config = searcher.suggest("d")
    assert isinstance(config, dict) and config[keys.WORLD_SIZE] == 2


def test_a_gate_of_ones_own_refuses_with_its_reason_and_learns_from_finished_trials(
    tmp_path: Path,
) -> None:
    """The searcher's gates are parts: a user's ``Gate`` beside the search's own refuses what
    it must (told to Optuna, recorded with its reason, never launched) and learns from every
    trial that ends; what it learned is in the searcher's checkpoint."""
    from raybatch.tuning.gates import Gate, Rejection

    class NoLargeBatches(Gate):
        def __init__(self) -> None:
            self.ended: list[str] = []

        def check(self, recipe: TrialConfig) -> Rejection | None:
            if recipe.micro_batch_size >= 128:
                return Rejection("too large for this test", memory=False)
            return None

        def learn(
            self, trial_id: str, recipe: TrialConfig, result: dict[str, Any], oom: bool
        ) -> None:
            self.ended.append(trial_id)

    def build() -> tuple[RaybatchSearcher, NoLargeBatches]:
        gate = NoLargeBatches()
        study = SearchStudy(f"sqlite:///{tmp_path / 'optuna.db'}", "t")
        gates = [*search_gates(None, None), gate]
        searcher = RaybatchSearcher(
            SPACE, penalty=600.0, study=study, plan=Plan(SPACE), gates=gates
        )
        return searcher, gate

    searcher, gate = build()
    for i in range(8):
        config = searcher.suggest(f"t{i}")
        assert isinstance(config, dict) and config[keys.MICRO_BATCH_SIZE] < 128
        searcher.on_trial_complete(f"t{i}", _result("reached", 1.0 + i))
    assert gate.ended == [f"t{i}" for i in range(8)]
    refused = [p for p in searcher.prescreened if p.reason == "too large for this test"]
    assert refused and all(p.params[keys.MICRO_BATCH_SIZE] >= 128 for p in refused)
    searcher.save(str(tmp_path / "ckpt.pkl"))
    restored, _ = build()
    restored.restore(str(tmp_path / "ckpt.pkl"))  # the gate, pickled with the searcher
    mine = [g for g in restored.gates if type(g).__name__ == "NoLargeBatches"]
    assert [g.ended for g in mine] == [gate.ended]  # type: ignore[attr-defined]
    assert Gate().check(SPACE.derive(64)) is None  # the base objects to nothing


def test_a_checkpoint_this_raybatch_cannot_unpickle_is_refused_naming_the_file(
    tmp_path: Path,
) -> None:
    """The checkpoint pickles the searcher whole, so it names the classes of the raybatch that
    wrote it: one whose classes are gone (moved in another version) is refused with the file
    named, not a bare ``ModuleNotFoundError`` from deep in Tune's restore."""
    import sys
    import types

    from raybatch.errors import RunDirError
    from raybatch.version import RUN_FORMAT

    class Part:
        pass

    gone = types.ModuleType("raybatch_gone_for_this_test")
    Part.__module__, Part.__qualname__ = gone.__name__, "Part"  # a class of another version
    gone.Part = Part  # type: ignore[attr-defined]
    sys.modules[gone.__name__] = gone
    try:
        payload = pickle.dumps({"format": RUN_FORMAT, "searcher": {"plan": Part()}})
    finally:
        del sys.modules[gone.__name__]
    (tmp_path / "ckpt.pkl").write_bytes(payload)
    with pytest.raises(RunDirError, match=r"ckpt\.pkl: format: unreadable \(ModuleNotFound"):
        _searcher(tmp_path).restore(str(tmp_path / "ckpt.pkl"))


def test_points_queued_for_tpe_that_never_ran_are_closed_with_a_reason(tmp_path: Path) -> None:
    """The opening's and the ladder's points are queued in the study; those a search ended
    before running would stay WAITING for ever (ghosts in optuna-dashboard)."""
    record = SearchStudy(f"sqlite:///{tmp_path / 'optuna.db'}", "raybatch")
    record.study.enqueue_trial({keys.MICRO_BATCH_SIZE: 64})
    record.study.enqueue_trial({keys.MICRO_BATCH_SIZE: 128})
    assert close_unrun(record) == 2
    trials = record.study.trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL] * 2
    assert all(t.user_attrs[REASON_ATTR].startswith("not run:") for t in trials)


def test_each_driver_session_is_recorded_in_the_study_and_read_back_with_sqlite(
    tmp_path: Path,
) -> None:
    """The search and each resume record when they started in the study (the cost's wall clock
    is counted within them); read back from the file alone, as a finished run's audit does,
    and from a study written before they were recorded (none: one session)."""
    db = tmp_path / "optuna.db"
    assert sessions_recorded(db, "t") == []  # no file yet
    assert SearchStudy(f"sqlite:///{db}", "t").add_session(100.0) == [100.0]
    assert SearchStudy(f"sqlite:///{db}", "t").add_session(250.5) == [100.0, 250.5]  # a resume
    assert sessions_recorded(db, "t") == [100.0, 250.5]
    assert sessions_recorded(db, "other") == []
    SearchStudy(f"sqlite:///{tmp_path / 'old.db'}", "t").study.set_user_attr("x", 1)
    assert sessions_recorded(tmp_path / "old.db", "t") == []
