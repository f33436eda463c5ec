"""Shared fixtures: one local Ray per test session, and helpers to write space files."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from raybatch.cluster.connect import LOCAL_SYSTEM_CONFIG

# Every Ray a test starts without an address is its own: the suite runs in two processes
# (pytest -n 2), and Ray's default would join whichever Ray already runs on this machine (the
# other process's), which dies with that process. Subprocesses (examples, the CLI) inherit it.
os.environ["RAY_ADDRESS"] = "local"


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A small local Ray for the whole session (starting Ray costs seconds)."""
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(
        address="local",  # a Ray of this test process's own, never a neighbour's (pytest -n 2)
        num_cpus=3,  # logical: data-parallel trials need 2 workers + a driver
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _system_config=LOCAL_SYSTEM_CONFIG,  # as a search's own Ray: no idle workers prestarted
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
    )
    yield
    ray.shutdown()


def minimal_space(**overrides: Any) -> dict[str, Any]:
    """A valid space as a dict; nested ``overrides`` replace whole sections."""
    data: dict[str, Any] = {
        "name": "t",
        "description": "test space",
        "reference": {"batch_size": 256, "lr": 0.1, "weight_decay": 1e-4, "optimizer": "sgd"},
        "rules": {"lr": "linear", "weight_decay": "sqrt"},
        "search": {"micro_batch_size": [32, 64, 128], "accumulation_steps": [1, 2, 4]},
        "warmup": {"samples_per_scale": 1000, "from_scale": 1.0},
    }
    data.update(overrides)
    return data


@pytest.fixture
def write_space(tmp_path: Path) -> Any:
    """Write a dict (or raw text) as a space file and return its path."""

    def write(content: dict[str, Any] | str, name: str = "space.yaml") -> Path:
        path = tmp_path / name
        text = content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False)
        path.write_text(text)
        return path

    return write


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real console entry point in a fresh interpreter, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "raybatch", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).parent,
    )


def start_emulated_cluster(script: Path, source: str) -> tuple[subprocess.Popen[str], str]:
    """Run ``source`` (a script that starts a ``ray.cluster_utils.Cluster``, prints
    ``ADDRESS <address>`` and keeps it up until its stdin closes) in a helper process: one
    process holds one Ray, and the test's own may already be up. Returns the helper and the
    cluster's address; close the helper's stdin to shut the cluster down."""
    script.write_text(source)
    helper = subprocess.Popen(
        [sys.executable, str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert helper.stdout is not None and helper.stdin is not None
    line = helper.stdout.readline()
    assert line.startswith("ADDRESS "), "the emulated cluster did not start"
    return helper, line.split()[1]
