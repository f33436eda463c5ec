"""Trials that all fail the same way stop the search early, with one clean message."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raybatch import keys
from raybatch.run.failfast import FailFast

from .userland import write_user_workload


class _Trial:
    """What FailFast reads of a Ray Tune trial: its name and config."""

    def __init__(self, name: str, micro: int = 32) -> None:
        self.name = name
        self.config = {keys.MICRO_BATCH_SIZE: micro, keys.ACCUMULATION_STEPS: 1}

    def __str__(self) -> str:
        return self.name


def _result(status: str, reason: str = "") -> dict[str, Any]:
    return {keys.STATUS: status, keys.REASON: reason, keys.ERROR_TRACEBACK: f"tb of {reason}"}


@pytest.fixture
def watcher(tmp_path: Path) -> Iterator[FailFast]:
    yield FailFast(tmp_path / "search.log", after=3)


def test_three_identical_failures_with_no_healthy_trial_stop_the_search(
    watcher: FailFast,
) -> None:
    for i in range(3):
        assert not watcher.stop_all()
        watcher.on_trial_result(1, [], _Trial(f"t{i}"), _result("error", "OSError: no data"))
    assert watcher.stop_all()
    assert watcher.tripped is not None and watcher.tripped.trial == "t0"
    summary = watcher.summary()
    assert "3 trial(s) failed with the same error" in summary and "OSError: no data" in summary
    assert str(watcher.log_path) in summary
    assert watcher.log_path.read_text().count("tb of OSError: no data") == 3


def test_failures_that_differ_or_follow_a_healthy_trial_do_not_stop_it(
    watcher: FailFast,
) -> None:
    for i, reason in enumerate(["ValueError: a", "ValueError: b", "KeyError: c", "ValueError: a"]):
        watcher.on_trial_result(1, [], _Trial(f"t{i}"), _result("error", reason))
    assert not watcher.stop_all()
    watcher.on_trial_result(1, [], _Trial("ok"), _result("reached"))
    for i in range(5):  # a recipe-dependent error, after a trial that trained fine
        watcher.on_trial_result(1, [], _Trial(f"u{i}"), _result("error", "KeyError: c"))
    assert not watcher.stop_all()


def test_running_reports_and_other_terminal_statuses_are_not_failures(watcher: FailFast) -> None:
    for status in ("running", "running", "infeasible_memory", "diverged"):
        watcher.on_trial_result(1, [], _Trial("t"), _result(status))
    watcher.on_trial_result(1, [], _Trial("plain"), {"loss": 0.3})  # a trainable of the user's
    assert watcher.failures == [] and not watcher.stop_all()


def test_a_restored_copy_shares_the_state_and_a_new_watch_starts_afresh(
    watcher: FailFast,
) -> None:
    """Ray Tune pickles its callbacks with the experiment and runs the unpickled copy."""
    import pickle

    copy = pickle.loads(pickle.dumps(watcher))
    for i in range(3):
        copy.on_trial_result(1, [], _Trial(f"t{i}"), _result("error", "OSError: x"))
    assert watcher.stop_all()
    assert not FailFast(watcher.log_path).stop_all()  # a resumed search counts again


def _cli_search(tmp_path: Path, fail: str, trials: int = 20) -> tuple[Any, float, Path]:
    write_user_workload(tmp_path / "user", fail=fail)
    run = tmp_path / "run"
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "raybatch", "search", "user/my_workload.py:workload",
         "--space", "user/space.yaml", "--target", "0.9", "--trials", str(trials),
         "--max-time-per-trial", "10", "--run-dir", str(run)],
        capture_output=True, text=True, cwd=tmp_path, check=False, timeout=300,
    )  # fmt: skip
    return proc, time.perf_counter() - start, run


@pytest.mark.slow
def test_a_model_that_cannot_be_built_stops_the_search_early_with_one_message(
    tmp_path: Path,
) -> None:
    proc, _seconds, run = _cli_search(tmp_path, fail="build_model")
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("raybatch: error:")]
    assert "RuntimeError: weights file blobs.pt not found" in errors[0]
    assert any(str(run / "search.log") in line for line in errors)
    assert "Traceback" not in proc.stdout + proc.stderr
    # The live progress table is printed, but no worker traceback: the output stays short.
    assert len((proc.stdout + proc.stderr).splitlines()) < 400
    log = (run / "search.log").read_text()
    assert "in build_model" in log and "weights file blobs.pt not found" in log
    launched = log.count("=== ")
    assert 3 <= launched <= 5, launched  # far fewer than the 20 trials asked for


@pytest.mark.slow
def test_a_workload_that_cannot_be_unpickled_in_the_workers_stops_the_search_early(
    tmp_path: Path,
) -> None:
    """The failure escapes into Ray (the trainable cannot be rebuilt), as a missing package."""
    proc, _seconds, run = _cli_search(tmp_path, fail="unpickle")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "ModuleNotFoundError: No module named 'blobs_private_dependency'" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    log = (run / "search.log").read_text()
    assert "blobs_private_dependency" in log and log.count("=== ") <= 5


def test_a_resumed_search_with_healthy_trials_before_never_stops_on_failures(
    tmp_path: Path,
) -> None:
    watcher = FailFast(tmp_path / "search.log", after=3, healthy=2)
    for i in range(5):
        watcher.on_trial_result(1, [], _Trial(f"t{i}"), _result("error", "OSError: flaky disk"))
    assert not watcher.stop_all()


def test_a_failed_save_of_tunes_state_goes_to_the_log_and_is_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ray Tune logs a save of its experiment state that raced a stopping trial with a full
    traceback; the user sees one note, the run's log keeps the traceback."""
    import logging

    from raybatch.run.failfast import TUNE_STATE_LOGGER, ray_errors_to

    logger = logging.getLogger(TUNE_STATE_LOGGER)
    propagated = logger.propagate
    log = tmp_path / "search.log"
    with ray_errors_to(log) as diverted:
        try:
            raise FileNotFoundError("tune/search/experiment_state.json")
        except FileNotFoundError:
            logger.error("Saving experiment state to storage failed with exception: ",
                         exc_info=True)  # fmt: skip
    assert diverted.tune_state_errors == 1
    assert "Traceback" in log.read_text() and "Traceback" not in capsys.readouterr().err
    assert logger.propagate == propagated and not logger.handlers
