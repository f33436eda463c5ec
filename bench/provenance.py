"""What code a result describes: the commit it was measured at and whether the tree was clean.

Every result file carries ``measured_at`` so that a figure in the docs can be traced to the
code it measured (a figure from a dirty tree measured something no commit holds). The check
runs when the benchmark *starts*: the result file the benchmark is about to rewrite is
excluded, since rewriting it is the benchmark's own doing. On a machine that holds a copy of
the tree without its git directory (a lent GPU machine), set ``RAYBATCH_COMMIT`` to the commit
the copy was made from; ``clean`` is then unknown (None).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def measured_at() -> dict[str, Any]:
    """``{"commit", "clean", "date"}`` of the checkout now; commit None outside a git tree.

    ``clean`` counts modified and untracked files (a new module is code too) but not
    ``bench/results/``, ``docs/`` and the README (outputs, not code) nor ``tests/`` (no
    benchmark runs them); it is None when git cannot say.
    """
    commit = _git("rev-parse", "HEAD") or os.environ.get("RAYBATCH_COMMIT")
    status = _git("status", "--porcelain", "--", ".",
                  ":(exclude)bench/results", ":(exclude)docs", ":(exclude)README.md",
                  ":(exclude)tests")  # fmt: skip
    return {
        "commit": commit,
        "clean": None if status is None or not commit else status == "",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def write_result(path: Path, data: dict[str, Any], at: dict[str, Any] | None = None) -> None:
    """Write ``data`` as a result file, with ``measured_at`` (``at``, taken at the start of
    the measurement, or now)."""
    record = {**data, "measured_at": at if at is not None else measured_at()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
