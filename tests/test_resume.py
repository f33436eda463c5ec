"""Kill the driver mid-search, resume, and check nothing is lost or repeated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from raybatch.run import STUDY_NAME, read_trials_csv
from raybatch.searcher import STATUS_ATTR

TRIALS = 5


def _finished_trials(run_dir: Path) -> int:
    done = 0
    for result in (run_dir / "tune" / "search").glob("*/result.json"):
        lines = result.read_text().strip().splitlines()
        if lines and json.loads(lines[-1]).get("status") not in (None, "running"):
            done += 1
    return done


def _cli(*args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "raybatch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_resume_after_the_driver_is_killed_keeps_every_trial_once(how: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    driver = _cli(
        "search", "raybatch.examples.digits:workload", "--target", "0.97",
        "--trials", str(TRIALS), "--run-dir", str(run_dir), "--max-time-per-trial", "6",
        "--max-concurrent", "1", "--confirm-top", "1", "--confirm-seeds", "1", "--quiet",
        start_new_session=True,  # its own process group: SIGKILL takes its local Ray too
    )  # fmt: skip
    deadline = time.time() + 180
    while _finished_trials(run_dir) < 2 and time.time() < deadline and driver.poll() is None:
        time.sleep(0.3)
    assert _finished_trials(run_dir) >= 2, "the search never got going"
    if how == "sigint":
        driver.send_signal(signal.SIGINT)
        _, err = driver.communicate(timeout=120)
        assert driver.returncode == 130, err[-2000:]
        assert f"continue with `raybatch resume {run_dir}`" in err
    else:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    before = _finished_trials(run_dir)
    assert before < TRIALS

    resumed = _cli("resume", str(run_dir), "--quiet")
    out, err = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, err[-3000:]
    assert "best config:" in out

    rows = [r for r in read_trials_csv(run_dir / "trials.csv") if r["phase"] == "search"]
    assert len(rows) == TRIALS  # the total asked for
    assert len({r["trial_id"] for r in rows}) == TRIALS  # none repeated
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{run_dir / 'optuna.db'}")
    launched = [t for t in study.trials if t.user_attrs.get(STATUS_ATTR) != "prescreened_out"]
    complete = [t for t in launched if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(t.user_attrs["tune_trial_id"] for t in complete) == sorted(
        r["trial_id"] for r in rows
    )
    running = [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert running == []  # the study and the Ray experiment agree
