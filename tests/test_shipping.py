"""A user's own workload — a file anywhere, a ``__main__`` script — runs in Ray's workers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raybatch.results.rows import read_trials_csv
from raybatch.shipping import ship_by_value
from raybatch.workload import load_workload

from .userland import write_user_workload


@pytest.fixture(autouse=True)
def fresh_imports() -> Iterator[None]:
    """Each test's user folder is new: forget the sibling module and path of the last one."""
    path = list(sys.path)
    yield
    sys.modules.pop("blobs_data", None)
    sys.path[:] = path


def test_a_workload_file_imports_the_modules_beside_it(tmp_path: Path) -> None:
    path = write_user_workload(tmp_path / "user")
    workload = load_workload(f"{path}:workload")
    assert workload.name == "blobs"
    assert len(workload.train_dataset()) == 2048  # type: ignore[arg-type]


def test_the_workload_module_and_its_siblings_are_shipped_by_value_installed_ones_are_not(
    tmp_path: Path,
) -> None:
    path = write_user_workload(tmp_path / "user")
    shipped = ship_by_value(load_workload(f"{path}:workload"))
    assert "blobs_data" in shipped
    assert any(name.startswith("_raybatch_workload_my_workload_") for name in shipped)
    assert not any(name.split(".")[0] in ("torch", "raybatch", "ray", "numpy") for name in shipped)


UNPICKLE = """
import sys
from ray import cloudpickle
workload = cloudpickle.loads(open(sys.argv[1], "rb").read())
x, y = workload.train_dataset()[0]
shape = tuple(workload.build_model()(x[None]).shape)
print(type(workload).__name__, shape, len(workload.val_dataset()))
"""


def _unpickled_elsewhere(path: Path, tmp_path: Path) -> list[str]:
    """Ship the workload at ``path``, delete its folder, and unpickle it in a fresh process
    started in another folder: what a worker on another node gets (the pickle alone, no file,
    no sys.path entry). Returns what that process printed."""
    from ray import cloudpickle

    workload = load_workload(f"{path}:workload")
    ship_by_value(workload)
    blob = tmp_path / "workload.pkl"
    blob.write_bytes(cloudpickle.dumps(workload))
    shutil.rmtree(path.parent)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", UNPICKLE, str(blob)],
        capture_output=True, text=True, cwd=elsewhere, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def test_a_shipped_workload_runs_where_its_folder_does_not_exist(tmp_path: Path) -> None:
    path = write_user_workload(tmp_path / "user")
    assert _unpickled_elsewhere(path, tmp_path) == ["BlobsWorkload", "(1,", "4)", "512"]


def test_the_init_workload_template_runs_where_its_folder_does_not_exist(tmp_path: Path) -> None:
    """The file users start from caches its data with ``functools.cache``: a cached function
    of a shipped module travels by value too (it used to be looked up by name, and failed)."""
    from raybatch.cli.template import write_template

    path, _space = write_template(tmp_path / "user" / "my_model.py")
    assert _unpickled_elsewhere(path, tmp_path) == ["MyWorkload", "(1,", "4)", "2048"]


@pytest.mark.slow
def test_cli_search_of_a_user_workload_file_from_another_folder(tmp_path: Path) -> None:
    write_user_workload(tmp_path / "user")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "raybatch", "search", "../user/my_workload.py:workload",
         "--space", "../user/space.yaml", "--target", "accuracy>=0.9", "--trials", "3",
         "--max-time-per-trial", "10", "--confirm-seeds", "0", "--run-dir", "run", "--quiet",
         "--eval-every", "512"],
        capture_output=True, text=True, cwd=cwd, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Its last phase says what it does (the plots and the report take a while on a big run).
    assert "raybatch: the search has ended: choosing the winner, writing" in proc.stderr
    run = cwd / "run"
    rows = [r for r in read_trials_csv(run / "trials.csv") if r["phase"] == "search"]
    assert len(rows) == 3
    assert {r["status"] for r in rows} <= {"reached", "censored", "capped"}, rows
    reached = [r for r in rows if r["status"] == "reached"]
    assert reached and all(int(r["samples_to_target"]) % 512 == 0 for r in reached)
    assert (run / "best_config.yaml").is_file()
    # Stored absolute, so `raybatch resume` works from any folder.
    stored = json.loads((run / "run.json").read_text())["workload"]
    assert stored == f"{(tmp_path / 'user' / 'my_workload.py').resolve()}:workload"


SCRIPT = """
import json, sys
import torch
from torch import nn
import raybatch
from blobs_data import blobs  # a sibling of this script


class ScriptWorkload(raybatch.Workload):
    name = "script_blobs"

    def build_model(self):
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def train_dataset(self):
        return blobs(2048, 0)

    def val_dataset(self):
        return blobs(512, 1)


if __name__ == "__main__":
    import ray
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    space = raybatch.SearchSpace.from_yaml(sys.argv[1])
    options = raybatch.SearchOptions(trials=2, max_time_s=10, confirm_seeds=0)
    result = raybatch.search(ScriptWorkload(), space, 0.9, sys.argv[2], options, verbose=0)
    print("RESULT " + json.dumps([r.status.value for r in result.rows if r.phase == "search"]))
"""


@pytest.mark.slow
def test_a_workload_defined_in_a_main_script_runs_in_ray_workers(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    write_user_workload(folder)
    (folder / "train.py").write_text(SCRIPT)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    proc = subprocess.run(
        [sys.executable, str(folder / "train.py"), str(folder / "space.yaml"), "run"],
        capture_output=True, text=True, cwd=cwd, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    statuses = json.loads(line[7:])
    assert len(statuses) == 2 and "error" not in statuses, statuses
