"""Deriving trial recipes from raw knobs: the coupling rules as properties, and the limits."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from raybatch import SearchSpace, TrialConfig, keys, load_space
from raybatch.errors import ConfigError
from raybatch.space.rules import ScalingRule

from .conftest import minimal_space

rules = st.sampled_from(list(ScalingRule))
batch = st.integers(min_value=1, max_value=512)
accum = st.integers(min_value=1, max_value=16)
world = st.integers(min_value=1, max_value=8)
multiplier = st.floats(min_value=0.25, max_value=4.0)


@st.composite
def spaces(draw: st.DrawFn, warmup_may_be_off: bool = False) -> SearchSpace:
    """Any valid space: random reference recipe, rules and warmup settings.

    With warmup off, knobs outside the space's own choices may reach the mandatory-warmup
    threshold and be refused, so only the warmup test asks for such spaces.
    """
    lengths = [1.0, 100.0, 12345.0] + ([0.0] if warmup_may_be_off else [])
    warmup_samples = draw(st.sampled_from(lengths))
    data = minimal_space(
        reference={
            "batch_size": draw(st.integers(min_value=1, max_value=1024)),
            "lr": draw(st.floats(min_value=1e-6, max_value=1.0)),
            "weight_decay": draw(st.floats(min_value=1e-6, max_value=0.1)),
            "optimizer": draw(st.sampled_from(["sgd", "adamw", "adam"])),
        },
        rules={"lr": draw(rules), "weight_decay": draw(rules)},
        search={"micro_batch_size": [1], "accumulation_steps": [1]},
        warmup={
            "samples_per_scale": warmup_samples,
            "from_scale": draw(st.floats(min_value=0.0, max_value=7.9)),
            "required_from_scale": draw(st.floats(min_value=8.0, max_value=16.0)),
        },
    )
    return SearchSpace.from_dict(data)


def with_rules(space: SearchSpace, **rules: str) -> SearchSpace:
    """The same space with some rules replaced (validated again, like a file would be)."""
    data = space.model_dump()
    data["rules"] = {**data["rules"], **rules}
    return SearchSpace.from_dict(data)


@given(spaces(), batch, accum, world)
def test_reference_batch_reproduces_reference_lr_and_weight_decay_exactly(
    space: SearchSpace, m: int, a: int, w: int
) -> None:
    ref = space.reference
    cfg = space.derive(micro_batch_size=ref.batch_size)
    assert (cfg.lr, cfg.weight_decay, cfg.lr_scale) == (ref.lr, ref.weight_decay, 1.0)
    # Any factorisation of the reference batch is the reference too.
    if ref.batch_size % (a * w) == 0:
        split = space.derive(ref.batch_size // (a * w), a, w)
        assert (split.lr, split.weight_decay) == (ref.lr, ref.weight_decay)


@given(spaces(), batch, accum, world)
def test_linear_rule_doubles_lr_when_the_effective_batch_doubles(
    space: SearchSpace, m: int, a: int, w: int
) -> None:
    space = with_rules(space, lr="linear")
    one = space.derive(m, a, w)
    two = space.derive(2 * m, a, w)
    assert two.effective_batch_size == 2 * one.effective_batch_size
    assert two.lr == pytest.approx(2 * one.lr)
    assert one.lr == pytest.approx(
        space.reference.lr * one.effective_batch_size / space.reference.batch_size
    )


@given(spaces(), batch, accum, world)
def test_sqrt_rule_multiplies_lr_by_sqrt2_when_the_effective_batch_doubles(
    space: SearchSpace, m: int, a: int, w: int
) -> None:
    space = with_rules(space, lr="sqrt")
    assert space.derive(2 * m, a, w).lr == pytest.approx(space.derive(m, a, w).lr * math.sqrt(2))


@given(spaces(), batch, accum, world)
def test_weight_decay_follows_sqrt_of_the_effective_batch(
    space: SearchSpace, m: int, a: int, w: int
) -> None:
    space = with_rules(space, weight_decay="sqrt")
    cfg = space.derive(m, a, w)
    ratio = cfg.effective_batch_size / space.reference.batch_size
    assert cfg.weight_decay == pytest.approx(space.reference.weight_decay * math.sqrt(ratio))
    assert space.derive(m, a, 2 * w).weight_decay == pytest.approx(cfg.weight_decay * math.sqrt(2))


@given(spaces(), batch, accum, world, multiplier)
def test_lr_follows_effective_batch_not_micro_batch(
    space: SearchSpace, m: int, a: int, w: int, mult: float
) -> None:
    split = space.derive(m, a, w, lr_multiplier=mult)
    whole = space.derive(m * a * w, 1, 1, lr_multiplier=mult)
    assert split.effective_batch_size == m * a * w
    assert (split.lr, split.weight_decay, split.warmup_samples, split.warmup_steps) == (
        whole.lr,
        whole.weight_decay,
        whole.warmup_samples,
        whole.warmup_steps,
    )
    if space.rules.lr is not ScalingRule.NONE and a * w > 1:
        # Same micro batch, more accumulation or workers: the LR must move.
        assert space.derive(m, 1, 1, lr_multiplier=mult).lr != split.lr


@given(spaces(warmup_may_be_off=True), batch, accum, world, multiplier)
def test_warmup_is_present_whenever_the_lr_scale_passes_the_threshold(
    space: SearchSpace, m: int, a: int, w: int, mult: float
) -> None:
    try:
        cfg = space.derive(m, a, w, lr_multiplier=mult)
    except ConfigError as exc:
        # Only a space with warmup switched off may refuse, and only past the threshold.
        assert space.warmup.samples_per_scale == 0
        assert "warmup is mandatory" in str(exc)
        return
    if cfg.lr_scale >= space.warmup.required_from_scale:
        assert cfg.warmup_steps >= 1
        assert cfg.warmup_samples >= 1
    assert cfg.warmup_steps == math.ceil(cfg.warmup_samples / cfg.effective_batch_size)


@given(spaces(), batch, accum, world)
def test_warmup_length_grows_with_the_lr_scale(space: SearchSpace, m: int, a: int, w: int) -> None:
    assume(space.warmup.samples_per_scale > 0)
    space = with_rules(space, lr="linear")
    small, large = (
        space.derive(m, a, w, lr_multiplier=1.0),
        space.derive(m, a, w, lr_multiplier=2.0),
    )
    assert large.warmup_samples >= small.warmup_samples


@given(st.integers(min_value=17, max_value=64))
def test_accumulation_above_the_limit_is_refused_with_the_limit_named(a: int) -> None:
    space = SearchSpace.from_dict(minimal_space())
    with pytest.raises(ConfigError) as err:
        space.derive(32, a)
    assert f"accumulation_steps: {a} exceeds limits.max_accumulation_steps = 16" in str(err.value)


@settings(max_examples=30)
@given(st.lists(st.integers(min_value=1, max_value=16), min_size=1, max_size=5, unique=True))
def test_no_point_of_a_valid_space_exceeds_the_accumulation_limit(choices: list[int]) -> None:
    limit = max(choices)
    data = minimal_space(limits={"max_accumulation_steps": limit})
    data["search"] = {"micro_batch_size": [8, 16], "accumulation_steps": choices}
    space = SearchSpace.from_dict(data)
    assert all(c.accumulation_steps <= limit for c in space.grid())


def test_effective_batch_larger_than_the_dataset_is_refused() -> None:
    space = SearchSpace.from_dict(minimal_space(limits={"dataset_size": 600}))
    with pytest.raises(
        ConfigError, match=r"effective_batch_size: 1024 .* exceeds limits.dataset_size = 600"
    ):
        space.derive(256, 4)


@pytest.mark.parametrize(
    ("knobs", "field", "message"),
    [
        ({"micro_batch_size": 0}, "micro_batch_size", "must be a positive integer, got 0"),
        ({"micro_batch_size": 12.5}, "micro_batch_size", "must be a positive integer, got 12.5"),
        ({"micro_batch_size": True}, "micro_batch_size", "must be a positive integer, got True"),
        (
            {"micro_batch_size": 8, "world_size": -2},
            "world_size",
            "must be a positive integer, got -2",
        ),
        (
            {"micro_batch_size": 8, "lr_multiplier": 0.0},
            "lr_multiplier",
            "must be a positive finite number, got 0.0",
        ),
        (
            {"micro_batch_size": 8, "weight_decay_multiplier": float("nan")},
            "weight_decay_multiplier",
            "must be a positive finite number, got nan",
        ),
    ],
)
def test_invalid_knobs_are_refused_naming_the_knob(
    knobs: dict[str, Any], field: str, message: str
) -> None:
    space = SearchSpace.from_dict(minimal_space(), source="spaces/t.yaml")
    with pytest.raises(ConfigError) as err:
        space.derive(**knobs)
    assert f"spaces/t.yaml: {field}: {message}" in str(err.value)


def test_derived_config_round_trips_through_a_plain_dict() -> None:
    space = SearchSpace.from_dict(minimal_space())
    for cfg in space.grid():
        data = cfg.to_dict()
        assert TrialConfig.from_dict(data) == cfg
        assert all(isinstance(v, int | float | str | dict) for v in data.values())


def test_from_dict_ignores_foreign_keys_and_accepts_numpy_values() -> None:
    cfg = SearchSpace.from_dict(minimal_space()).derive(64, 2)
    data: dict[str, Any] = {**cfg.to_dict(), "user_key": "x"}
    data[keys.MICRO_BATCH_SIZE] = np.int64(64)
    data[keys.LR] = np.float64(cfg.lr)
    assert TrialConfig.from_dict(data) == cfg


def test_from_dict_names_every_missing_or_mistyped_key() -> None:
    data = SearchSpace.from_dict(minimal_space()).derive(64).to_dict()
    del data[keys.LR]
    data[keys.WARMUP_STEPS] = "many"
    with pytest.raises(ConfigError) as err:
        TrialConfig.from_dict(data, source="best_config.json")
    text = str(err.value)
    assert "best_config.json: lr: missing" in text
    assert "best_config.json: warmup_steps: must be an integer, got 'many'" in text


def test_derive_from_reads_the_knobs_of_a_ray_config() -> None:
    space = SearchSpace.from_dict(minimal_space())
    ray_config = {"micro_batch_size": np.int64(32), "accumulation_steps": 4, "other": 1}
    assert space.derive_from(ray_config) == space.derive(32, 4)
    with pytest.raises(ConfigError, match="micro_batch_size: missing"):
        space.derive_from({"accumulation_steps": 2})


def test_a_config_carrying_its_recipe_must_agree_with_its_knobs() -> None:
    """The searcher's configs carry the whole recipe: at the trial's door it is the recipe of
    the knobs, and a carried value the rules would not give (an ``lr`` typed beside the knobs,
    a recipe from another or an edited space) is refused by name, never trained under knobs
    that say something else."""
    space = load_space("generic_adamw")
    carried = {**space.derive(32, 4).to_dict(), "user_key": 1}
    assert space.recipe_of(carried) == space.derive(32, 4)
    knobs_only = {"micro_batch_size": 32, "accumulation_steps": 4}
    assert space.recipe_of(knobs_only) == space.derive(32, 4)
    with pytest.raises(ConfigError, match=r"lr: is 0\.123, but the space's rules give"):
        space.recipe_of({**carried, "lr": 0.123})
    overridden = {**carried, "micro_batch_size": 256}  # the knob changed, the rest did not
    with pytest.raises(ConfigError, match="effective_batch_size: is 128"):
        space.recipe_of(overridden)
    other = load_space("digits_cnn_sgd").derive(32, 4).to_dict()
    with pytest.raises(ConfigError, match="space: is 'digits_cnn_sgd'"):
        space.recipe_of(other)


def test_explain_names_the_rules_applied() -> None:
    space = SearchSpace.from_dict(minimal_space())
    text = space.derive(128, 4, lr_multiplier=1.5).explain()
    assert "effective batch 512 = micro 128 x accumulation 4 x world 1" in text
    assert (
        "lr 0.3 = 0.1 x rule factor 2 (linear rule, Goyal et al. 2017, batch 512/256)"
        " x multiplier 1.5" in text
    )
    assert "square-root rule" in text
    assert "warmup 3000 samples = 6 optimizer steps (LR scale 3x)" in text


def test_grid_covers_every_combination_in_effective_batch_order() -> None:
    space = SearchSpace.from_dict(minimal_space())
    grid = list(space.grid())
    assert len(grid) == 9
    assert [c.effective_batch_size for c in grid] == sorted(c.effective_batch_size for c in grid)
    assert {(c.micro_batch_size, c.accumulation_steps) for c in grid} == {
        (m, a) for m in (32, 64, 128) for a in (1, 2, 4)
    }


def test_reference_config_is_the_reference_recipe() -> None:
    space = SearchSpace.from_dict(minimal_space())
    cfg = space.reference_config()
    assert (cfg.effective_batch_size, cfg.lr, cfg.weight_decay) == (256, 0.1, 1e-4)
    assert cfg.warmup_samples == 0  # scale 1 is not above from_scale 1


def test_space_is_immutable() -> None:
    space = SearchSpace.from_dict(minimal_space())
    with pytest.raises(ValueError, match="frozen"):
        space.name = "other"  # type: ignore[misc]
