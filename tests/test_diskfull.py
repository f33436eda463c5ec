"""A full disk ends a search in one line naming the file and the cause, and the run resumes
once space is freed (raybatch/run/diskfull.py)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from raybatch.errors import DiskFullError
from raybatch.results.rows import read_trials_csv
from raybatch.run.diskfull import disk_full_said, full_disk_in


def _sqlite_full(db: Path) -> sqlite3.OperationalError:
    """SQLite's own "database or disk is full", met for real: a database whose pages are
    capped (as a full disk caps them) written past its cap."""
    with contextlib.closing(sqlite3.connect(db)) as c:
        c.execute("CREATE TABLE t (x BLOB)")
        c.execute("PRAGMA max_page_count = 3")
        try:
            for _ in range(100):
                c.execute("INSERT INTO t VALUES (?)", (b"x" * 4096,))
                c.commit()
        except sqlite3.OperationalError as exc:
            return exc
    raise AssertionError("the capped database took every write")


def test_sqlite_full_deep_in_a_chain_is_said_with_the_study_file_and_the_resume_command(
    tmp_path: Path,
) -> None:
    """As it reached the driver: SQLite's error under SQLAlchemy's under Optuna's under Ray
    Tune's; said as one DiskFullError naming the study's file (SQLite names none)."""
    full = _sqlite_full(tmp_path / "capped.db")
    assert "full" in str(full)
    run = tmp_path / "run"
    with pytest.raises(DiskFullError) as raised, disk_full_said(run, run / "optuna.db"):
        try:
            try:
                raise full
            except sqlite3.OperationalError as inner:
                raise RuntimeError("StorageInternalError: during the commit") from inner
        except RuntimeError as middle:
            raise ValueError("TuneError: Traceback (most recent call last)") from middle
    said = str(raised.value)
    assert said.startswith(f"{run / 'optuna.db'}: database or disk is full: the search stopped")
    assert said.endswith(f"continue with `raybatch resume {run}`")


def test_an_os_write_for_want_of_space_names_its_file_and_other_errors_pass_through(
    tmp_path: Path,
) -> None:
    """/dev/full refuses every write with ENOSPC, as a full disk does."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    try:
        with open("/dev/full", "w") as f:
            f.write("x")
            f.flush()
    except OSError as exc:
        exc.filename = str(tmp_path / "trials.csv")
        assert full_disk_in(exc) == (str(tmp_path / "trials.csv"), os.strerror(exc.errno))
    assert full_disk_in(ValueError("not a disk")) is None
    assert full_disk_in(OSError(13, "Permission denied")) is None
    with pytest.raises(KeyError), disk_full_said(tmp_path, tmp_path / "optuna.db"):
        raise KeyError("left alone")


def _mount_small_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, check=False)  # fmt: skip
    return made.returncode == 0


@pytest.mark.slow
def test_a_search_on_a_full_disk_ends_in_one_line_and_resumes_once_space_is_freed(
    tmp_path: Path,
) -> None:
    """The run directory on a 400 KiB file system: the search fills it in its first trials and
    stops with exit 74 and one error line (it was 287 lines and 7 tracebacks); with the file
    system grown, `raybatch resume` finishes it (a state Ray Tune's copy left cut short is put
    back from the whole copy kept at each step) -- unless the disk filled before the first
    whole copy was kept: then resume refuses in one line, naming the cut file."""
    disk = tmp_path / "disk"
    if not _mount_small_tmpfs(disk, "400k"):
        pytest.skip("mounting a small file system needs root")
    try:
        run_dir = disk / "run"
        cli = [sys.executable, "-m", "raybatch"]
        search = subprocess.run(
            [*cli, "search", "raybatch.examples.tabular:workload", "--target", "0.87",
             "--trials", "3", "--max-time-per-trial", "20", "--confirm-seeds", "0",
             "--no-prior", "--run-dir", str(run_dir), "--quiet"],
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        assert search.returncode == 74, search.stderr[-3000:]
        errors = [line for line in search.stderr.splitlines() if "error" in line.lower()]
        assert len(errors) == 1 and errors[0].startswith("raybatch: error: "), errors
        assert "full" in errors[0] or "No space left" in errors[0]
        assert f"continue with `raybatch resume {run_dir}`" in errors[0]
        assert "Traceback" not in search.stderr
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        resumed = subprocess.run([*cli, "resume", str(run_dir), "--quiet"], capture_output=True,
                                 text=True, check=False, timeout=300)  # fmt: skip
        if resumed.returncode == 2:
            # The disk filled while Ray Tune wrote its state before any whole copy was kept:
            # nothing to put back; the refusal names the cut file in one line, no traceback.
            refused = resumed.stderr.strip().splitlines()
            assert len(refused) == 1 and "experiment_state-" in refused[0], refused
            assert "cut short" in refused[0] and "Traceback" not in resumed.stderr
            return
        assert resumed.returncode in (0, 1), resumed.stderr[-3000:]
        rows = [r for r in read_trials_csv(run_dir / "trials.csv") if r["phase"] == "search"]
        assert len(rows) == 3
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, check=False)


def test_tunes_page_about_a_state_copy_that_failed_for_want_of_space_is_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Ray Tune's copy of its state into the run failing on a full disk is a warning with a
    traceback, and the search goes on until a write raises: raybatch says the full disk then,
    once; Tune's page is dropped. Its other warnings still show."""
    import logging

    from raybatch.run.diskfull import disk_full_said

    syncer = logging.getLogger("ray.train._internal.syncer")
    with caplog.at_level(logging.WARNING, logger=syncer.name), disk_full_said(tmp_path, tmp_path):
        syncer.warning("Last sync command failed with the following error:\nTraceback ...\n"
                       "OSError: [Errno 28] No space left on device")  # fmt: skip
        syncer.warning("Last sync command failed with the following error: a timeout")
    assert [r.getMessage() for r in caplog.records] == [
        "Last sync command failed with the following error: a timeout"
    ]
    syncer.warning("outside the search: OSError: [Errno 28] No space left on device")
    assert len(caplog.records) == 2  # the filter goes with the search
