"""The CLI's happy paths: listing presets, printing one recipe, printing a space's grid."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from raybatch import load_space
from raybatch.cli import app
from raybatch.presets import list_presets

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
