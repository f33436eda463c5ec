"""The scaling rules, as properties over all batch ratios."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raybatch.space.rules import ScalingRule

ratios = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)


@pytest.mark.parametrize("rule", list(ScalingRule))
def test_every_rule_is_exactly_one_at_the_reference_batch(rule: ScalingRule) -> None:
    assert rule.factor(1.0) == 1.0


@given(ratios)
def test_linear_rule_is_proportional_to_the_batch_ratio(ratio: float) -> None:
    assert ScalingRule.LINEAR.factor(ratio) == pytest.approx(ratio)
    assert ScalingRule.LINEAR.factor(2 * ratio) == pytest.approx(
        2 * ScalingRule.LINEAR.factor(ratio)
    )


@given(ratios)
def test_sqrt_rule_multiplies_by_sqrt2_when_the_batch_doubles(ratio: float) -> None:
    doubled = ScalingRule.SQRT.factor(2 * ratio) / ScalingRule.SQRT.factor(ratio)
    assert doubled == pytest.approx(math.sqrt(2))


@given(ratios)
def test_none_rule_never_moves_the_value(ratio: float) -> None:
    assert ScalingRule.NONE.factor(ratio) == 1.0


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_a_non_positive_batch_ratio_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="batch ratio must be positive"):
        ScalingRule.LINEAR.factor(bad)


def test_every_rule_names_its_source() -> None:
    assert "Goyal" in ScalingRule.LINEAR.citation
    assert "Malladi" in ScalingRule.SQRT.citation
