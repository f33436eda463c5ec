"""Every kind of bad space input gets an error naming the file, the field and what is allowed.

One table of cases is run three ways: through the Python API (dict), through a YAML file
(which adds the line), and through the CLI (exit status 2, message on stderr, no traceback).
"""

from __future__ import annotations

from typing import Any

import pytest

from raybatch import SearchSpace
from raybatch.errors import SpaceError

from .conftest import minimal_space, run_cli


def _with(section: str, **values: Any) -> dict[str, Any]:
    data = minimal_space()
    data[section] = {**data[section], **values}
    return data


def _without(section: str) -> dict[str, Any]:
    data = minimal_space()
    del data[section]
    return data


# (case id, space dict, field, message fragment)
CASES = [
    (
        "negative_lr",
        _with("reference", lr=-0.1),
        "reference.lr",
        "must be greater than 0 (got -0.1)",
    ),
    (
        "accumulation_above_limit",
        _with("search", accumulation_steps=[1, 32]),
        "search.accumulation_steps[1]",
        "32 exceeds limits.max_accumulation_steps = 16 (past it the slowdown of accumulation"
        " rarely pays); allowed: 1..16",
    ),
    (
        "unknown_lr_rule",
        _with("rules", lr="cubic"),
        "rules.lr",
        "must be 'linear', 'sqrt' or 'none' (got 'cubic')",
    ),
    (
        "unknown_weight_decay_rule",
        _with("rules", weight_decay="quadratic"),
        "rules.weight_decay",
        "must be 'linear', 'sqrt' or 'none' (got 'quadratic')",
    ),
    (
        "micro_batch_zero",
        _with("search", micro_batch_size=[32, 0]),
        "search.micro_batch_size[1]",
        "must be greater than 0 (got 0)",
    ),
    (
        "micro_batch_fraction",
        _with("search", micro_batch_size=[32, 12.5]),
        "search.micro_batch_size[1]",
        "must be a valid integer (got 12.5)",
    ),
    (
        "micro_batch_string",
        _with("search", micro_batch_size=["64"]),
        "search.micro_batch_size[0]",
        "must be a valid integer (got '64')",
    ),
    (
        "micro_batch_duplicated",
        _with("search", micro_batch_size=[32, 32]),
        "search.micro_batch_size",
        "choices must be distinct, repeated: [32]",
    ),
    (
        "unknown_optimizer",
        _with("reference", optimizer="lamb"),
        "reference.optimizer",
        "must be 'sgd', 'adamw' or 'adam' (got 'lamb')",
    ),
    (
        "misspelt_field",
        _with("reference", learning_rate=0.1),
        "reference.learning_rate",
        "unknown field; allowed: batch_size, lr, weight_decay, optimizer, optimizer_kwargs",
    ),
    ("missing_section", _without("rules"), "rules", "required field is missing"),
    (
        "multiplier_range_reversed",
        _with("search", lr_multiplier={"low": 2.0, "high": 0.5}),
        "search.lr_multiplier",
        "low (2.0) must not exceed high (0.5)",
    ),
    (
        "warmup_off_past_threshold",
        {**_with("search", accumulation_steps=[1, 16]), "warmup": {"samples_per_scale": 0}},
        "warmup.samples_per_scale",
        "0 disables warmup, but this space scales the LR up to 8x and warmup is mandatory from 8x",
    ),
    (
        "warmup_starts_past_threshold",
        {**minimal_space(), "warmup": {"samples_per_scale": 10, "from_scale": 9}},
        "warmup.from_scale",
        "9 leaves LR scales from 8x (warmup.required_from_scale) to 9x without warmup",
    ),
    (
        "dataset_smaller_than_largest_batch",
        {**minimal_space(), "limits": {"dataset_size": 300}},
        "limits.dataset_size",
        "the largest effective batch of this space is 512 (micro 128 x accumulation 4 x world 1),"
        " more than the 300 training samples",
    ),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize(("case", "data", "field", "message"), CASES, ids=IDS)
def test_python_api_names_source_field_and_allowed_values(
    case: str, data: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(SpaceError) as err:
        SearchSpace.from_dict(data, source="my_space.yaml")
    assert f"my_space.yaml: {field}: {message}" in str(err.value)
    assert any(issue.field == field for issue in err.value.issues)


@pytest.mark.parametrize(("case", "data", "field", "message"), CASES, ids=IDS)
def test_yaml_file_errors_name_the_file_and_line(
    case: str, data: dict[str, Any], field: str, message: str, write_space: Any
) -> None:
    path = write_space(data)
    with pytest.raises(SpaceError) as err:
        SearchSpace.from_yaml(path)
    issue = next(i for i in err.value.issues if i.field == field)
    assert issue.line is not None
    assert f"{path}:{issue.line}: {field}: {message}" in str(err.value)
    # The line really holds the field (or its section, when the field is missing).
    key = field.split(".")[-1].split("[")[0]
    text = path.read_text().splitlines()[issue.line - 1]
    assert key in text or field == "rules" or text.lstrip().startswith("-")


@pytest.mark.parametrize(("case", "data", "field", "message"), CASES, ids=IDS)
def test_cli_reports_bad_space_files_without_a_traceback(
    case: str, data: dict[str, Any], field: str, message: str, write_space: Any
) -> None:
    path = write_space(data)
    proc = run_cli("space", str(path), "--batch", "32")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"raybatch: error: {path}:")
    assert f"{field}: {message}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_yaml_syntax_error_gives_line_and_column(write_space: Any) -> None:
    path = write_space("name: t\nreference:\n  batch_size: [256\n  lr: 0.1\n")
    with pytest.raises(SpaceError) as err:
        SearchSpace.from_yaml(path)
    assert str(err.value).startswith(f"{path}:4: (yaml syntax): ")
    assert "column" in str(err.value)
    proc = run_cli("space", str(path), "--batch", "8")
    assert proc.returncode == 2
    assert f"{path}:4: (yaml syntax)" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("text", "kind"), [("", "empty"), ("- 1\n- 2\n", "list")])
def test_a_file_that_is_not_a_mapping_is_refused(text: str, kind: str, write_space: Any) -> None:
    path = write_space(text)
    with pytest.raises(
        SpaceError, match=f"{path}:1: \\(document\\): must be a mapping of fields, got {kind}"
    ):
        SearchSpace.from_yaml(path)


def test_all_issues_are_reported_at_once(write_space: Any) -> None:
    data = _with("reference", lr=-1, batch_size=0)
    data["rules"] = {"lr": "cubic"}
    with pytest.raises(SpaceError) as err:
        SearchSpace.from_yaml(write_space(data))
    assert {i.field for i in err.value.issues} == {
        "reference.lr",
        "reference.batch_size",
        "rules.lr",
    }


def test_keyword_construction_raises_the_same_errors() -> None:
    data = _with("reference", lr=-0.1)
    with pytest.raises(SpaceError, match=r"<python>: reference.lr: must be greater than 0"):
        SearchSpace(**data)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--batch", "64", "--accum", "32"],
            "accumulation_steps: 32 exceeds limits.max_accumulation_steps = 16",
        ),
        (["--batch", "0"], "micro_batch_size: must be a positive integer, got 0"),
        (
            ["--batch", "64", "--lr-multiplier", "-1"],
            "lr_multiplier: must be a positive finite number, got -1.0",
        ),
    ],
)
def test_cli_reports_bad_knobs_naming_the_space_file_and_field(
    args: list[str], message: str, write_space: Any
) -> None:
    path = write_space(minimal_space())
    proc = run_cli("space", str(path), *args)
    assert proc.returncode == 2
    assert f"raybatch: error: {path}: {message}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_reports_an_unknown_preset_with_the_list_of_presets() -> None:
    proc = run_cli("space", "resnet51", "--batch", "8")
    assert proc.returncode == 2
    assert "raybatch: error: resnet51: no preset of that name (presets: " in proc.stderr
    assert "resnet50_imagenet_sgd" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_reports_a_missing_file() -> None:
    proc = run_cli("space", "nowhere/space.yaml", "--batch", "8")
    assert proc.returncode == 2
    assert "nowhere/space.yaml: no such space file" in proc.stderr
