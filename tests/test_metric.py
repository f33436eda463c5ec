"""Targets are checked against the metrics a workload reports; a target picks one by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import raybatch
from raybatch import Metric, Target, keys
from raybatch.cli.template import render, write_template
from raybatch.errors import OptionError, WorkloadError
from raybatch.metric import ACCURACY, check_target, metric_values, resolve_target
from raybatch.trial.settings import TrialSettings
from raybatch.trial.wrapper import run_trial
from raybatch.workload import load_workload

LOSS = Metric("loss", "min", low=0.0)
BOTH = (ACCURACY, LOSS)
SAMPLES = 50_000
"""What bounds the template's trials: a sample budget (they reached at 8,192 samples), with the
time cap far past it; a time cap is what a loaded machine runs out of first."""


def test_a_bare_number_means_the_first_metric_in_its_direction() -> None:
    assert resolve_target(0.97, BOTH) == Target(0.97, "max", "accuracy")
    assert resolve_target("0.3", (LOSS, ACCURACY)) == Target(0.3, "min", "loss")
    assert resolve_target("loss<=0.35", BOTH) == Target(0.35, "min", "loss")


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (Target(97.0), "97 is outside the range of accuracy (higher is better, 0..1); did you"
                       " mean accuracy>=0.97?"),
        (Target(-0.1), "-0.1 is outside the range of accuracy"),
        (Target(0.5, "max", "f1"), "reports no metric 'f1'; it reports accuracy (higher is"
                                   " better, 0..1), loss (lower is better, 0..inf)"),
        (Target(0.3, "max", "loss"), "asks loss to go the wrong way: it is lower-is-better;"
                                     " write loss<=0.3"),
        (Target(-1.0, "min", "loss"), "-1 is outside the range of loss"),
    ],
)  # fmt: skip
def test_targets_no_trial_can_meet_are_refused_naming_what_to_write(
    target: Target, message: str
) -> None:
    with pytest.raises(OptionError) as info:
        check_target(target, BOTH)
    assert str(info.value).startswith("<python>: target: ")
    assert message in str(info.value)


def test_evaluate_may_return_a_number_or_a_mapping() -> None:
    assert metric_values(0.9, BOTH) == {"accuracy": 0.9}
    assert metric_values({"accuracy": 0.9, "loss": 0.2}, BOTH) == {"accuracy": 0.9, "loss": 0.2}
    with pytest.raises(WorkloadError, match="must return a number or a mapping"):
        metric_values("high", BOTH)  # type: ignore[arg-type]


def test_trainable_refuses_an_unreachable_target_before_any_trial() -> None:
    from raybatch.examples.digits import workload

    with pytest.raises(OptionError, match=r"did you mean accuracy>=0\.97"):
        raybatch.trainable(workload, "digits_cnn_sgd", 97)


# ---------------------------------------------------------------------- the template


def test_init_workload_writes_the_file_and_its_space_and_never_overwrites(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from raybatch.cli.app import app

    runner = CliRunner()
    target = tmp_path / "mine.py"
    first = runner.invoke(app, ["init-workload", str(target)])
    assert first.exit_code == 0, first.output
    assert target.is_file() and (tmp_path / "mine_space.yaml").is_file()
    assert f"raybatch search {target}:workload --space {tmp_path / 'mine_space.yaml'}" in (
        first.output
    )
    again = runner.invoke(app, ["init-workload", str(target)])
    assert again.exit_code == 2
    assert f"{target}: (file): exists; choose another name" in again.output


def _trial(workload: Any, target: Target, micro: int) -> tuple[Any, list[dict[str, Any]]]:
    reports: list[dict[str, Any]] = []
    space = raybatch.load_space(str(workload.space_path))
    settings = TrialSettings(target, max_time_s=600.0, max_samples=SAMPLES)
    config = {keys.MICRO_BATCH_SIZE: micro}
    return run_trial(workload, space, settings, config, report_fn=reports.append), reports


@pytest.fixture
def template_workload(tmp_path: Path) -> Any:
    path, space_path = write_template(tmp_path / "my_workload.py")
    workload = load_workload(f"{path}:workload")
    workload.space_path = space_path  # for the helper above
    return workload


def test_the_template_trains_to_an_accuracy_target_as_written(template_workload: Any) -> None:
    reporter, reports = _trial(template_workload, Target(0.9), micro=64)
    assert reporter.status.value == "reached", reporter.reason
    assert reports[-1]["val_accuracy"] >= 0.9 and reports[-1]["val_loss"] > 0


def test_a_loss_target_picks_the_loss_among_the_metrics(template_workload: Any) -> None:
    target = resolve_target("loss<=0.35", template_workload.metrics)
    reporter, reports = _trial(template_workload, target, micro=64)
    assert reporter.status.value == "reached", reporter.reason
    assert reports[-1][keys.METRIC] == reports[-1]["val_loss"] <= 0.35
    assert all(r[keys.METRIC] > 0.35 for r in reports[:-1])


def test_the_workloads_guide_shows_the_template_files() -> None:
    readme = (Path(__file__).parents[1] / "docs" / "workloads.md").read_text()
    workload_text, _, space_text = render(Path("my_workload.py"))
    assert workload_text in readme
    assert space_text in readme


def test_a_malformed_target_blames_the_option_on_the_cli_and_the_argument_in_python() -> None:
    with pytest.raises(OptionError) as from_python:
        Target.parse("fast")
    assert str(from_python.value) == (
        "<python>: target: must be METRIC>=VALUE, METRIC<=VALUE or VALUE, got 'fast'"
    )
    with pytest.raises(OptionError) as from_cli:
        Target.parse("fast", "command line")
    assert str(from_cli.value).startswith("command line: --target: must be")
