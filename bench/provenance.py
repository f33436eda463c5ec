"""What code a result describes: the commit it was measured at and whether the tree was clean.

Every result file carries ``measured_at`` so that a figure in the docs can be traced to the
code it measured (a figure from a dirty tree measured something no commit holds). The check
runs when the benchmark *starts*: the result file the benchmark is about to rewrite is
excluded, since rewriting it is the benchmark's own doing. On a machine that holds a copy of
the tree without its git directory (a lent GPU machine), set ``RAYBATCH_COMMIT`` to the commit
the copy was made from; ``clean`` is then unknown (None). The GPU checks also record a hash
of the source itself (:func:`source_sha256`), which ties a result to a commit without git:
``python bench/provenance.py COMMIT`` prints the hash of that commit's source, to compare.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE_FOLDERS = ("raybatch", "bench")
"""The code a result depends on; ``bench/results/`` and ``bench/wheels/`` are not code."""
_NOT_SOURCE = ("bench/results/", "bench/wheels/")
RESULTS_DIR_VARIABLE = "RAYBATCH_RESULTS_DIR"


def _git(*args: str) -> str | None:
    """git's answer about this checkout; None without git, or when the tree is a copy inside
    some other repository (whose commit would be the wrong one)."""
    try:
        run = lambda *a: subprocess.run(  # noqa: E731
            ["git", *a], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
        if Path(run("rev-parse", "--show-toplevel")).resolve() != ROOT:
            return None
        return run(*args)
    except (OSError, subprocess.SubprocessError):
        return None


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


def results_dir() -> Path:
    """Where results go: ``$RAYBATCH_RESULTS_DIR`` (a lent GPU machine sends back only what is
    written there), else ``bench/results/``."""
    return Path(os.environ.get(RESULTS_DIR_VARIABLE) or ROOT / "bench" / "results")


def _is_source(path: str) -> bool:
    return (
        path.split("/")[0] in SOURCE_FOLDERS
        and not path.startswith(_NOT_SOURCE)
        and "__pycache__/" not in path
        and not path.endswith(".pyc")
    )


def _digest(files: Iterable[tuple[str, bytes]]) -> str:
    """One SHA-256 over the sorted ``(path, sha256 of content)`` pairs of the source files."""
    total = hashlib.sha256()
    for path, content in sorted(files):
        total.update(f"{path}\0{hashlib.sha256(content).hexdigest()}\n".encode())
    return total.hexdigest()


def source_sha256(root: Path = ROOT) -> str:
    """A hash of the source files under ``raybatch/`` and ``bench/`` as they are on disk.

    Read from the files themselves, so it needs no git: a copy of the tree made without its
    git directory (a lent GPU machine) still says which code it ran, and
    :func:`commit_source_sha256` gives the same hash for the commit the copy was made from.
    """
    files = []
    for folder in SOURCE_FOLDERS:
        for path in (root / folder).rglob("*"):
            relative = path.relative_to(root).as_posix()
            if path.is_file() and not path.is_symlink() and _is_source(relative):
                files.append((relative, path.read_bytes()))
    return _digest(files)


def commit_source_sha256(commit: str) -> str:
    """:func:`source_sha256` of ``commit``'s tree, from git (to match a result to a commit)."""
    tar = subprocess.run(
        ["git", "archive", "--format=tar", commit, *SOURCE_FOLDERS],
        cwd=ROOT, capture_output=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        files = [
            (m.name, archive.extractfile(m).read())  # type: ignore[union-attr]
            for m in archive.getmembers()
            if m.isfile() and _is_source(m.name)
        ]
    return _digest(files)


def measured_tree() -> dict[str, Any]:
    """:func:`measured_at`, plus where the commit came from (``RAYBATCH_COMMIT`` when it is
    set, else ``git``, or None) and :func:`source_sha256` of the tree: what a result of the GPU
    checks records (``python bench/provenance.py COMMIT`` gives the hash a commit must match)."""
    at = measured_at()
    head = _git("rev-parse", "HEAD")
    given = os.environ.get("RAYBATCH_COMMIT")
    if given:
        # Said by whoever sent the tree, it wins: a lent machine's copy may carry a git
        # directory of an older commit with today's files over it (seen: HEAD at the session's
        # first commit, "dirty"). The source hash below tells which is right.
        return {**at, "commit": given, "clean": None, "commit_from": "RAYBATCH_COMMIT",
                "git_head": head, "source_sha256": source_sha256()}  # fmt: skip
    return {**at, "commit_from": "git" if head else None, "source_sha256": source_sha256()}


def write_result(path: Path, data: dict[str, Any], at: dict[str, Any] | None = None) -> None:
    """Write ``data`` as a result file, with ``measured_at`` (``at``, taken at the start of
    the measurement, or now)."""
    record = {**data, "measured_at": at if at is not None else measured_at()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    # python bench/provenance.py [COMMIT]: the source hash of the tree here, or of COMMIT.
    print(commit_source_sha256(sys.argv[1]) if len(sys.argv) > 1 else source_sha256())
