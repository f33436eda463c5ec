"""One trial end to end: real training on digits, statuses, and Ray Tune around it."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

import raybatch
from raybatch import SearchSpace, Target, keys
from raybatch.errors import WorkerLostError
from raybatch.examples.digits import DigitsWorkload
from raybatch.status import TrialStatus
from raybatch.trial.cadence import BACKSTOP_EVALS_PER_EPOCH, default_eval_every
from raybatch.trial.loop import LoopOptions
from raybatch.trial.reporting import TrialReporter
from raybatch.trial.settings import TrialSettings
from raybatch.trial.wrapper import run_trial

from .workloads import DigitsOOMAtLargeBatch

DIGITS = DigitsWorkload()
SPACE = raybatch.load_space("digits_cnn_sgd")


TIME_CAP_S = 300.0
"""A trial's cap here: one a loaded machine never reaches (a trial censored at 30 s on a busy
CI machine failed a test about its fields); the sample budget ends a trial that cannot reach."""
SAMPLE_BUDGET = 200_000


def _run(config: dict[str, Any], target: float = 0.97, space: SearchSpace = SPACE, **kw: Any):
    reports: list[dict[str, Any]] = []
    bounds = {"max_time_s": TIME_CAP_S, "max_samples": SAMPLE_BUDGET}
    settings = TrialSettings(Target(target), **(bounds | kw))
    reporter = run_trial(DIGITS, space, settings, config, report_fn=reports.append)
    return reporter, reports


def test_a_sticky_device_error_at_cleanup_ends_the_trial_not_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After an illegal memory access every CUDA call raises, the cleanup's synchronise too:
    the trial still ends with a status and a reason instead of raising into Ray. The process
    is left broken, and Tune reuses processes: the next trial in it refuses it as a lost
    worker (Tune runs that trial again in a fresh process) instead of failing the recipe."""
    import raybatch.trial.reporting as reporting
    import raybatch.trial.wrapper as wrapper

    def sticky(device: Any = None) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(wrapper, "_broken", [])  # this test process stays usable afterwards
    for module in (wrapper, reporting):  # the names they imported
        monkeypatch.setattr(module, "release_memory", sticky)
    reporter, reports = _run({"micro_batch_size": 64}, target=1.01, max_time_s=0.5)
    assert reporter.stopped and reports[-1][keys.STATUS] == "censored"  # what it measured
    with pytest.raises(WorkerLostError, match="RuntimeError releasing"):
        _run({"micro_batch_size": 64}, target=1.01, max_time_s=0.5)


def test_knobs_the_space_refuses_end_the_trial_with_the_reason() -> None:
    """A hand-written Tune config beyond the space's limits is that trial's error, named."""
    reporter, reports = _run({"micro_batch_size": 64, "accumulation_steps": 99})
    assert reporter.stopped and reports[-1][keys.STATUS] == "error"
    assert "accumulation_steps" in reports[-1][keys.REASON]


def test_digits_reaches_its_target_with_consistent_fields() -> None:
    _reporter, reports = _run({"micro_batch_size": 64, "accumulation_steps": 2})
    final = reports[-1]
    assert final[keys.STATUS] == "reached", final[keys.REASON]
    epoch = default_eval_every(len(DIGITS.train_dataset()), SPACE, BACKSTOP_EVALS_PER_EPOCH)
    assert epoch == 2048  # an epoch (1437) rounded up to the largest effective batch
    assert default_eval_every(len(DIGITS.train_dataset()), SPACE) == 1024  # a quarter, alone
    assert final[keys.TIME_TO_TARGET_S] <= final[keys.ELAPSED_S]
    assert final[keys.TRAIN_S] < final[keys.ELAPSED_S]  # evaluation is timed apart
    assert final[keys.STEPS] * 128 == final[keys.SAMPLES_SEEN]
    assert final[keys.METRIC] >= 0.97
    assert final[keys.OBJECTIVE] == final[keys.TIME_TO_TARGET_S]
    assert 0.0 <= final[keys.DATA_WAIT_FRACTION] < 1.0 and final[keys.THROUGHPUT] > 0
    assert [r[keys.STATUS] for r in reports[:-1]] == ["running"] * (len(reports) - 1)
    # Evaluations at the time marks, and at least once an epoch's samples (heartbeats between
    # them, on a slow machine, repeat the last).
    marks = [m for m in dict.fromkeys(r[keys.EVAL_MARK] for r in reports) if m]
    assert marks[-1] == final[keys.SAMPLES_TO_TARGET]
    assert all(0 < b - a <= epoch for a, b in itertools.pairwise([0, *marks]))


def test_only_the_default_cadence_evaluates_on_training_time() -> None:
    """By default a trial evaluates at training-time marks, with at least one evaluation an
    epoch; a cadence the user gives, or a data-parallel trial's (its workers agree on samples,
    not on a host clock), is a fixed grid of sample marks with no time marks."""
    from raybatch.trial.cadence import EVALS_PER_EPOCH, time_marks
    from raybatch.trial.wrapper import _reporter

    size, cpu = len(DIGITS.train_dataset()), torch.device("cpu")
    default = _reporter(DIGITS, SPACE, TrialSettings(Target(0.97), max_time_s=60.0), cpu, None)
    assert default.cadence.eval_at_s == time_marks(60.0)
    assert default.cadence.eval_every_samples == default_eval_every(
        size, SPACE, BACKSTOP_EVALS_PER_EPOCH)  # fmt: skip
    quarter = default_eval_every(size, SPACE, EVALS_PER_EPOCH)
    for settings, clock in (
        (TrialSettings(Target(0.97), max_time_s=60.0), lambda: 0.0),  # data-parallel
        (TrialSettings(Target(0.97), max_time_s=60.0, eval_every_samples=512), None),
    ):
        grid = _reporter(DIGITS, SPACE, settings, cpu, None, clock)
        assert grid.cadence.eval_at_s == []
        assert grid.cadence.eval_every_samples == (settings.eval_every_samples or quarter)


def test_a_trial_evaluates_at_the_rungs_its_config_names() -> None:
    """The searcher names the rungs' training times in a trial's config: the trial evaluates
    at the first step past each, not only at the geometric marks up to ``sqrt(3)`` later (the
    first geometric mark past 0.3 s of a 60 s cap is 0.43 s)."""
    from raybatch.trial.cadence import time_marks

    rung = 0.3
    assert min(t for t in time_marks(60.0) if t > rung) > 0.42
    _, reports = _run({"micro_batch_size": 64, keys.RUNG_MARKS: [rung]}, target=0.999,
                      max_time_s=60.0, max_samples=60_000)  # fmt: skip
    evaluated = [r[keys.TRAIN_S] for r in reports
                 if r.get(keys.METRIC) is not None and not r.get(keys.HEARTBEAT)]  # fmt: skip
    assert evaluated[-1] > 0.42  # it trained past the next geometric mark
    assert any(rung <= t < 0.42 for t in evaluated)


def test_too_high_a_learning_rate_diverges_quickly() -> None:
    data = SPACE.model_dump()
    data["reference"]["lr"] = 50.0
    data["rules"] = {"lr": "none", "weight_decay": "none"}
    data["search"].pop("lr_multiplier")
    hot = SearchSpace.from_dict(data)
    reporter, reports = _run({"micro_batch_size": 64}, space=hot)
    assert reporter.status is TrialStatus.DIVERGED
    assert reporter.tally.steps < 50
    assert reports[-1][keys.OBJECTIVE] == 10 * TIME_CAP_S


def test_an_unreachable_target_is_censored_at_the_cap() -> None:
    # no sample budget: a fast machine spent the default one in 1.4 s, before the cap
    reporter, reports = _run({"micro_batch_size": 256}, target=1.01, max_time_s=2.0,
                             max_samples=None)  # fmt: skip
    assert reporter.status is TrialStatus.CENSORED
    assert "time cap" in reports[-1][keys.REASON]
    assert reports[-1][keys.TRAIN_S] >= 2.0  # at the cap, not before it (its end: the test's)
    assert reports[-1][keys.OBJECTIVE] == 20.0
    assert reports[-1][keys.TIME_TO_TARGET_S] is None


def test_oom_mid_training_ends_the_trial_as_infeasible_memory() -> None:
    reports: list[dict[str, Any]] = []
    settings = TrialSettings(Target(0.97), max_time_s=30.0)
    reporter = run_trial(DigitsOOMAtLargeBatch(), SPACE, settings, {"micro_batch_size": 128},
                         report_fn=reports.append)  # fmt: skip
    assert reporter.status is TrialStatus.INFEASIBLE_MEMORY
    assert "out of memory while training: CUDA out of memory" in reports[-1][keys.REASON]


def test_cpu_prescreen_with_a_budget_skips_a_config_that_cannot_fit() -> None:
    reporter, reports = _run({"micro_batch_size": 256}, memory_budget="1MiB")
    assert reporter.status is TrialStatus.INFEASIBLE_MEMORY
    assert "does not fit the budget of 1.00 MiB" in reports[-1][keys.REASON]
    assert reporter.tally.steps == 0  # no training time spent


def _custom_loop(config: dict[str, Any], target: float, space: SearchSpace, max_time_s: float):
    """A user's own loop, with raybatch's reporting helper doing clock, marks and statuses."""
    recipe = space.derive_from(config)
    torch.manual_seed(0)
    model = DIGITS.build_model()
    optimizer = raybatch.workload.build_optimizer(model.parameters(), recipe)
    loader = torch.utils.data.DataLoader(
        DIGITS.train_dataset(), batch_size=recipe.micro_batch_size, shuffle=True, drop_last=True
    )
    x_val, y_val = DIGITS.val_dataset().tensors  # type: ignore[attr-defined]
    reports: list[dict[str, Any]] = []
    run = TrialReporter(Target(target), eval_every_samples=1024, max_time_s=max_time_s,
                        report_fn=reports.append)  # fmt: skip
    with run:
        while not run.stopped:
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if run.add(samples=len(x), steps=1, loss=loss.item()):
                    break
                if run.eval_due:
                    with run.evaluating(), torch.no_grad():
                        accuracy = (model(x_val).argmax(1) == y_val).float().mean().item()
                    if run.report(accuracy):
                        break
    return run, reports


@pytest.mark.parametrize(
    ("target", "lr", "expected"),
    [(0.97, None, "reached"), (1.01, None, "censored"), (0.97, 50.0, "diverged")],
)
def test_custom_loop_helper_gives_the_same_statuses_as_the_built_in_loop(
    target: float, lr: float | None, expected: str
) -> None:
    space = SPACE
    if lr is not None:
        data = SPACE.model_dump()
        data["reference"]["lr"] = lr
        data["rules"] = {"lr": "none", "weight_decay": "none"}
        data["search"].pop("lr_multiplier")
        space = SearchSpace.from_dict(data)
    config = {"micro_batch_size": 64}
    # Only the censored case needs the cap to run out; the others end early on their own, and
    # a short cap would censor them on a loaded machine.
    cap = 3.0 if expected == "censored" else 60.0
    custom, custom_reports = _custom_loop(config, target, space, max_time_s=cap)
    built_in, built_in_reports = _run(config, target=target, space=space, max_time_s=cap)
    assert custom.status.value == built_in.status.value == expected
    assert set(custom_reports[-1]) == set(built_in_reports[-1])


@pytest.mark.slow
def test_trainable_in_a_real_tuner_reaches_target_and_survives_a_sibling_oom(
    ray_session: None, tmp_path: Path
) -> None:
    from ray import tune

    fn = raybatch.trainable(DigitsOOMAtLargeBatch(), SPACE, target=0.97, max_time_s=TIME_CAP_S,
                            max_samples=SAMPLE_BUDGET)  # fmt: skip
    tuner = tune.Tuner(
        raybatch.with_resources(fn, gpus_per_trial=0, cpus_per_trial=1),
        param_space={"micro_batch_size": tune.grid_search([64, 128]), "accumulation_steps": 1},
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="trial", verbose=0),
    )
    results = tuner.fit()
    assert results.num_errors == 0
    by_batch = {r.config["micro_batch_size"]: r.metrics for r in results}
    assert by_batch[64][keys.STATUS] == "reached"
    assert by_batch[64][keys.TIME_TO_TARGET_S] > 0
    assert by_batch[128][keys.STATUS] == "infeasible_memory"


@pytest.mark.slow
def test_world_size_two_trains_data_parallel_on_gloo_and_counts_both_workers(
    ray_session: None, tmp_path: Path
) -> None:
    import tempfile

    from ray import tune

    def train_dirs() -> set[Path]:
        return set(Path(tempfile.gettempdir()).glob("raybatch-train-*"))

    before = train_dirs()
    # A low target and a few steps' samples: what is tested is that both workers train and
    # are counted, not how well; data-parallel steps on gloo over 2 cores take a second each.
    fn = raybatch.trainable(DIGITS, SPACE, target=0.5, max_time_s=30, eval_every_samples=512,
                            max_samples=256 * 6)  # fmt: skip
    tuner = tune.Tuner(
        raybatch.with_resources(fn, gpus_per_trial=0),
        param_space={"micro_batch_size": 64, "accumulation_steps": 2, "world_size": 2},
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="ddp", verbose=0),
    )
    [result] = list(tuner.fit())
    metrics = result.metrics
    assert metrics[keys.STATUS] in ("reached", "censored"), metrics.get(keys.REASON)
    # The first report says the workers are placed, before any training: the hang clock's start.
    first = result.metrics_dataframe.iloc[0]
    assert first[keys.WORKERS_PLACED] and first[keys.STATUS] == "running"
    assert first[keys.STEPS] == 0
    assert metrics[keys.STEPS] > 0
    # One optimizer step consumes micro 64 x accumulation 2 on each of 2 workers.
    assert metrics[keys.SAMPLES_SEEN] == metrics[keys.STEPS] * 64 * 2 * 2
    assert train_dirs() <= before  # Ray Train's folder for the trial is gone with it


@pytest.mark.slow
def test_data_parallel_recipes_are_memory_gated_and_never_wait_for_missing_workers(
    ray_session: None, tmp_path: Path
) -> None:
    """World size 2 under a budget nothing fits: on CPUs every rank's gate is the same trace,
    decided in the trial before Ray Train starts a worker, and the trial ends
    ``infeasible_memory`` (what the searcher learns from), not ``error``. World size 4 on this
    3-CPU Ray cannot be placed: it ends at once, with the count, instead of waiting for a
    placement group until the hang guard."""
    from ray import tune

    fn = raybatch.trainable(DIGITS, SPACE, target=0.5, max_time_s=30, memory_budget="256KiB")
    tuner = tune.Tuner(
        raybatch.with_resources(fn, gpus_per_trial=0),
        param_space={"micro_batch_size": 64, "world_size": tune.grid_search([2, 4])},
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="dp_gate", verbose=0),
    )
    by_world = {r.config["world_size"]: r.metrics for r in tuner.fit()}
    gated = by_world[2]
    assert gated[keys.STATUS] == "infeasible_memory", gated.get(keys.REASON)
    assert "does not fit the budget of 256.00 KiB" in gated[keys.REASON]
    assert gated[keys.REASON].startswith("data-parallel run: ")
    unplaced = by_world[4]
    assert unplaced[keys.STATUS] == "error"
    assert unplaced[keys.REASON] == "cannot be placed: needs 4 CPUs, the cluster has 3"


def test_a_rank_that_ran_out_of_memory_ends_the_data_parallel_run_for_memory() -> None:
    """What Ray Train gives back when a rank's gate (a real probe, on GPUs) or its training ran
    out of memory, as the exception its worker raised or only as its text inside a Ray error,
    is read as a memory failure (``infeasible_memory``), never as an error of the recipe."""
    from raybatch.errors import WorkerMemoryError
    from raybatch.trial.failures import memory_failure

    raised = WorkerMemoryError("rank 1: micro batch 64 does not fit")
    wrapped = RuntimeError("Training failed")
    wrapped.__cause__ = raised
    assert memory_failure(wrapped) == "rank 1: micro batch 64 does not fit"
    from ray.exceptions import RayTaskError

    text = RayTaskError(
        "_RayTrainWorker__execute",
        "Traceback (most recent call last):\n  ...\nraybatch.errors.WorkerMemoryError: out of"
        " memory while training: CUDA out of memory",
        ValueError("the worker's exception, not deserialised"),
    )
    assert memory_failure(text) == "out of memory while training: CUDA out of memory"
    assert memory_failure(RuntimeError("a loader crashed")) is None


def test_a_data_parallel_workers_probe_counts_ddp_gradient_buckets() -> None:
    """The probe runs a plain step; DDP adds one copy of the trainable parameters per worker."""
    from raybatch.space.search_space import SearchSpace
    from raybatch.trial.wrapper import _ddp_overrun

    data = SPACE.model_dump()
    data["search"]["world_size"] = [1, 2]
    data["search"]["accumulation_steps"] = [1]
    space = SearchSpace.from_dict(data)
    buckets = sum(p.numel() * 4 for p in DIGITS.build_model().parameters())
    reserved = 10 * 2**20
    fits = TrialSettings(target=Target(0.5), gpu_budget_bytes=reserved + buckets)
    tight = TrialSettings(target=Target(0.5), gpu_budget_bytes=reserved + buckets - 1)
    assert _ddp_overrun(DIGITS, space.derive(64, world_size=2), fits, reserved) is None
    reason = _ddp_overrun(DIGITS, space.derive(64, world_size=2), tight, reserved)
    assert reason is not None and "DDP's gradient buckets add" in reason
    assert _ddp_overrun(DIGITS, space.derive(64), tight, reserved) is None  # one worker: no DDP


def test_the_ema_copy_of_the_model_counts_against_the_memory_budget() -> None:
    """With ``ema_decay`` the trial holds one more copy of the model than the step the
    estimate traces: a budget that a plain step fits with less than that copy to spare is
    too small for the EMA trial."""
    from raybatch.memory.estimator import MemoryEstimator
    from raybatch.memory.probe import model_bytes

    recipe = SPACE.derive(64)
    # As a CPU trial's gate builds it: the trace projected for the CPU.
    predicted = MemoryEstimator(DIGITS, recipe, cuda=False).prescreen(recipe, 2**40).predicted_bytes
    assert predicted is not None
    budget = predicted + model_bytes(DIGITS.build_model()) // 2
    plain, _ = _run({"micro_batch_size": 64}, memory_budget=budget, max_time_s=0.3)
    averaged, _ = _run(
        {"micro_batch_size": 64},
        memory_budget=budget,
        max_time_s=0.3,
        loop=LoopOptions(ema_decay=0.9),
    )
    assert plain.status is not TrialStatus.INFEASIBLE_MEMORY
    assert averaged.status is TrialStatus.INFEASIBLE_MEMORY, averaged.reason


def test_a_data_parallel_run_that_lost_a_worker_is_told_apart_from_a_failing_recipe() -> None:
    """A worker's actor or node died (Ray's errors, however Ray Train wraps them): Tune is to
    run the trial again; the recipe's own exception stays the trial's error."""
    from ray import exceptions as ray_errors
    from ray.train.base_trainer import TrainingFailedError

    from raybatch.trial.failures import lost_worker

    died = ray_errors.NodeDiedError("node 10.0.0.3 died")
    wrapped = TrainingFailedError("Training failed")
    wrapped.__cause__ = died
    assert lost_worker(wrapped) == "NodeDiedError: node 10.0.0.3 died"
    assert lost_worker(ray_errors.RayActorError()) is not None
    recipe_fault = TrainingFailedError("Training failed")
    recipe_fault.__cause__ = ValueError("bad shape")
    assert lost_worker(recipe_fault) is None


def test_a_confirmation_run_trains_to_its_meeting_level_not_to_the_target() -> None:
    """A race run's config carries the level its two recipes meet at (``meet_level``): the
    trial's target becomes that level, so it ends ``reached`` there, short of the target, and
    a run to the target of the same recipe takes longer."""
    config = {"micro_batch_size": 64, keys.SEED: 3}
    met, met_reports = _run({**config, keys.MEET_LEVEL: 0.5})
    whole, _ = _run(config)
    assert met.status is TrialStatus.REACHED and whole.status is TrialStatus.REACHED
    assert 0.5 <= met_reports[-1][keys.METRIC] < 0.97 <= whole.tally.metric
    assert met.tally.time_to_target_s is not None and whole.tally.time_to_target_s is not None
    assert met.tally.samples_seen < whole.tally.samples_seen
