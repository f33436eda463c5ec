"""The CLI: listing presets, printing recipes and estimates, and bad starts of a search."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raybatch import load_space
from raybatch.cli.app import app
from raybatch.space.presets import list_presets

from .conftest import run_cli

runner = CliRunner()


def test_spaces_lists_every_preset_with_its_description() -> None:
    result = runner.invoke(app, ["spaces"])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    presets = list_presets()
    assert len(lines) == len(presets)
    for line, preset in zip(lines, presets, strict=True):
        assert line.startswith(preset.name)
        assert line.endswith(preset.description)


def test_space_json_prints_the_fixed_keys_with_derived_values() -> None:
    result = runner.invoke(
        app,
        [
            "space",
            "resnet50_imagenet_sgd",
            "--batch",
            "128",
            "--accum",
            "4",
            "--world-size",
            "2",
            "--json",
        ],
    )
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert {
        "micro_batch_size": 128,
        "accumulation_steps": 4,
        "world_size": 2,
        "effective_batch_size": 1024,
        "lr": 0.4,
        "weight_decay": 0.0001,
    }.items() <= data.items()
    assert data == load_space("resnet50_imagenet_sgd").derive(128, 4, 2).to_dict()


def test_space_table_shows_values_and_which_rule_produced_them() -> None:
    result = runner.invoke(app, ["space", "bert_finetune_adamw", "-b", "16", "-a", "4"])
    assert result.exit_code == 0
    out = result.stdout
    assert "effective_batch_size     64" in out
    assert "square-root rule" in out
    assert "lr 7.07107e-05 = 5e-05 x rule factor 1.414" in out


def test_space_multipliers_are_applied_on_top_of_the_rule() -> None:
    result = runner.invoke(
        app,
        [
            "space",
            "generic_adamw",
            "-b",
            "128",
            "--lr-multiplier",
            "2",
            "--wd-multiplier",
            "0.5",
            "--json",
        ],
    )
    data = json.loads(result.stdout)
    assert (data["lr"], data["weight_decay"]) == (0.002, 0.005)


def test_recipes_prints_one_row_per_grid_point() -> None:
    result = runner.invoke(app, ["recipes", "digits_cnn_sgd"])
    assert result.exit_code == 0
    space = load_space("digits_cnn_sgd")
    rows = result.stdout.strip().splitlines()[4:]
    assert len(rows) == len(list(space.grid()))
    assert rows[-1].split()[:4] == ["256", "4", "1", "1024"]


def test_recipes_json_is_the_list_of_derived_configs() -> None:
    result = runner.invoke(app, ["recipes", "digits_cnn_sgd", "--json"])
    space = load_space("digits_cnn_sgd")
    assert json.loads(result.stdout) == [c.to_dict() for c in space.grid()]


def test_non_numeric_batch_is_a_usage_error_not_a_traceback() -> None:
    result = runner.invoke(app, ["space", "digits_cnn_sgd", "--batch", "many"])
    assert result.exit_code == 2
    assert "Invalid value for '--batch'" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


DIGITS = "raybatch.examples.digits:workload"

UNTRACEABLE = """
import torch
from torch.utils.data import TensorDataset
from raybatch.workload import SimpleWorkload

class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.a(x) if x.sum() > 0 else self.b(x)

data = TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
W = SimpleWorkload(Branchy, data, data)
"""


def test_estimate_json_has_rows_model_budget_and_largest_batch() -> None:
    result = runner.invoke(
        app, ["estimate", DIGITS, "--batch", "8,16,64,256", "--memory-budget", "34MiB", "--json"]
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [r["micro_batch_size"] for r in data["rows"]] == [8, 16, 64, 256]
    assert {"micro_batch_size", "predicted_bytes", "fits"} <= set(data["rows"][0])
    assert data["budget_bytes"] == 34 * 2**20
    assert data["fixed_bytes"] > 32 * 2**20  # the CUDA kernel workspace is included
    assert data["per_sample_bytes"] > 0
    largest = data["max_micro_batch_size"]
    # The boundary agrees with the rows: every listed size up to it fits, none above it.
    for row in data["rows"]:
        assert row["fits"] is (row["micro_batch_size"] <= largest)
    assert data["check_micro_batch_size"] == 64  # the middle of the sizes between the anchors
    assert abs(data["residual_bytes"]) < 0.01 * data["rows"][2]["predicted_bytes"]


def test_estimate_table_reports_fit_and_the_linear_model() -> None:
    result = runner.invoke(
        app, ["estimate", DIGITS, "-b", "8,64,1024", "--memory-budget", "40MiB", "--device", "cpu"]
    )
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "digits_cnn on cpu, sgd from space digits_cnn_sgd" in out
    assert "budget 40.00 MiB (explicit)" in out
    assert "linear model: peak(b) = " in out and "residual" in out
    assert "largest micro batch that fits: " in out
    assert "no GPU step" in out


def test_estimate_without_driver_or_budget_still_predicts_and_says_why_no_verdict() -> None:
    result = runner.invoke(app, ["estimate", DIGITS, "-b", "8,32", "--json"])
    assert result.exit_code == 0
    assert "NVML is not available here" in result.stderr
    data = json.loads(result.stdout)
    assert data["budget_bytes"] is None and data["max_micro_batch_size"] is None
    assert all(r["fits"] is None for r in data["rows"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-b", "8,x"], "command line: --batch: must be positive integers separated by commas"),
        (
            ["-b", "8", "--memory-budget", "-1GiB"],
            "command line: --memory-budget: must be a positive size",
        ),
        (["-b", "8", "--memory-budget", "2GX"], "command line: --memory-budget: unknown unit 'GX'"),
        (["-b", "8", "--device", "tpu"], "command line: --device: must be cpu, cuda or cuda:N"),
    ],
)
def test_estimate_bad_options_exit_2_with_the_option_named(args: list[str], message: str) -> None:
    proc = run_cli("estimate", DIGITS, *args)
    assert proc.returncode == 2
    assert f"raybatch: error: {message}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_estimate_reports_an_untraceable_workload_without_a_traceback(tmp_path: Path) -> None:
    module = tmp_path / "dd.py"
    module.write_text(UNTRACEABLE)
    proc = run_cli("estimate", f"{module}:W", "-b", "8", "--memory-budget", "1GiB")
    assert proc.returncode == 2
    assert (
        "memory trace failed: DataDependentOutputException in aten._local_scalar_dense"
        in proc.stderr
    )
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------- bad starts of a search


def _search(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "raybatch", "search", "raybatch.examples.digits:workload",
         "--run-dir", str(tmp_path / "run"), "--trials", "2", *args],
        capture_output=True, text=True, cwd=tmp_path, check=False, timeout=120,
    )  # fmt: skip
    return proc, time.perf_counter() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_dead_cluster_address_fails_in_seconds_and_writes_nothing(tmp_path: Path) -> None:
    address = f"127.0.0.1:{_free_port()}"
    proc, seconds = _search(tmp_path, "--target", "0.9", "--address", address)
    assert proc.returncode == 2
    assert f"raybatch: error: no Ray cluster answers at {address} (" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert seconds < 30
    assert not (tmp_path / "run").exists()


def test_a_local_ray_that_cannot_start_ends_in_one_line_and_leaves_no_run(tmp_path: Path) -> None:
    """Ray's temporary folder under a file: a real local start that fails (as one whose
    processes time out on a machine too busy) is said in one line, and the run directory holds
    no run, so the same command is accepted once Ray can start."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "raybatch", "search", "raybatch.examples.digits:workload",
         "--run-dir", str(tmp_path / "run"), "--trials", "2", "--target", "0.9"],
        capture_output=True, text=True, cwd=tmp_path, check=False, timeout=120,
        env={**os.environ, "RAY_TMPDIR": str(blocker / "ray")},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("raybatch:")]
    assert lines == [
        f"raybatch: error: a local Ray could not start: [Errno 20] Not a directory:"
        f" '{blocker / 'ray'}' (Ray's temporary folder: RAY_TMPDIR, or the system's temporary"
        " folder); nothing ran: once Ray can start here, run the command again"
    ], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert time.perf_counter() - start < 60
    assert not (tmp_path / "run" / "run.json").exists()  # the same command is accepted again


SMALL_DATA = """
import torch
from torch.utils.data import TensorDataset
from raybatch.examples.tabular import FEATURES, TabularWorkload

class Small(TabularWorkload):
    name = "small_tabular"

    def train_dataset(self):
        return TensorDataset(torch.randn(400, FEATURES), torch.zeros(400, dtype=torch.long))

workload = Small()
"""


def test_micro_batches_larger_than_the_training_set_are_named_before_ray_starts(
    tmp_path: Path,
) -> None:
    # A preset written for 20,000 samples, a user's 400: the opening's largest batches would
    # fail in every trial; said at once, with the space's field and the choices to drop.
    (tmp_path / "small.py").write_text(SMALL_DATA)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "raybatch", "search", "small.py:workload", "--space",
         "tabular_mlp_adamw", "--target", "0.9", "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, cwd=tmp_path, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 1, proc.stderr
    assert "tabular_mlp_adamw.yaml: search.micro_batch_size: 512, 1024 larger than" in errors[0]
    assert "small_tabular's training set (400 samples)" in errors[0]
    assert time.perf_counter() - start < 60
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("97", "97 is outside the range of accuracy (higher is better, 0..1); did you mean"
               " accuracy>=0.97?"),
        ("accuracy>=97", "did you mean accuracy>=0.97?"),
        ("f1>=0.5", "the workload reports no metric 'f1'; it reports accuracy"),
        ("accuracy<=0.5", "accuracy<=0.5 asks accuracy to go the wrong way"),
    ],
)  # fmt: skip
def test_a_target_the_workload_cannot_reach_fails_before_any_trial(
    tmp_path: Path, target: str, message: str
) -> None:
    proc, _ = _search(tmp_path, "--target", target)
    assert proc.returncode == 2
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("raybatch: error: command line: --target: ")
    assert message in errors[0]
    assert not (tmp_path / "run").exists()  # nothing launched, nothing written


def test_a_space_file_with_a_duplicated_key_fails_naming_both_lines(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(
        "name: dup\n"
        "reference: {batch_size: 64, lr: 0.1, optimizer: sgd}\n"
        "rules: {lr: linear}\n"
        "reference: {batch_size: 128, lr: 0.2, optimizer: sgd}\n"
        "search: {micro_batch_size: [32, 64]}\n"
    )
    proc, _ = _search(tmp_path, "--target", "0.9", "--space", str(space))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"raybatch: error: {space}:4: reference: duplicate key: given on line 2 and again on"
        " line 4 (YAML would silently keep the last); keep one"
    )
    assert not (tmp_path / "run").exists()
