"""Contract tests run against every bundled preset: adding a preset adds its tests."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import pytest

from raybatch import load_space
from raybatch.space.presets import list_presets, preset_dir, resolve_space_path
from raybatch.space.rules import ScalingRule

PRESETS = sorted(p.stem for p in preset_dir().glob("*.yaml"))


def test_at_least_the_five_required_presets_exist() -> None:
    assert {
        "resnet50_imagenet_sgd",
        "bert_finetune_adamw",
        "deit_vit_adamw",
        "generic_adamw",
        "digits_cnn_sgd",
    } <= set(PRESETS)
    assert [p.name for p in list_presets()] == PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_by_name_and_its_name_is_the_file_stem(name: str) -> None:
    space = load_space(name)
    assert space.name == name
    assert space.description
    assert Path(space.source) == preset_dir() / f"{name}.yaml"


@pytest.mark.parametrize("name", PRESETS)
def test_preset_cites_where_its_reference_numbers_come_from(name: str) -> None:
    head = (preset_dir() / f"{name}.yaml").read_text().split("\ndescription:")[0]
    assert "Source" in head
    assert any(str(year) in head for year in range(2012, 2027))


@pytest.mark.parametrize("name", PRESETS)
def test_preset_derives_every_point_of_its_grid(name: str) -> None:
    space = load_space(name)
    grid = list(space.grid())
    s = space.search
    assert len(grid) == len(s.micro_batch_size) * len(s.accumulation_steps) * len(s.world_size)
    for cfg in grid:
        assert cfg.effective_batch_size == (
            cfg.micro_batch_size * cfg.accumulation_steps * cfg.world_size
        )
        assert cfg.accumulation_steps <= space.limits.max_accumulation_steps
        assert cfg.lr > 0 and math.isfinite(cfg.lr)
        if cfg.lr_scale >= space.warmup.required_from_scale:
            assert cfg.warmup_steps >= 1


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("batch", [1, 8, 100, 256])
def test_preset_derives_at_hand_picked_batch_sizes(name: str, batch: int) -> None:
    space = load_space(name)
    cfg = space.derive(micro_batch_size=batch)
    ratio = batch / space.reference.batch_size
    assert cfg.lr == pytest.approx(space.reference.lr * space.rules.lr.factor(ratio))


@pytest.mark.parametrize("name", PRESETS)
def test_preset_corners_with_extreme_multipliers_are_valid_recipes(name: str) -> None:
    space = load_space(name)
    s = space.search
    lr_range = (s.lr_multiplier.low, s.lr_multiplier.high) if s.lr_multiplier else (1.0,)
    wd_range = (
        (s.weight_decay_multiplier.low, s.weight_decay_multiplier.high)
        if s.weight_decay_multiplier
        else (1.0,)
    )
    corners = itertools.product(
        (min(s.micro_batch_size), max(s.micro_batch_size)),
        (min(s.accumulation_steps), max(s.accumulation_steps)),
        (min(s.world_size), max(s.world_size)),
        lr_range,
        wd_range,
    )
    for m, a, w, lr_mult, wd_mult in corners:
        cfg = space.derive(m, a, w, lr_mult, wd_mult)
        assert cfg.lr_scale <= space.max_lr_scale() * (1 + 1e-12)


def test_goyal_preset_reproduces_the_papers_numbers() -> None:
    space = load_space("resnet50_imagenet_sgd")
    assert (space.reference.batch_size, space.reference.lr) == (256, 0.1)
    assert space.rules.lr is ScalingRule.LINEAR
    eight_k = space.derive(256, 4, 8)
    assert eight_k.effective_batch_size == 8192
    assert eight_k.lr == pytest.approx(3.2)  # 0.1 x 8192/256
    # 5 epochs of ImageNet-1k warmup at 32x, as in the paper.
    assert eight_k.warmup_samples / 1_281_167 == pytest.approx(5.0, rel=1e-4)


def test_a_path_is_read_as_a_file_and_a_name_as_a_preset(tmp_path: Path) -> None:
    copy = tmp_path / "mine.yaml"
    copy.write_text((preset_dir() / "digits_cnn_sgd.yaml").read_text())
    assert load_space(str(copy)).name == "mine"
    assert resolve_space_path("digits_cnn_sgd") == preset_dir() / "digits_cnn_sgd.yaml"


def test_every_preset_is_listed_in_the_spaces_page() -> None:
    """A preset a user can name is one the docs describe (its reference and its source)."""
    root = Path(__file__).parent.parent
    page = (root / "docs" / "spaces.md").read_text()
    for preset in PRESETS:
        assert f"| `{preset}` |" in page, f"docs/spaces.md lists no {preset}"


def test_the_readme_and_docs_link_only_to_files_that_exist() -> None:
    root = Path(__file__).parent.parent
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+\.(?:md|png))\)", page.read_text()):
            assert (page.parent / target).is_file(), f"{page.name} links to missing {target}"
