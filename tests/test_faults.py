"""A run directory you can trust: each fault tried, what happens, and what is kept.

:data:`FAULTS` is the list the docs' table (``docs/runs.md``) is checked against: a fault
added here and not there (or there and not here) fails
:func:`test_the_docs_table_lists_every_fault_tried`. Most faults are proven on run
directories written by hand (no Ray: a resume refuses before it starts one); one small real
search, interrupted, is copied and resumed.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import raybatch
from raybatch import Target, keys
from raybatch.errors import NothingFitsError, RunDirError, RunLockedError
from raybatch.examples.digits import DigitsWorkload
from raybatch.export import load_best
from raybatch.results.outcome import SearchResult, no_winner_reason
from raybatch.results.rows import TrialRow, read_trials_csv, write_trials_csv
from raybatch.run.driver import rebuild_report, resume
from raybatch.run.lock import LOCK_FILE, RunLock
from raybatch.run.rundir import write_run_files
from raybatch.status import TrialStatus
from raybatch.tuning.options import SearchOptions

from .conftest import run_cli
from .test_resume import PACED_DIGITS, _cli, _kill_when, _told, _told_ids

SPACE = raybatch.load_space("digits_cnn_sgd")
DIGITS = "raybatch.examples.digits:workload"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "runs.md"

FAULTS: list[tuple[str, str, str]] = [
    (  # tests/test_resume.py: test_killed_at_three_points_loses_and_repeats_nothing
        "the driver stopped (Ctrl-C, SIGTERM) or killed (SIGKILL) mid-search or while confirming",
        "`raybatch resume` continues; Ctrl-C and SIGTERM exit 130 saying how",
        "every finished trial, never run twice",
    ),
    (  # tests/test_resume.py: test_a_sigterm_while_the_run_is_written_up_is_said_as_such...
        "the driver stopped (Ctrl-C, SIGTERM) while it writes the run up, every trial ended",
        "exit 130, one line naming the write-up; no file says the run finished; `raybatch"
        " resume` writes it up",
        "every trial: none runs again",
    ),
    (  # tests/test_phases.py and test_confirmation.py: the step callback that tells
        "Ray Tune ends a trial without telling the searcher (a reused process that cannot be"
        " reset: ERROR; a last result while a checkpoint is saving: TERMINATED)",
        "told at the next step's start or end, with Tune's last result: the search and its race"
        " go on, in the session where it happened and in a resumed one whose saved state holds"
        " it",
        "every trial, once",
    ),
    (  # copied_run below
        "SIGTERM to the driver's whole process group (a terminal's `kill -- -PID`, Slurm),"
        " its own Ray stopped with it",
        "the driver ends at once (exit 130), the trials' workers killed, one line with the"
        " resume command; `raybatch resume` continues",
        "every finished trial; the runs that were training go on from the state their last"
        " evaluation saved (from their first step where none was saved yet)",
    ),
    (  # tests/test_resume.py: test_a_first_session_cut_short_by_a_kill_resumes_from_the_whole_copy
        # and test_a_tune_session_cut_short_by_a_kill_is_set_aside_before_restore
        "killed while Ray Tune copied its state (a state file cut short), the first session"
        " included",
        "the session is put back from the whole copy kept at each step (tune/search/.whole/),"
        " one step older; without one, the cut session is set aside for the whole one before it",
        "every file: the cut ones moved to tune/search/.cut/, never deleted",
    ),
    (
        "a second `raybatch resume` (or `search`) while a driver runs",
        "refused at once, exit 2, naming the holder (pid, host, since when)",
        "everything: the running driver goes on alone",
    ),
    (  # tests/test_resume.py: _kill_when's kill -9 (test_orphans.py: the watch alone)
        "the driver alone killed (`kill -9 PID`) with its local Ray up",
        "a watch started with that Ray kills what is left of it (the driver's Ray descendants,"
        " and the workers its raylet started as it died) within seconds (two of Ray's agents"
        " lingered 60-90 s)",
        "everything the driver saved; `raybatch resume` continues",
    ),
    (
        "the driver killed (SIGKILL) while it held the lock",
        "the next driver takes the lock over and notes the killed one",
        "everything the killed driver saved",
    ),
    (
        "the run directory copied (`cp -a`) or moved, then resumed",
        "the copy resumes into itself",
        "the original, byte for byte",
    ),
    (
        "`resume` of a finished run",
        "says so at once and prints its result again; nothing runs",
        "everything, unchanged",
    ),
    (
        "nothing fits the memory budget",
        "refused before any trial, exit 2: no micro batch fits, and what the smallest needs",
        "no run is written: the same command runs once the budget is fixed",
    ),
    (  # tests/test_cli.py: test_a_local_ray_that_cannot_start_ends_in_one_line_and_leaves_no_run
        "the search's own Ray cannot start (its temporary folder cannot be made, its processes"
        " time out on a machine too busy)",
        "refused before any trial, exit 2, in one line with Ray's cause",
        "no run is written: the same command runs once Ray can start (`resume` likewise)",
    ),
    (
        "no trial reaches the target (all diverge)",
        "exit 1 with why in one line; the report says the same and links no best_config.yaml",
        "trials.csv, report.html (reasons without terminal colours)",
    ),
    (
        "optuna.db damaged",
        "resume refused, exit 2, naming optuna.db",
        "tune/search/ (Ray Tune's results)",
    ),
    (  # tests/test_diskfull.py
        "the disk fills while the search writes (its study, Ray Tune's results)",
        "one line naming the file and the cause, exit 74: free some space, then `raybatch resume`"
        " (full before Ray Tune's state was first copied whole, at its first step: resume"
        " refuses in one line naming the cut file, and the search starts again elsewhere)",
        "everything written before the write that failed (the trials that ended, in optuna.db)",
    ),
    (  # test_a_report_that_cannot_be_written_is_one_line_naming_the_file
        "report.html cannot be written (a full disk, a read-only folder)",
        "one line naming the file and the cause, exit 74; a search still says its verdict,"
        " with a note",
        "trials.csv and best_config.yaml: `raybatch report` writes it again",
    ),
    (
        "optuna.db deleted after trials started",
        "resume refused in seconds, exit 2, naming optuna.db",
        "tune/search/ (Ray Tune's results)",
    ),
    (  # test_a_deleted_tune_folder_is_named_with_the_trials_that_ran
        "tune/ deleted after trials ran",
        "resume refused, exit 2, naming tune/search and how many trials optuna.db holds",
        "optuna.db",
    ),
    (
        "tune/search/tuner.pkl damaged",
        "resume refused, exit 2, naming the file",
        "optuna.db and tune/",
    ),
    (
        "run.json damaged",
        "refused, exit 2, naming run.json",
        "optuna.db, tune/ and the finished run's files",
    ),
    (
        "trials.csv damaged",
        "`report` refused, exit 2, naming trials.csv; delete it and resume to write it again",
        "optuna.db, tune/, best_config.yaml",
    ),
    (  # test_a_trials_csv_cut_short_is_refused_not_reported_with_another_winner
        "trials.csv cut short (rows missing)",
        "`report` and `analyze_run` refused, exit 2: fewer runs than optuna.db recorded; delete"
        " it and resume to write it again",
        "optuna.db, tune/ (the race's runs too), best_config.yaml",
    ),
    (  # test_an_edited_trials_csv_is_refused_and_written_again_whole_by_resume
        "trials.csv edited (a run's time, whether it reached, its recipe)",
        "`report` and `analyze_run` refused, exit 2, naming the trial and what optuna.db"
        " recorded; delete it and resume to write it again",
        "optuna.db, tune/: the rows written again are the ones the search wrote",
    ),
    (  # test_a_hand_edited_best_config_is_refused_as_not_measured
        "best_config.yaml edited by hand (a value, or the knobs)",
        "`export` refused, exit 2, naming the field and what the run's space derives",
        "trials.csv: the measured winner is chosen again from it (`raybatch.analyze_run`)",
    ),
    (
        "best_config.yaml damaged",
        "`export` refused, exit 2, naming the file",
        "trials.csv: the winner is chosen again from it (`raybatch.analyze_run`)",
    ),
    (  # tests/test_cluster.py: test_a_search_through_the_address_requests_gpus_and_...
        "every trial fails the same way (no CUDA where Ray put it, a metric never returned)",
        "the search stops early, exit 2 with the reason; the trials it left open and the points"
        " it queued are closed failed in optuna.db, with why",
        "optuna.db and search.log (each failed trial's traceback)",
    ),
]
"""(fault, what happens, what is kept): the table of ``docs/runs.md``."""

NAN_REASON = "\x1b[31mloss is nan at step 1\x1b[0m"  # coloured, as a terminal traceback is


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _hand_written_run(path: Path, rows: list[TrialRow] | None = None) -> Path:
    """A run directory as ``search`` starts it; with ``rows``, as one that finished."""
    options = SearchOptions(trials=2, gpus_per_trial=0, prior=False, confirm_seeds=0)
    write_run_files(path, DIGITS, SPACE, Target(0.97), options)
    if rows is not None:
        write_trials_csv(path / "trials.csv", rows)
    return path


def _diverged(n: int) -> list[TrialRow]:
    status = TrialStatus.DIVERGED
    recipes = [SPACE.derive(16 * 2**i, 1) for i in range(n)]
    return [
        TrialRow.of(recipe, keys.PHASE_SEARCH, f"t{i}", status, reason=NAN_REASON)
        for i, recipe in enumerate(recipes)
    ]


def test_the_docs_table_lists_every_fault_tried() -> None:
    text = DOCS.read_text()
    rows = re.findall(r"^\| (.+?) \| (.+?) \| (.+?) \|$", text, flags=re.MULTILINE)
    listed = [r for r in rows if r[0] != "fault" and not set(r[0]) <= {"-", " "}]
    assert listed == FAULTS


# ------------------------------------------------------------------ one driver


def test_a_second_driver_is_refused_at_once_naming_the_holder(tmp_path: Path) -> None:
    run = _hand_written_run(tmp_path / "run")
    with RunLock(run, "resume"):
        with pytest.raises(RunLockedError) as refused:
            resume(run)
        started = time.monotonic()
        proc = run_cli("resume", str(run))
        cli_s = time.monotonic() - started
    message = str(refused.value)
    assert f"{run}: {LOCK_FILE}: held by `raybatch resume` (pid " in message
    assert "one driver per run directory" in message
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "held by `raybatch resume`" in proc.stderr
    assert "Ray" not in proc.stderr and cli_s < 60  # refused before any Ray starts
    # A search into a directory a driver holds is refused the same way.
    with RunLock(tmp_path / "new", "search"), pytest.raises(RunLockedError):
        raybatch.search(DigitsWorkload(), SPACE, 0.97, tmp_path / "new")


def test_a_lock_left_by_a_killed_driver_is_taken_over_and_said(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path;"
         " from raybatch.run.lock import RunLock\n"
         "with RunLock(Path(sys.argv[1]), 'resume'):\n print('held', flush=True); time.sleep(600)",
         str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    with pytest.raises(RunLockedError):
        RunLock(tmp_path, "resume").__enter__()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    with RunLock(tmp_path, "resume") as lock:
        assert lock.taken_over is not None
        assert f"(pid {holder.pid} on" in lock.taken_over and "without releasing" in lock.taken_over
    with RunLock(tmp_path, "resume") as lock:  # released cleanly: nothing to say
        assert lock.taken_over is None


# ------------------------------------------------------------------ a copied run


def _training_with_a_save(run_dir: Path) -> bool:
    """Whether a search trial is training (its last report says ``running``, and the driver
    has not told it ended) with a state it saved at an evaluation (a Tune checkpoint in its
    folder). The driver tells a trial's end before its last report reaches ``result.json``:
    a loaded machine once showed a reached trial as running there, the kill came after it
    and before the next began, and nothing was left training with a save."""
    told = set(_told_ids(run_dir))
    for trial in (run_dir / "tune" / "search").glob("*/"):
        result = trial / "result.json"
        if not (any(trial.glob("checkpoint_*")) and result.is_file()):
            continue
        try:
            last = json.loads(result.read_text().splitlines()[-1])
        except (ValueError, IndexError):  # being written right now; ask again
            continue
        if last.get(keys.STATUS) == TrialStatus.RUNNING.value and last.get("trial_id") not in told:
            return True
    return False


@pytest.fixture(scope="module")
def copied_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A small search of a user's paced digits CNN stopped by SIGTERM to its whole process
    group (as a terminal's ``kill -- -PID`` or Slurm stops a job: its own Ray gets the signal
    too) after its first trial, while a trial trains with a state it saved, copied with
    ``cp -a``; the copy resumed to its end. The original's files are hashed before and
    after."""
    root = tmp_path_factory.mktemp("copied")
    original, copy = root / "r1", root / "r2"
    (root / "paced.py").write_text(PACED_DIGITS)  # a trial lasts seconds on any machine
    search = _cli("search", f"{root / 'paced.py'}:workload", "--target", "0.9", "--trials", "4",
                  "--run-dir", str(original), "--max-time-per-trial", "8",
                  "--max-concurrent", "1", "--confirm-seeds", "0", "--no-prior", "--quiet",
                  "--no-pause",  # trials end one by one: a pause holds the first to the end
                  start_new_session=True)  # fmt: skip
    # At once: the trial with a save must still be training when the signal comes.
    ready = lambda: _told(original) >= 1 and _training_with_a_save(original)  # noqa: E731
    _kill_when(search, ready, random.Random(1), original, set(), signal.SIGTERM, group=True,
               latest_s=0.0)  # fmt: skip
    subprocess.run(["cp", "-a", str(original), str(copy)], check=True)
    before = _hashes(original)
    # Named as a user in its folder names it: relative (Ray read that as a URI, and failed).
    resumed = _cli("resume", copy.name, "--quiet", cwd=root)
    out, err = resumed.communicate(timeout=400)
    return {"original": original, "copy": copy, "before": before, "after": _hashes(original),
            "returncode": resumed.returncode, "out": out, "err": err}  # fmt: skip


@pytest.mark.slow
def test_a_copied_run_resumes_into_itself_and_leaves_the_original_alone(
    copied_run: dict[str, Any],
) -> None:
    assert copied_run["returncode"] in (0, 1), copied_run["err"][-3000:]
    assert copied_run["after"] == copied_run["before"]  # not one byte of the original changed
    assert not (copied_run["original"] / "trials.csv").exists()
    rows = read_trials_csv(copied_run["copy"] / "trials.csv")
    assert len([r for r in rows if r["phase"] == "search"]) == 4  # finished in the copy
    import optuna

    study = optuna.load_study(
        study_name="raybatch", storage=f"sqlite:///{copied_run['copy'] / 'optuna.db'}"
    )
    told = {t.user_attrs.get("tune_trial_id") for t in study.trials} - {None}
    assert {r["trial_id"] for r in rows if r["phase"] == "search"} <= told


@pytest.mark.slow
def test_a_trial_cut_short_goes_on_from_its_last_save_not_from_its_first_step(
    copied_run: dict[str, Any],
) -> None:
    """A trial training when the run was stopped, with a state saved at an evaluation before
    (a checkpoint in the original), resumes from it: its first report in the resumed session
    is past its first report before the kill. Its saves stay in the copy."""
    import pandas as pd

    original, copy = copied_run["original"] / "tune/search", copied_run["copy"] / "tune/search"
    checked = 0
    for trial in (p for p in copy.iterdir() if (p / "progress.csv").is_file()):
        frame = pd.read_csv(trial / "progress.csv")
        if not any((original / trial.name).glob("checkpoint_*")) or frame["pid"].nunique() < 2:
            continue  # nothing saved when it was stopped, or it had ended before
        again = frame[frame["pid"] == frame["pid"].iloc[-1]]
        assert again[keys.STEPS].iloc[0] > frame[keys.STEPS].iloc[0], trial.name
        checked += 1
    assert checked, "no trial stopped with a save went on from it"


@pytest.mark.slow
def test_resume_of_a_finished_run_changes_nothing(copied_run: dict[str, Any]) -> None:
    copy = copied_run["copy"]
    before = _hashes(copy)
    started = time.monotonic()
    proc = run_cli("resume", str(copy))
    assert time.monotonic() - started < 60  # said at once: no Ray, no confirmation
    assert proc.returncode == copied_run["returncode"], proc.stderr[-2000:]
    assert "this run's search had finished: nothing was run again" in proc.stdout
    assert _hashes(copy) == before


@pytest.mark.slow
def test_a_trials_csv_cut_short_is_refused_not_reported_with_another_winner(
    copied_run: dict[str, Any], tmp_path: Path
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(copied_run["copy"], run)  # finished
    lines = (run / "trials.csv").read_text().splitlines(keepends=True)
    (run / "trials.csv").write_text("".join(lines[:-1]))  # its last row lost
    proc = run_cli("report", str(run))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert re.match(rf"raybatch: error: {re.escape(str(run))}: trials.csv: holds \d+ run\(s\)"
                    r" where optuna.db recorded \d+", proc.stderr)  # fmt: skip
    assert "`raybatch resume` writes it again" in proc.stderr


@pytest.mark.slow
def test_an_edited_trials_csv_is_refused_and_written_again_whole_by_resume(
    copied_run: dict[str, Any], tmp_path: Path
) -> None:
    """A run's time edited in trials.csv would choose, and draw, a winner nobody measured:
    `report` names the trial and what optuna.db recorded. The repair the message gives
    (delete trials.csv, resume) loses nothing: the same rows come back, the same winner."""
    import csv
    import shutil

    run = tmp_path / "run"
    shutil.copytree(copied_run["copy"], run)  # finished
    original = read_trials_csv(run / "trials.csv")
    rows = [dict(r) for r in original]
    edited = next(r for r in rows if r["time_to_target_s"])
    edited["time_to_target_s"] = str(float(edited["time_to_target_s"]) / 2)
    with (run / "trials.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    proc = run_cli("report", str(run))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(
        f"raybatch: error: {run}: trials.csv: trial {edited['trial_id']}'s row says"
        f" time_to_target_s {edited['time_to_target_s']} where optuna.db recorded"
    ), proc.stderr
    assert "delete trials.csv and `raybatch resume` writes it again" in proc.stderr
    winner = (run / "best_config.yaml").read_text()
    (run / "trials.csv").unlink()
    resumed = run_cli("resume", str(run), "--quiet")
    assert resumed.returncode == copied_run["returncode"], resumed.stderr[-2000:]
    again = read_trials_csv(run / "trials.csv")
    fields = ("trial_id", "phase", "status", "time_to_target_s", "micro_batch_size",
              "lr_multiplier")  # fmt: skip
    before = sorted([r[k] for k in fields] for r in original)  # in the order Tune gives them
    assert sorted([r[k] for k in fields] for r in again) == before, resumed.stderr[-2000:]
    strip = [line for line in winner.splitlines() if "created" not in line]
    assert [line for line in (run / "best_config.yaml").read_text().splitlines()
            if "created" not in line] == strip  # fmt: skip
    assert run_cli("report", str(run)).returncode == 0


@pytest.mark.slow
def test_a_report_that_cannot_be_written_is_one_line_naming_the_file(
    copied_run: dict[str, Any], tmp_path: Path
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(copied_run["copy"], run)
    (run / "report.html").unlink()
    (run / "report.html").mkdir()  # what cannot be written there, as a full disk cannot
    proc = run_cli("report", str(run))
    assert proc.returncode == 74 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"raybatch: error: {run / 'report.html'}: Is a directory")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert (run / "trials.csv").is_file() and (run / "best_config.yaml").is_file()


@pytest.mark.slow
def test_a_workload_file_moved_since_the_search_started_is_named_as_run_jsons(
    copied_run: dict[str, Any], tmp_path: Path
) -> None:
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(copied_run["original"], run)  # interrupted: resumable
    stored = json.loads((run / "run.json").read_text())
    stored["workload"] = f"{tmp_path / 'moved' / 'job.py'}:workload"
    (run / "run.json").write_text(json.dumps(stored))
    proc = run_cli("resume", str(run))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"raybatch: error: {run}: run.json: workload: ")
    assert "as stored here" in proc.stderr


# ------------------------------------------------------------------ a failed search


def test_nothing_fitting_the_budget_is_refused_before_any_trial(
    ray_session: None, tmp_path: Path
) -> None:
    options = SearchOptions(trials=2, memory_budget="256KiB", gpus_per_trial=0, prior=False,
                            confirm_seeds=0)  # fmt: skip
    with pytest.raises(NothingFitsError) as refused:
        raybatch.search(DigitsWorkload(), SPACE, 0.97, tmp_path / "run", options,
                        DIGITS, verbose=0)  # fmt: skip
    assert re.fullmatch(
        r"no micro batch fits 256\.00 KiB: the smallest \(16\) needs [\d.]+ KiB; nothing to"
        r" search \(a smaller model, or more memory\)",
        str(refused.value),
    )
    assert not (tmp_path / "run" / "tune").exists()  # no trial started
    assert not (tmp_path / "run" / "run.json").exists()  # no run left: run it again as is


def test_a_search_where_every_trial_diverged_fails_saying_why(tmp_path: Path) -> None:
    run = _hand_written_run(tmp_path / "run", _diverged(4))
    assert no_winner_reason(_diverged(4), Target(0.97)) == (
        "all 4 trials diverged: loss is nan at step 1"
    )
    proc = run_cli("resume", str(run))  # a finished run: its result again, and its failure
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr == (
        "raybatch: error: no recipe reached accuracy>=0.97: all 4 trials diverged: loss is nan"
        " at step 1\n"
    )
    assert "All 4 trials diverged: loss is nan at step 1." in proc.stdout
    assert "best config:" not in proc.stdout

    page = rebuild_report(run).read_text()
    assert "\x1b" not in page and "[31m" not in page
    assert "All 4 trials diverged: loss is nan at step 1." in page
    assert 'href="best_config.yaml"' not in page and "no winner, so no best_config.yaml" in page
    assert all("\x1b" not in r["reason"] for r in read_trials_csv(run / "trials.csv"))
    exported = run_cli("export", str(run))
    assert exported.returncode == 2
    assert "finished without a winner" in exported.stderr


def test_a_report_links_best_config_only_where_one_was_written(tmp_path: Path) -> None:
    from raybatch.report import write_report

    result = SearchResult(tmp_path, _diverged(1), None)
    text = write_report(result, SPACE, Target(0.97), None, None).read_text()
    assert "best_config.yaml</a>" not in text
    assert "Its one trial diverged: loss is nan at step 1." in text


# ------------------------------------------------------------------ damaged files


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncate" else b"\x00garbage\xff" * 64)


def test_a_damaged_optuna_db_is_named_before_resume_starts_anything(tmp_path: Path) -> None:
    import optuna

    run = _hand_written_run(tmp_path / "run")
    optuna.create_study(study_name="raybatch", storage=f"sqlite:///{run / 'optuna.db'}")
    _damage(run / "optuna.db", "garbage")
    with pytest.raises(RunDirError) as refused:
        resume(run)
    assert str(refused.value).startswith(f"{run}: optuna.db: damaged (file is not a database)")
    assert "tune/search/ are kept" in str(refused.value)
    proc = run_cli("resume", str(run))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"raybatch: error: {run}: optuna.db: damaged")


@pytest.mark.slow
def test_a_deleted_tune_folder_is_named_with_the_trials_that_ran(
    copied_run: dict[str, Any], tmp_path: Path
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(copied_run["original"], run)  # interrupted after its first trial
    shutil.rmtree(run / "tune")
    proc = run_cli("resume", str(run))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"raybatch: error: {run}: tune/search: missing: Ray Tune's")
    assert "before its first trial" not in proc.stderr  # one had run: optuna.db says so


def test_an_optuna_db_deleted_after_trials_started_is_named_in_seconds(tmp_path: Path) -> None:
    run = _hand_written_run(tmp_path / "run")
    (run / "tune" / "search" / "raybatch_digits_00000_0").mkdir(parents=True)  # a trial's folder
    proc = run_cli("resume", str(run))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(
        f"raybatch: error: {run}: optuna.db: missing, though 1 trial(s) started"
    )


def test_a_damaged_tuner_pickle_is_named(tmp_path: Path) -> None:
    run = _hand_written_run(tmp_path / "run")
    experiment = run / "tune" / "search"
    experiment.mkdir(parents=True)
    (experiment / "tuner.pkl").write_bytes(pickle.dumps({"tuner": list(range(100))}))
    _damage(experiment / "tuner.pkl", "truncate")
    with pytest.raises(RunDirError) as refused:
        resume(run)
    assert str(refused.value).startswith(f"{run}: tune/search/tuner.pkl: damaged")
    assert "optuna.db and tune/" in str(refused.value)


@pytest.mark.parametrize("how", ["truncate", "garbage"])
def test_a_damaged_run_json_is_named(tmp_path: Path, how: str) -> None:
    run = _hand_written_run(tmp_path / "run", _diverged(1))
    _damage(run / "run.json", how)
    for call in (resume, rebuild_report):
        with pytest.raises(RunDirError, match=f"^{re.escape(str(run))}: run.json: damaged"):
            call(run)


@pytest.mark.parametrize("how", ["truncate", "garbage", "empty"])
def test_a_damaged_trials_csv_is_named_not_reported_empty(tmp_path: Path, how: str) -> None:
    run = _hand_written_run(tmp_path / "run", _diverged(2))
    if how == "empty":
        (run / "trials.csv").write_text("")
    else:
        _damage(run / "trials.csv", how)
    proc = run_cli("report", str(run))
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.startswith(f"raybatch: error: {run}") and "trials.csv" in proc.stderr
    assert "damaged" in proc.stderr and "Traceback" not in proc.stderr
    assert not (run / "report.html").exists()


@pytest.mark.parametrize("how", ["truncate", "garbage"])
def test_a_damaged_best_config_is_named(tmp_path: Path, how: str) -> None:
    from raybatch.export import BestConfig, write_best

    run = _hand_written_run(tmp_path / "run", _diverged(1))
    write_best(run, BestConfig(SPACE.derive(64, 1), {"trial_id": "t0"}))
    _damage(run / "best_config.yaml", how)
    with pytest.raises(RunDirError) as refused:
        load_best(run)
    assert str(refused.value).startswith(f"{run / 'best_config.yaml'}: ")
    proc = run_cli("export", str(run))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "best_config.yaml" in proc.stderr


def test_a_hand_edited_best_config_is_refused_as_not_measured(tmp_path: Path) -> None:
    """``lr: 0.5`` where the run's space derives 0.1, or knobs no run reached with: export
    would pass either off as the measured recipe."""
    import yaml

    from raybatch.export import BestConfig, write_best

    measured = SPACE.derive(64, 1)
    reached = TrialRow.of(measured, keys.PHASE_SEARCH, "t0", TrialStatus.REACHED,
                          time_to_target_s=1.0)  # fmt: skip
    run = _hand_written_run(tmp_path / "run", [reached])
    write_best(run, BestConfig(measured, {"trial_id": "t0"}))
    assert load_best(run).config == measured  # as written: the measured recipe
    written = yaml.safe_load((run / "best_config.yaml").read_text())
    for edit, why in (
        ({keys.LR: 0.5}, "config.lr: 0.5, where the run's space derives"),
        (SPACE.derive(128, 1).to_dict(), "config: no run in trials.csv reached"),
    ):
        (run / "best_config.yaml").write_text(yaml.safe_dump(
            {**written, "config": {**written["config"], **edit}}))  # fmt: skip
        with pytest.raises(RunDirError, match=re.escape(why)):
            load_best(run)
        proc = run_cli("export", str(run))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "edited by hand: not the recipe the search measured" in proc.stderr


def test_export_errors_name_the_command_line(tmp_path: Path) -> None:
    from raybatch.export import BestConfig, write_best

    write_best(tmp_path, BestConfig(SPACE.derive(64, 1), {"trial_id": "t0"}))
    out = tmp_path / "out.args"
    proc = run_cli("export", str(tmp_path), "--world-size", "2", "--format", "args", "-o", str(out))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("raybatch: error: command line: --output: ")
    assert "<python>" not in proc.stderr
    assert proc.stderr.count("\n") == 1  # one message, no traceback
