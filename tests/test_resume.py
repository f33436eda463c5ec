"""Kill the driver mid-search, resume, and check nothing is lost or repeated."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
from ray.tune import Callback

from raybatch.export import load_best
from raybatch.results.rows import read_trials_csv
from raybatch.run.driver import analyze_run
from raybatch.run.rundir import STUDY_NAME
from raybatch.run.tune_state import (
    CUT_FOLDER,
    WHOLE_FOLDER,
    KeepWhole,
    check_restorable,
    keep_whole,
    restore_whole,
    save_on_change,
    set_aside_cut_sessions,
)
from raybatch.tuning.sessions import sessions_recorded
from raybatch.tuning.study import STATUS_ATTR


def _finished_ids(run_dir: Path) -> set[str]:
    """Search trials Ray Tune's saved state or the study holds as finished (what a kill must not
    lose).

    The newest ``experiment_state-*.json`` is Tune's own record, saved at every step; a
    trial's ``result.json`` alone cannot tell a capped trial (stopped while running) apart
    from one still running. Newest by name, as Tune itself picks it: a resume copies the
    older files again, so their modification times say nothing.
    """
    told = set(_told_ids(run_dir))  # the driver's own record, written as each trial ends
    states = list((run_dir / "tune" / "search").glob("experiment_state-*.json"))
    if not states:
        return told
    try:
        data = json.loads(max(states).read_text())
    except (json.JSONDecodeError, OSError):  # being written right now; ask again
        return told
    trials = [json.loads(entry[0]) for entry in data["trial_data"]]
    searched = [t for t in trials if "candidate" not in (t.get("config") or {})]  # not a race run
    return told | {t["trial_id"] for t in searched if t["status"] in ("TERMINATED", "ERROR")}


def _told_ids(run_dir: Path, study: str = "raybatch") -> list[str]:
    """Search trials the driver told its study as ended, one entry per record (a trial Tune ran
    again after a kill may be recorded twice): Tune's saved state can lag them by a whole phase
    on a loaded machine (a kill after the third trial was told found two there)."""
    db = run_dir / "optuna.db"
    if not db.is_file():
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as c:
            rows = c.execute(
                "SELECT a.value_json FROM trials t JOIN trial_user_attributes a"
                " ON a.trial_id = t.trial_id AND a.key = 'tune_trial_id'"
                " JOIN studies s ON s.study_id = t.study_id"
                " WHERE t.state IN ('COMPLETE', 'PRUNED') AND s.study_name = ?",
                (study,),
            ).fetchall()
    except sqlite3.Error:  # being created or written right now; ask again
        return []
    return [json.loads(value) for (value,) in rows]


def _cli(*args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "raybatch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,  # type: ignore[arg-type]
    )


def _kill_when(
    driver: subprocess.Popen[str],
    ready: Callable[[], bool],
    rng: random.Random,
    run_dir: Path,
    finished: set[str],
    how: signal.Signals = signal.SIGKILL,
    group: bool = False,
    latest_s: float = 0.5,
) -> str:
    """Stop the driver a random moment (up to ``latest_s``) after ``ready()`` holds: SIGKILL to
    the driver alone (``kill -9 PID``: nothing of its local Ray may outlive it), or SIGINT or
    SIGTERM to the driver alone (Ctrl-C, or a scheduler's stop: it must stop cleanly, exit 130
    and say how to continue); with ``group``, the signal goes to its whole process group (as a
    terminal's ``kill -- -PID`` or Slurm sends it: its Ray ends too, a SIGTERMed driver must
    end at once saying so, and leave no process).

    ``finished`` collects every trial seen finished on the way: a read right after the kill
    may meet a state file the kill cut short. Returns what the driver said on stderr (nothing
    after SIGKILL).
    """
    deadline = time.time() + 240
    while not ready() and time.time() < deadline and driver.poll() is None:
        finished |= _finished_ids(run_dir)
        time.sleep(0.1)
    if not (ready() and driver.poll() is None):
        _, err = driver.communicate(timeout=60)
        raise AssertionError(
            f"the point to kill at was never reached: exit {driver.returncode}, {err[-3000:]}"
        )
    time.sleep(rng.uniform(0.0, latest_s))
    finished |= _finished_ids(run_dir)
    err = ""
    if how in (signal.SIGINT, signal.SIGTERM):  # SIGTERM: how Slurm and Kubernetes stop a job
        if group:
            os.killpg(driver.pid, how)
        else:
            driver.send_signal(how)
        _, err = driver.communicate(timeout=120)
        assert driver.returncode == 130, err[-2000:]
        assert "SIGTERM received" not in err  # Ray's C++ stack dump and abort (exit 134)
        assert f"continue with `raybatch resume {run_dir}`" in err
        assert "Tuner.restore(" not in err  # one way to continue, raybatch's
        # To the driver alone its Ray stays up and stops the trials gracefully; to the whole
        # group its Ray is gone too, and it stops at once.
        assert ("raybatch: stopped at once (SIGTERM reached the Ray" in err) == group, err[-2000:]
        if group:  # nothing of its Ray left: no orphaned trial still training
            deadline = time.time() + 10
            while _in_session(driver.pid) and time.time() < deadline:
                time.sleep(0.2)
            assert not _in_session(driver.pid), _in_session(driver.pid)
    elif group:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    else:  # kill -9 of the driver alone: nothing of its local Ray may outlive it
        driver.kill()
        driver.wait(timeout=30)
        deadline = time.time() + 30
        while _in_session(driver.pid) and time.time() < deadline:
            time.sleep(0.2)
        assert not _in_session(driver.pid), _in_session(driver.pid)
    finished |= _finished_ids(run_dir)
    return err


def _in_session(sid: int) -> list[str]:
    """The live processes of session ``sid`` (a driver started with ``start_new_session``),
    their names; zombies, which hold nothing, left out."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :]
        fields = rest.split()
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(f"{stat.parent.name} {name}")
    return found


def _sessions(run_dir: Path) -> int:
    """Driver sessions the run's study has recorded the start of."""
    return len(sessions_recorded(run_dir / "optuna.db", STUDY_NAME))


def _told(run_dir: Path, study: str = "raybatch") -> int:
    """Launched trials the driver has told the Optuna study about (written as they end).

    When to kill is read here, not from Ray Tune's experiment state in storage: Tune copies
    that from its staging folder in background syncs, which can lag a whole phase behind on a
    loaded machine, so the driver could finish before the test saw the point to kill at.
    """
    return len(_told_ids(run_dir, study))


PACED_DIGITS = """
import time

from raybatch.examples.digits import DigitsWorkload


class PacedDigits(DigitsWorkload):
    # Every step 40 ms longer: a trial lasts seconds on any machine, so a kill aimed between
    # two trials lands there (the plain digits CNN reached in 0.6 s and a search ended
    # within the half second a kill may wait).
    def loss(self, model, batch):
        time.sleep(0.04)
        return super().loss(model, batch)


workload = PacedDigits()
"""
"""A user's workload file: the bundled digits CNN, paced."""


@pytest.mark.slow
def test_killed_at_three_points_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """Stopped by SIGTERM to the driver alone after the first trial (as Kubernetes stops a pod:
    taken as Ctrl-C, its Ray left running to stop the trials gracefully), SIGKILLed in
    mid-search and once the search's trials have all ended (as the confirmation starts or
    runs); resumed each time.

    Every trial that had finished before a kill is in the final record exactly once, the
    total is what was asked, and ``best_config.yaml`` is what a fresh analysis of the stored
    trials gives.
    """
    trials, rng = 3, random.Random(6)
    run_dir = tmp_path / "run"
    (tmp_path / "paced.py").write_text(PACED_DIGITS)
    search = (
        "search", f"{tmp_path / 'paced.py'}:workload", "--target", "0.97",
        "--trials", str(trials), "--run-dir", str(run_dir), "--max-time-per-trial", "8",
        "--max-concurrent", "1", "--confirm-top", "2", "--confirm-seeds", "1", "--quiet",
        # Every trial trains to the target (no capping, no pause), and every pair is within
        # the zone: the race has two recipes that reached to run, whatever the times; trials
        # end one by one, where the kills come (pauses: the next test).
        "--no-capping", "--no-pause", "--zone", "100",
    )  # fmt: skip
    finished_before_kills: set[str] = set()
    # Each point also waits for its own session's record: a resume killed before it recorded
    # its start (the first session's graceful stop can tell the second trial) ran nothing.
    points = [
        lambda: _told(run_dir) >= 1,
        lambda: _told(run_dir) >= 2 and _sessions(run_dir) >= 2,
        # Every search trial told: the race is next or under way. Not "a race run has ended":
        # the second run, capped at slack x the first on its seed, and the verdict can end within
        # the half second a kill may wait (CI found best_config.yaml written), so this kill comes
        # at once, with the race's two runs, one at a time, all that is left.
        lambda: _told(run_dir) >= trials and _sessions(run_dir) >= 3,
    ]
    waits = [0.5, 0.5, 0.0]
    runs = [search, ("resume", str(run_dir)), ("resume", str(run_dir))]
    signals = [signal.SIGTERM, signal.SIGKILL, signal.SIGKILL]
    said = []
    for point, args, how, wait in zip(points, runs, signals, waits, strict=True):
        driver = _cli(*args, start_new_session=True)  # its group holds its local Ray too
        said.append(_kill_when(driver, point, rng, run_dir, finished_before_kills, how,
                               latest_s=wait))  # fmt: skip
    # 3 trials, fewer than the opening's 5 points: the first stop names the opening, or the
    # confirmation where a fast machine ended the search within the half second it may wait.
    first_stop = r"search interrupted in the opening after \d of 3 trials|confirmation was inter"
    assert re.search(first_stop, said[0]), said[0]
    assert len(finished_before_kills) == trials  # the last kill came after the search phase
    assert not (run_dir / "best_config.yaml").exists()  # ... and before the end

    resumed = _cli("resume", str(run_dir), "--quiet", start_new_session=True)
    out, err = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, err[-3000:]
    assert "best config:" in out
    # It ended at once after its last line, its Ray left to end with it: nothing is left.
    deadline = time.time() + 30
    while _in_session(resumed.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not _in_session(resumed.pid), _in_session(resumed.pid)
    # --quiet drops Ray's table, not raybatch's own lines: the race says what it runs.
    assert re.search(r"raybatch: race run \d+: ", err)
    # It says at once what it keeps: every search trial and the race's runs that had ended.
    kept = re.search(r"raybatch: resuming .*: (\d+) run\(s\) had ended and are kept", err)
    assert kept and int(kept.group(1)) >= trials, err[:2000]
    # The time model was measured inside one of the search's trials (all of them finished
    # before the last kill), kept in the searcher's checkpoint, and recorded at the end.
    assert "time model measured in trial " in out
    stored_prior = json.loads((run_dir / "prior.json").read_text())
    assert stored_prior["trial_id"] in finished_before_kills
    assert (load_best(run_dir).provenance.prior or {})["noise_scale"] == stored_prior["noise_scale"]

    rows = [r for r in read_trials_csv(run_dir / "trials.csv") if r["phase"] == "search"]
    assert sorted(r["trial_id"] for r in rows) == sorted(finished_before_kills)
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{run_dir / 'optuna.db'}")
    ended = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)  # capped: pruned
    complete = [t for t in study.trials if t.state in ended
                and t.user_attrs.get(STATUS_ATTR) != "prescreened_out"]  # fmt: skip
    assert sorted(t.user_attrs["tune_trial_id"] for t in complete) == sorted(finished_before_kills)
    ghosts = [t for t in study.trials if t.state in (optuna.trial.TrialState.RUNNING,
                                                    optuna.trial.TrialState.WAITING)]  # fmt: skip
    assert ghosts == []  # the study and the Ray experiment agree; nothing queued for ever
    stored, fresh = load_best(run_dir), analyze_run(run_dir)
    assert fresh is not None
    assert stored.config == fresh.config
    assert replace(stored.provenance, created=None) == replace(fresh.provenance, created=None)
    # What the user paid is counted within the four driver sessions, never across the time the
    # run lay killed between them.
    sessions = sessions_recorded(run_dir / "optuna.db", STUDY_NAME)
    assert len(sessions) == 4 and sessions == sorted(sessions)
    spans = [(float(r["started_at"]), float(r["started_at"]) + float(r["held_s"] or 0))
             for r in read_trials_csv(run_dir / "trials.csv") if r["started_at"]]  # fmt: skip
    # The time it lay killed: from the last run's end before each resume to the resume. A run
    # the kill cut short and Tune ran again after the resume ends after it: it counts from the
    # resume (raybatch.results.cost.wall_clock), not from its first start.
    idle = [(max((e for _, e in spans if e < s), default=s), s) for s in sessions[1:]]
    lost, reach = 0.0, 0.0  # their union (a resume killed before any run ended adds none)
    for end, resumed_at in idle:
        lost += max(0.0, resumed_at - max(end, reach))
        reach = max(reach, resumed_at)
    wall = stored.provenance.search_cost and stored.provenance.search_cost.wall_s
    whole = max(e for _, e in spans) - min(b for b, _ in spans)
    assert wall is not None and wall <= whole - lost + 1e-6


@pytest.mark.slow
def test_killed_mid_search_with_trials_paused_resumes_every_trial_once(tmp_path: Path) -> None:
    """A search SIGKILLed (its whole group) mid-search, its scheduler pausing trials behind at
    a rung (the default): Tune restores the paused ones, they go on from their saves or end
    capped, and the finished run holds every trial once, in its rows and its study alike, with
    no ghost left in the study. (When it is paused is the scheduler's own decision: the
    restore of a paused trial is proved in tests/test_promotion.py.)"""
    trials, run_dir = 6, tmp_path / "run"
    driver = _cli(
        "search", "raybatch.examples.tabular:workload", "--target", "0.87", "--trials",
        str(trials), "--max-concurrent", "2", "--max-time-per-trial", "20", "--confirm-seeds",
        "0", "--no-prior", "--run-dir", str(run_dir), "--quiet", start_new_session=True,
    )  # fmt: skip
    seen: set[str] = set()
    ready = lambda: _told(run_dir) >= 2  # noqa: E731
    _kill_when(driver, ready, random.Random(2), run_dir, seen, signal.SIGKILL, group=True)
    resumed = _cli("resume", str(run_dir), "--quiet")
    _, err = resumed.communicate(timeout=400)
    assert resumed.returncode in (0, 1), err[-3000:]  # 1: no recipe reached (said, not lost)
    rows = [r for r in read_trials_csv(run_dir / "trials.csv") if r["phase"] == "search"]
    assert len(rows) == trials and len({r["trial_id"] for r in rows}) == trials
    assert seen <= {r["trial_id"] for r in rows}
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{run_dir / 'optuna.db'}")
    ended = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    told = [t.user_attrs["tune_trial_id"] for t in study.trials if t.state in ended
            and t.user_attrs.get(STATUS_ATTR) != "prescreened_out"]  # fmt: skip
    assert sorted(told) == sorted(r["trial_id"] for r in rows)
    ghosts = [t for t in study.trials if t.state in (optuna.trial.TrialState.RUNNING,
                                                    optuna.trial.TrialState.WAITING)]  # fmt: skip
    assert ghosts == []


def test_a_first_session_cut_short_by_a_kill_resumes_from_the_whole_copy(tmp_path: Path) -> None:
    """A search SIGKILLed in its first session, its Tune state then cut short as a kill during
    Tune's copy (or a full disk) leaves it: it could not be resumed at all (nothing older to
    restore). Now the resume puts the state back from the copy kept at each step, says so,
    and finishes the search, every trial once."""
    run_dir = tmp_path / "run"
    driver = _cli(
        "search", "raybatch.examples.tabular:workload", "--target", "0.87", "--trials", "3",
        "--max-concurrent", "1", "--max-time-per-trial", "20", "--confirm-seeds", "0",
        "--no-prior", "--run-dir", str(run_dir), "--quiet",
        "--no-pause",  # trials end one by one: paused ones are told together near the end
        start_new_session=True,
    )  # fmt: skip
    seen: set[str] = set()
    # Killed at once after the first trial is told: two trials and the write-up are left (a
    # fast machine ran a second trial and wrote the run up within a half-second wait).
    _kill_when(driver, lambda: _told(run_dir) >= 1, random.Random(1), run_dir, seen, latest_s=0.0)
    experiment = run_dir / "tune" / "search"
    assert len(list(experiment.glob("experiment_state-*.json"))) == 1  # the first session's
    for state in experiment.glob("*-state-*"):
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # cut by the copy
    resumed = _cli("resume", str(run_dir))
    out, err = resumed.communicate(timeout=400)
    assert resumed.returncode in (0, 1), err[-3000:]
    assert "put back from its whole copy" in out, out[-3000:]
    rows = [r for r in read_trials_csv(run_dir / "trials.csv") if r["phase"] == "search"]
    assert len(rows) == 3 and len({r["trial_id"] for r in rows}) == 3


def test_a_tune_session_cut_short_by_a_kill_is_set_aside_before_restore(tmp_path: Path) -> None:
    """A SIGKILL during Tune's copy into storage leaves the newest session's pickle truncated;
    restoring would load it and fail. That session is moved aside, the whole one stays."""
    state = pickle.dumps({"counter": 3, "searcher": list(range(50))})
    old, new = "2026-01-01_10-00-00", "2026-01-01_10-05-00"
    for session, searcher_bytes in ((old, state), (new, state[: len(state) // 2])):
        (tmp_path / f"experiment_state-{session}.json").write_text(json.dumps({"trial_data": []}))
        (tmp_path / f"search_gen_state-{session}.json").write_bytes(searcher_bytes)
    assert set_aside_cut_sessions(tmp_path) == [new]
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        f"experiment_state-{old}.json",
        f"search_gen_state-{old}.json",
    ]
    assert (tmp_path / CUT_FOLDER / f"search_gen_state-{new}.json").read_bytes() == state[
        : len(state) // 2
    ]
    # A newest session missing a kind its elders had is cut short too; a whole one stays.
    (tmp_path / f"experiment_state-{new}.json").write_text("{}")
    assert set_aside_cut_sessions(tmp_path) == [new]
    (tmp_path / f"experiment_state-{new}.json").write_text("{}")
    (tmp_path / f"search_gen_state-{new}.json").write_bytes(state)
    assert set_aside_cut_sessions(tmp_path) == []


def test_a_first_session_cut_short_is_refused_naming_the_file(tmp_path: Path) -> None:
    """A kill during Tune's copy in the search's first session leaves no whole state to fall
    back on: resume says so at once, naming the file, instead of Tune's unpickling error."""
    from raybatch.errors import RunDirError

    experiment = tmp_path / "run" / "tune" / "search"
    experiment.mkdir(parents=True)
    state = pickle.dumps({"searcher": list(range(50))})
    session = "2026-01-01_10-00-00"
    (experiment / f"experiment_state-{session}.json").write_text(json.dumps({"trial_data": []}))
    (experiment / f"search_gen_state-{session}.json").write_bytes(state)
    check_restorable(experiment, tmp_path / "run")  # whole: nothing to say
    (experiment / f"search_gen_state-{session}.json").write_bytes(state[: len(state) // 2])
    assert set_aside_cut_sessions(experiment) == []  # nothing older to restore instead
    with pytest.raises(RunDirError) as refused:
        check_restorable(experiment, tmp_path / "run")
    message = str(refused.value)
    assert f"tune/search/search_gen_state-{session}.json: cut short" in message
    assert "cannot be resumed" in message and "optuna.db" in message


def test_a_session_cut_short_is_put_back_whole_from_the_copy_kept_at_each_step(
    tmp_path: Path,
) -> None:
    """Tune saves its state whole in its staging folder, then copies it into the run: a kill or
    a full disk during that copy cut the newest session, and in the search's first session
    there was nothing older to restore. The driver keeps a whole copy at each step, and a
    resume puts the cut session back from it, every file of it (one step's state)."""
    staging, experiment = tmp_path / "staging", tmp_path / "run" / "tune" / "search"
    staging.mkdir()
    experiment.mkdir(parents=True)
    session = "2026-01-01_10-00-00"
    state = pickle.dumps({"searcher": list(range(50))})
    (staging / f"experiment_state-{session}.json").write_text(json.dumps({"trial_data": [1]}))
    (staging / f"searcher-state-{session}.pkl").write_bytes(state)
    assert keep_whole(staging, experiment) is True
    assert keep_whole(staging, experiment) is False  # unchanged: not copied again
    (staging / f"searcher-state-{session}.pkl").write_bytes(state[:10])  # mid-write
    assert keep_whole(staging, experiment) is False  # a cut file is never the copy
    kept = experiment / WHOLE_FOLDER / "state" / f"searcher-state-{session}.pkl"
    assert kept.read_bytes() == state
    # The run's own files: the experiment state newer, the searcher's cut short by the copy.
    (experiment / f"experiment_state-{session}.json").write_text(json.dumps({"trial_data": [1, 2]}))
    (experiment / f"searcher-state-{session}.pkl").write_bytes(state[: len(state) // 2])
    assert restore_whole(experiment) == sorted(
        [f"experiment_state-{session}.json", f"searcher-state-{session}.pkl"]
    )
    assert (experiment / f"searcher-state-{session}.pkl").read_bytes() == state
    assert json.loads((experiment / f"experiment_state-{session}.json").read_text()) == {
        "trial_data": [1]  # the copy's step: both files of one step, never a mix
    }
    assert (experiment / CUT_FOLDER / f"experiment_state-{session}.json").exists()
    check_restorable(experiment, tmp_path / "run")  # whole again
    assert restore_whole(experiment) == []  # nothing cut: nothing put back
    # Killed between the two renames of a new copy: the copy before, in old/, is put back.
    (experiment / WHOLE_FOLDER / "state").rename(experiment / WHOLE_FOLDER / "old")
    (experiment / f"searcher-state-{session}.pkl").write_bytes(state[:10])
    assert restore_whole(experiment) == sorted(
        [f"experiment_state-{session}.json", f"searcher-state-{session}.pkl"]
    )
    assert (experiment / f"searcher-state-{session}.pkl").read_bytes() == state
    # A newer session than the copy's is not its state: it is set aside as before instead.
    newer = "2026-01-01_11-00-00"
    (experiment / f"experiment_state-{newer}.json").write_text("{")
    assert restore_whole(experiment) == []
    assert set_aside_cut_sessions(experiment) == [newer]


class _CountSaves(Callback):
    """Counts Ray Tune's saves of its experiment state (each asks every callback its state)."""

    saves = 0

    def get_state(self) -> dict[str, Any] | None:
        type(self).saves += 1
        return {}


def _report_often(config: dict[str, Any]) -> None:
    from ray import tune

    for i in range(40):
        time.sleep(0.02)
        tune.report({"i": i})


@pytest.mark.slow
def test_tune_saves_a_raybatch_experiment_when_a_restore_would_read_something_new(
    tmp_path: Path, ray_session: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's Tune settings (every step saved, ``TUNE_GLOBAL_CHECKPOINT_S`` 0) with
    :func:`save_on_change`: a trial's 40 results are not 40 saves, while its start and its end
    are saved (the state read back holds it finished); an experiment without the run's
    :class:`KeepWhole` (a user's own Tuner in the same process) still saves at every step."""
    from ray import tune

    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "0")
    save_on_change()
    saves: dict[str, int] = {}
    for name, callbacks in (("raybatch", [KeepWhole(tmp_path / "raybatch")]), ("own", [])):
        _CountSaves.saves = 0
        run_config = tune.RunConfig(
            name=name, storage_path=str(tmp_path), callbacks=[*callbacks, _CountSaves()]
        )
        tuner = tune.Tuner(_report_often, run_config=run_config)
        assert not tuner.fit().errors
        saves[name] = _CountSaves.saves
        state = json.loads(max((tmp_path / name).glob("experiment_state-*.json")).read_text())
        assert [json.loads(t[0])["status"] for t in state["trial_data"]] == ["TERMINATED"]
    assert saves["raybatch"] <= 6 < 40 <= saves["own"], saves


def test_a_tuner_pkl_cut_by_a_kill_during_a_restore_is_put_back_from_its_whole_copy(
    tmp_path: Path,
) -> None:
    """A resume's restore writes tuner.pkl again; a SIGKILL then (the three-kill test's last
    kill, once in eight runs) left it cut, and the run could not be resumed. Each resume keeps
    a whole copy first; the next puts it back, and says so."""
    from raybatch.errors import RunDirError
    from raybatch.run.tune_state import repair_state

    experiment = tmp_path / "tune" / "search"
    experiment.mkdir(parents=True)
    whole = pickle.dumps({"tuner": list(range(100))})
    (experiment / "tuner.pkl").write_bytes(whole)
    repair_state(experiment, tmp_path)  # a resume begins: the whole copy is kept
    (experiment / "tuner.pkl").write_bytes(whole[: len(whole) // 2])  # cut by the kill
    try:
        said = repair_state(experiment, tmp_path)
    except RunDirError as refused:  # whatever else this bare folder lacks, not tuner.pkl
        assert "tuner.pkl" not in str(refused)
    else:
        assert any("tuner.pkl cut short by a kill put back" in s for s in said), said
    assert (experiment / "tuner.pkl").read_bytes() == whole
    assert (experiment / "tuner.cut").read_bytes() == whole[: len(whole) // 2]


WRITE_UP_SIGTERM = """import os, signal, sys
import raybatch.run.driver as driver
chosen = driver.choose_winner
def choose(*args, **kwargs):  # the write-up has begun: the driver gets a real SIGTERM
    os.kill(os.getpid(), signal.SIGTERM)
    return chosen(*args, **kwargs)
driver.choose_winner = choose
sys.argv[0] = "raybatch"
from raybatch.cli.app import main
main()
"""


@pytest.mark.slow
def test_a_sigterm_while_the_run_is_written_up_is_said_as_such_and_resume_writes_it_up(
    tmp_path: Path,
) -> None:
    """A SIGTERM as the driver writes the run up (every trial ended, the winner not yet
    chosen) ends it as an interruption of the write-up, exit 130 and one line; no file says
    it finished, and `raybatch resume` writes it up without running a trial again."""
    run_dir = tmp_path / "run"
    stopped = subprocess.run(
        [sys.executable, "-c", WRITE_UP_SIGTERM, "search", "raybatch.examples.digits:workload",
         "--target", "0.9", "--trials", "2", "--max-time-per-trial", "20", "--confirm-seeds",
         "0", "--no-prior", "--run-dir", str(run_dir), "--quiet"],
        capture_output=True, text=True, check=False, timeout=400,
    )  # fmt: skip
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    lines = stopped.stderr.strip().splitlines()
    said = [line for line in lines if "interrupt" in line.lower()]
    assert said == lines[-1:] and "interrupted while writing the run up" in said[0], lines
    assert f"`raybatch resume {run_dir}`" in said[0] and "Traceback" not in stopped.stderr
    assert not (run_dir / "trials.csv").exists() and not (run_dir / "best_config.yaml").exists()
    ended = sorted(_told_ids(run_dir))
    assert len(ended) == 2
    resumed = _cli("resume", str(run_dir), "--quiet")
    _, err = resumed.communicate(timeout=400)
    assert resumed.returncode in (0, 1), err[-3000:]
    rows = [r for r in read_trials_csv(run_dir / "trials.csv") if r["phase"] == "search"]
    assert sorted(r["trial_id"] for r in rows) == ended  # written up, none run again
    assert sorted(_told_ids(run_dir)) == ended
