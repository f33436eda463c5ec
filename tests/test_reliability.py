"""Failures inside trials end those trials with a reason; bad input never leaves a traceback."""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import raybatch
from raybatch import SearchSpace, Target, keys
from raybatch.cli.app import app
from raybatch.errors import RaybatchError, RunDirError, SpaceError
from raybatch.results.rows import read_trials_csv
from raybatch.run.rundir import STUDY_NAME
from raybatch.status import TrialStatus, penalty
from raybatch.trial.settings import TrialSettings
from raybatch.trial.wrapper import run_trial
from raybatch.tuning.options import SearchOptions
from raybatch.tuning.study import STATUS_ATTR

from .conftest import minimal_space
from .workloads import (
    BrokenModelWorkload,
    DigitsOOMAtMaxBatch,
    HangsAtMaxBatch,
    KillsItsWorkerOnce,
    NaNMetricWorkload,
    SlowStepWorkload,
)

SPACE = raybatch.load_space("digits_cnn_sgd")


def _trial(workload: Any, **settings: Any) -> tuple[Any, list[dict[str, Any]]]:
    reports: list[dict[str, Any]] = []
    options = TrialSettings(Target(0.97), **({"max_time_s": 20.0} | settings))
    reporter = run_trial(
        workload, SPACE, options, {"micro_batch_size": 64}, report_fn=reports.append
    )
    return reporter, reports


def test_a_model_that_raises_when_built_ends_the_trial_as_error() -> None:
    reporter, reports = _trial(BrokenModelWorkload())
    assert reporter.status is TrialStatus.ERROR
    assert reports[-1][keys.REASON] == (
        "RuntimeError: layer sizes do not match the checkpoint (before training)"
    )
    assert "build_model" in reports[-1][keys.ERROR_TRACEBACK]


def test_a_nan_validation_metric_ends_the_trial_as_diverged() -> None:
    reporter, reports = _trial(NaNMetricWorkload())
    assert reporter.status is TrialStatus.DIVERGED
    assert reports[-1][keys.REASON] == "validation metric is nan"


def test_a_trial_running_past_its_time_cap_is_censored_soon_after() -> None:
    reporter, reports = _trial(SlowStepWorkload(), max_time_s=1.0)
    assert reporter.status is TrialStatus.CENSORED
    # Stopped at the first step past the cap, whatever the machine's speed: each step sleeps
    # 0.3 s, so after 4 steps it had trained 1.2 s and a fifth would have run past the cap.
    assert reports[-1][keys.TRAIN_S] >= 1.0
    assert reporter.tally.steps <= math.ceil(1.0 / SlowStepWorkload.STEP_SLEEP_S)


@pytest.mark.parametrize("where", ["/proc/raybatch-run", "/sys/raybatch-run"])
def test_an_unwritable_run_directory_fails_before_any_trial(where: str) -> None:
    with pytest.raises(RunDirError, match=f"{where}: \\(directory\\): cannot write the run"):
        raybatch.search(BrokenModelWorkload(), SPACE, 0.97, where, SearchOptions(trials=1))


def test_a_run_directory_below_a_file_fails_before_any_trial(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(RunDirError, match="cannot write the run"):
        raybatch.search(
            BrokenModelWorkload(), SPACE, 0.97, blocker / "run", SearchOptions(trials=1)
        )


yaml_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5000)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    section=st.sampled_from(["reference", "rules", "search", "warmup", "limits", "name", "extra"]),
    field=st.sampled_from(["batch_size", "lr", "optimizer", "micro_batch_size", "low", "x"]),
    value=yaml_values,
)
def test_mutated_space_files_give_only_space_errors(
    section: str, field: str, value: Any, tmp_path: Path
) -> None:
    data = minimal_space()
    if isinstance(data.get(section), dict):
        data[section] = {**data[section], field: value}
    else:
        data[section] = value
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        SearchSpace.from_yaml(path)
    except SpaceError as exc:
        assert str(path) in str(exc)


@settings(max_examples=150)
@given(text=st.text(max_size=200))
@example(text="?")  # YAML for {None: None}: found by this test, a TypeError before the fix
@example(text="1: 2")
def test_random_text_as_a_space_file_gives_only_space_errors(text: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "random.yaml"
        path.write_text(text)
        with contextlib.suppress(SpaceError):
            SearchSpace.from_yaml(path)


@settings(max_examples=100, deadline=None)
@given(
    args=st.lists(
        st.sampled_from(
            [
                "--batch",
                "-b",
                "--accum",
                "--world-size",
                "--json",
                "--lr-multiplier",
                "0",
                "-3",
                "64",
                "1e9",
                "x",
                "nan",
                "digits_cnn_sgd",
                "nope",
                "--wat",
            ]
        ),
        max_size=6,
    )
)
def test_random_cli_arguments_never_produce_a_traceback(args: list[str]) -> None:
    result = CliRunner().invoke(app, ["space", *args])
    assert result.exit_code in (0, 2)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output


SAMPLE_CAP = 100_000
"""A search trial's sample cap here (70 epochs of digits: a recipe that reaches gets there far
sooner), with a time cap no loaded machine reaches."""


def test_a_killed_trial_worker_is_retried_and_counted_once(
    ray_session: None, tmp_path: Path
) -> None:
    marker = tmp_path / "killed-once"
    run_dir = tmp_path / "run"
    workload = KillsItsWorkerOnce(str(marker))
    # The first trial, the one asked to measure the time model, is the one killed: its retry
    # is asked again.
    # A sample cap bounds what cannot reach, not a time cap: a loaded machine changes nothing.
    options = SearchOptions(trials=3, max_time_s=120, max_samples=SAMPLE_CAP, gpus_per_trial=0,
                            confirm_seeds=0, max_failures=2, max_concurrent=1)  # fmt: skip
    result = raybatch.search(workload, SPACE, 0.97, run_dir, options, verbose=0)
    assert marker.exists()  # a worker really was SIGKILLed
    rows = [r for r in read_trials_csv(run_dir / "trials.csv") if r["phase"] == "search"]
    assert len(rows) == 3 and len({r["trial_id"] for r in rows}) == 3
    assert all(r["status"] in ("reached", "capped", "censored") for r in rows)
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{run_dir / 'optuna.db'}")
    # Every launched trial carries its Tune trial; the plan's points the 3 trials did not
    # reach were queued, and are closed as not run (no ghost left waiting).
    launched = [t for t in study.trials if "tune_trial_id" in t.user_attrs]
    assert len(launched) == 3
    assert optuna.trial.TrialState.WAITING not in {t.state for t in study.trials}
    ended = {"capped": optuna.trial.TrialState.PRUNED}  # the scheduler's stop, Optuna's word
    for t in launched:
        assert t.state == ended.get(t.user_attrs[STATUS_ATTR], optuna.trial.TrialState.COMPLETE)
    assert result.best is not None


@pytest.mark.slow
def test_an_oom_in_one_of_four_concurrent_trials_leaves_the_others_running(
    ray_session: None, tmp_path: Path
) -> None:
    """Four trials at once; the max-batch baseline (256) runs out of memory mid-training.

    No memory budget on this CPU machine, so nothing is pre-screened: only the real OOM can
    teach the searcher. Capping is off so that "finish" means "ran to its own end". The
    space's LR is fixed, so the plan runs the max batch once (not at four LRs at once).
    """
    run_dir = tmp_path / "run"
    data = SPACE.model_dump()
    data["search"]["lr_multiplier"] = None
    options = SearchOptions(trials=6, max_time_s=120, max_samples=SAMPLE_CAP, gpus_per_trial=0,
                            cpus_per_trial=0.5, max_concurrent=4, capping=False, confirm_top=1,
                            confirm_seeds=1, seed=9, prior=False)  # fmt: skip
    raybatch.search(DigitsOOMAtMaxBatch(), SearchSpace.from_dict(data), 0.97, run_dir, options,
                    verbose=0)  # fmt: skip
    rows = read_trials_csv(run_dir / "trials.csv")
    search = [r for r in rows if r["phase"] == "search"]
    oom = [r for r in search if r["status"] == "infeasible_memory"]
    assert len(search) == 6
    # The baseline, and any 256 TPE launched beside it before its OOM was told; nothing else.
    assert oom and {int(r["micro_batch_size"]) for r in oom} == {256}
    assert all("out of memory while training" in r["reason"] for r in oom)
    others = [r for r in search if r not in oom]
    assert len(others) >= 4
    # Each ran to its own end: the target, or its own sample or time cap (four trials on a
    # loaded machine's two cores can train past 120 s: one did beside two busy loops); none
    # was taken down with the trial that ran out of memory.
    ends = [(r["status"], r["reason"]) for r in others]
    assert all(s == "reached" or (s == "censored" and ("sample budget" in why or "time cap" in why))
               for s, why in ends), ends  # fmt: skip
    assert any(s == "reached" for s, _ in ends), ends
    # Taught, not hidden: the study holds each as infeasible; anything proposed afterwards
    # needing as much memory was rejected before launch, naming an OOM trial.
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{run_dir / 'optuna.db'}")
    told = [t for t in study.trials if t.user_attrs.get(STATUS_ATTR) == "infeasible_memory"]
    assert len(told) == len(oom) and all(t.constraints["memory"] > 0 for t in told)
    assert all(t.value == penalty(options.max_time_s) for t in told)
    oom_ids = {r["trial_id"] for r in oom}
    learned = [r for r in rows if r["phase"] == "prescreen"]
    assert all(int(r["micro_batch_size"]) == 256 and any(i in r["reason"] for i in oom_ids)
               for r in learned)  # fmt: skip
    # The confirmation does not run the baseline again just to watch it run out of memory.
    assert not [r for r in rows if r["phase"] == "confirmation" and r["status"] != "reached"]


@pytest.mark.slow
def test_a_trial_hung_inside_a_step_is_stopped_by_the_driver_and_the_search_goes_on(
    ray_session: None, tmp_path: Path
) -> None:
    """The max-batch baseline blocks forever in its third step; the other trials finish.

    The space's LR is fixed, so the plan tries the max batch once (not at four LRs).
    """
    run_dir = tmp_path / "run"
    data = SPACE.model_dump()
    data["search"]["lr_multiplier"] = None
    space = SearchSpace.from_dict(data)
    # The window (5 + 10 s) opens at a trial's first report: three workers' start-up on two
    # busy cores (over 20 s seen) has the start-up allowance on top, so only the trial that
    # hangs after reporting waits out its 15 s.
    options = SearchOptions(trials=3, max_time_s=5, hang_grace_s=10, gpus_per_trial=0,
                            cpus_per_trial=0.5, max_concurrent=3, capping=False,
                            confirm_seeds=0, prior=False)  # fmt: skip
    started = time.monotonic()
    result = raybatch.search(HangsAtMaxBatch(), space, 0.97, run_dir, options, verbose=0)
    assert time.monotonic() - started < 240  # not the hour the step would take
    search = [r for r in read_trials_csv(run_dir / "trials.csv") if r["phase"] == "search"]
    hung = [r for r in search if r["reason"].startswith("hung:")]
    assert [(int(r["micro_batch_size"]), r["status"]) for r in hung] == [(256, "censored")]
    assert "stopped by the driver" in hung[0]["reason"]
    # The others ended by themselves: at the target, or (on a loaded machine) at their own cap.
    others = [(r["status"], r["reason"]) for r in search if r is not hung[0]]
    assert all(s == "reached" or (s == "censored" and "cap" in why) for s, why in others), others
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{run_dir / 'optuna.db'}")
    told = [t for t in study.trials if t.user_attrs.get("tune_trial_id") == hung[0]["trial_id"]]
    assert told[0].user_attrs[STATUS_ATTR] == "censored"
    assert told[0].value == penalty(options.max_time_s)
    # The search went on to its verdict: a winner where another trial reached the target (on
    # a slow or loaded machine both may end at their 5 s cap first: no winner, said, no error).
    assert (result.best is not None) == any(s == "reached" for s, _ in others), others


def test_errors_raised_on_purpose_share_one_base() -> None:
    """Every exception class of ``raybatch.errors`` is a ``RaybatchError`` (``except
    RaybatchError`` catches every refusal on purpose), and the package raises no exception
    class of its own defined anywhere else."""
    import ast
    import inspect

    import raybatch
    import raybatch.errors as errors

    ours = [c for _, c in inspect.getmembers(errors, inspect.isclass)
            if issubclass(c, BaseException) and c.__module__ == errors.__name__]  # fmt: skip
    assert len(ours) >= 15 and SpaceError in ours and RunDirError in ours
    assert all(issubclass(c, RaybatchError) for c in ours), ours
    root = Path(raybatch.__file__).parent
    elsewhere = [
        f"{path.relative_to(root)}: {node.name}"
        for path in root.rglob("*.py")
        if path.name != "errors.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(
            getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception"))
            for b in node.bases
        )
    ]
    assert elsewhere == []
