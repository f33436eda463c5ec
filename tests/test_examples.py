"""The examples run as a user runs them: a fresh interpreter, real Ray, real training."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.slow
def test_tune_digits_example_finds_a_recipe_that_reaches_the_target(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "tune_digits_with_space.py"),
            "--trials",
            "3",
            "--storage",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 trials (" in proc.stdout and "best: reached" in proc.stdout
    assert "effective batch" in proc.stdout and "lr " in proc.stdout


@pytest.mark.slow
def test_builtin_trainable_example_runs_a_search_with_statuses(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "trainable_digits.py"), "--trials", "3",
         "--storage", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "status" in proc.stdout and "reached" in proc.stdout
    assert "time_to_target_s" in proc.stdout
