"""Scaling rules: how a hyperparameter follows the effective batch size.

A rule maps the ratio ``B / B_ref`` of the effective batch to the reference batch to a
multiplicative factor on the reference value:

- ``linear``: factor ``B / B_ref``. The rule for SGD with momentum, validated on ImageNet
  up to batch 8k by Goyal et al. 2017, "Accurate, Large Minibatch SGD".
- ``sqrt``: factor ``sqrt(B / B_ref)``. The rule for Adam-family optimizers (Hoffer et al.
  2017; Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient
  Algorithms"), and the default for weight decay (seed 003, Pattern 8).
- ``none``: factor 1; the value stays at the reference whatever the batch.

The ratio is always that of the *effective* batch (micro batch x accumulation steps x world
size), never the micro batch alone (seed 003, Pitfall 4).
"""

from __future__ import annotations

from enum import Enum


class ScalingRule(str, Enum):
    """How a value scales with the effective batch size."""

    LINEAR = "linear"
    SQRT = "sqrt"
    NONE = "none"

    @property
    def exponent(self) -> float:
        """The power ``p`` in ``factor = (B / B_ref) ** p``."""
        return _EXPONENTS[self]

    @property
    def citation(self) -> str:
        """Where the rule comes from, for reports and ``explain()`` texts."""
        return _CITATIONS[self]

    def factor(self, batch_ratio: float) -> float:
        """The multiplier on the reference value for ``batch_ratio = B / B_ref``."""
        if batch_ratio <= 0:
            raise ValueError(f"batch ratio must be positive, got {batch_ratio}")
        # Exact at the reference batch (1.0 ** p == 1.0), so the reference recipe is
        # reproduced bit for bit.
        return float(batch_ratio**self.exponent)


_EXPONENTS = {ScalingRule.LINEAR: 1.0, ScalingRule.SQRT: 0.5, ScalingRule.NONE: 0.0}
_CITATIONS = {
    ScalingRule.LINEAR: "linear rule, Goyal et al. 2017",
    ScalingRule.SQRT: "square-root rule, Hoffer et al. 2017 / Malladi et al. 2022",
    ScalingRule.NONE: "no scaling",
}


class OptimizerFamily(str, Enum):
    """The optimizer the reference recipe was tuned with.

    Later layers build the optimizer from it (``torch.optim.SGD`` / ``AdamW`` / ``Adam``)
    with the derived lr and weight decay and the reference's extra keyword arguments.
    """

    SGD = "sgd"
    ADAMW = "adamw"
    ADAM = "adam"
