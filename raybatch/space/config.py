"""The derived trial recipe: what one trial trains with.

A :class:`TrialConfig` is produced by :meth:`raybatch.SearchSpace.derive` from the raw
knobs and never edited afterwards (it is frozen). It travels between layers as a plain,
flat dict (:meth:`TrialConfig.to_dict`), because that is what Ray Tune hands a trial,
what Optuna can record and what ``best_config.json`` stores; :meth:`TrialConfig.from_dict`
rebuilds it on the other side.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any

from raybatch import keys
from raybatch.errors import ConfigError, Issue
from raybatch.space.rules import OptimizerFamily, ScalingRule


def warmup_factor(step: int, warmup_steps: int) -> float:
    """LR multiplier after ``step`` optimizer steps: linear ramp to 1 over ``warmup_steps``.

    The recipe's warmup schedule, here with the recipe, so the loop and the exported
    scheduler (:meth:`raybatch.BestConfig.build_scheduler`) apply the same one.
    """
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, (step + 1) / warmup_steps)


def warmup_scheduler(optimizer: Any, warmup_steps: int) -> Any:
    """The recipe's schedule as a ``LambdaLR`` (:func:`warmup_factor`), stepped once per
    optimizer step: what raybatch's loop trains with and every export hands the user."""
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_factor(s, warmup_steps))


@dataclass(frozen=True)
class TrialConfig:
    """One concrete training recipe, derived from raw knobs by a space's rules.

    Attributes:
        space: Name of the space the recipe was derived from.
        micro_batch_size: Samples per forward/backward pass on one device.
        accumulation_steps: Micro batches whose gradients are summed per optimizer step.
        world_size: Data-parallel workers (devices).
        effective_batch_size: ``micro_batch_size * accumulation_steps * world_size``:
            samples per optimizer step, the batch the scaling rules follow.
        lr: Peak learning rate after warmup.
        weight_decay: Weight decay passed to the optimizer.
        lr_scale: ``lr / reference_lr``: how far the LR moved from the reference (rule
            factor times multiplier). Warmup length follows it.
        lr_multiplier: Searched correction applied on top of the LR rule (1.0 = trust it).
        weight_decay_multiplier: Searched correction on top of the weight-decay rule.
        warmup_samples: Length of the linear LR warmup in training samples. Samples are the
            unit of record because they mean the same amount of data at every batch size.
        warmup_steps: The same warmup in optimizer steps, ``ceil(warmup_samples /
            effective_batch_size)``: what a step-based scheduler needs.
        lr_rule: Rule that scaled the LR.
        weight_decay_rule: Rule that scaled the weight decay.
        optimizer: Optimizer family of the reference recipe.
        optimizer_kwargs: Extra optimizer arguments of the reference (momentum, betas...).
        reference_batch_size: Batch size the reference recipe was tuned at.
        reference_lr: Learning rate of the reference recipe.
        reference_weight_decay: Weight decay of the reference recipe.

    Example::

        import torch
        import raybatch

        recipe = raybatch.load_space("digits_cnn_sgd").derive(64, accumulation_steps=4)
        print(recipe.explain())  # which rule gave each value, and from what
        model = torch.nn.Linear(64, 10)  # your model
        optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr,
                                    weight_decay=recipe.weight_decay, **recipe.optimizer_kwargs)
        assert raybatch.TrialConfig.from_dict(recipe.to_dict()) == recipe  # flat, JSON-safe
    """

    space: str
    micro_batch_size: int
    accumulation_steps: int
    world_size: int
    effective_batch_size: int
    lr: float
    weight_decay: float
    lr_scale: float
    lr_multiplier: float
    weight_decay_multiplier: float
    warmup_samples: int
    warmup_steps: int
    lr_rule: ScalingRule
    weight_decay_rule: ScalingRule
    optimizer: OptimizerFamily
    reference_batch_size: int
    reference_lr: float
    reference_weight_decay: float
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        """A flat dict of plain Python values (JSON/YAML-safe), keyed by :mod:`raybatch.keys`."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, ScalingRule | OptimizerFamily):
                value = value.value
            elif isinstance(value, dict):
                value = dict(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> TrialConfig:
        """Rebuild a config from :meth:`to_dict` output (extra keys are ignored).

        Ray Tune configs often hold the user's own keys beside ours, so unknown keys are
        not an error; a missing or mistyped one of ours is, naming the key.

        Raises:
            ConfigError: A key is missing or holds a value of the wrong kind.
        """
        issues: list[Issue] = []
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                if f.name == keys.OPTIMIZER_KWARGS:
                    values[f.name] = {}
                    continue
                issues.append(Issue(f.name, "missing"))
                continue
            try:
                values[f.name] = _coerce(f.name, data[f.name])
            except (TypeError, ValueError) as exc:
                issues.append(Issue(f.name, str(exc)))
        if issues:
            raise ConfigError(issues, source)
        return cls(**values)

    def explain(self) -> str:
        """Say, in one line per value, which rule produced it and from what.

        Users of other finders complain that the LR is scaled silently or not at all
        when batch or accumulation change; every trial can log this text instead.
        """
        ratio = f"{self.effective_batch_size}/{self.reference_batch_size}"
        batch = (
            f"effective batch {self.effective_batch_size} = micro {self.micro_batch_size}"
            f" x accumulation {self.accumulation_steps} x world {self.world_size}"
        )
        lr = (
            f"lr {self.lr:.6g} = {self.reference_lr:g} x rule factor"
            f" {self.lr_rule.factor(self.effective_batch_size / self.reference_batch_size):.4g}"
            f" ({self.lr_rule.citation}, batch {ratio})"
        )
        if self.lr_multiplier != 1.0:
            lr += f" x multiplier {self.lr_multiplier:.4g}"
        wd_factor = self.weight_decay_rule.factor(
            self.effective_batch_size / self.reference_batch_size
        )
        wd = (
            f"weight_decay {self.weight_decay:.6g} = {self.reference_weight_decay:g} x rule"
            f" factor {wd_factor:.4g} ({self.weight_decay_rule.citation}, batch {ratio})"
        )
        if self.weight_decay_multiplier != 1.0:
            wd += f" x multiplier {self.weight_decay_multiplier:.4g}"
        if self.warmup_samples:
            warmup = (
                f"warmup {self.warmup_samples} samples = {self.warmup_steps} optimizer steps"
                f" (LR scale {self.lr_scale:.4g}x)"
            )
        else:
            warmup = f"no warmup (LR scale {self.lr_scale:.4g}x)"
        return "\n".join([batch, lr, wd, warmup])


_INT_KEYS = frozenset(
    {
        keys.MICRO_BATCH_SIZE,
        keys.ACCUMULATION_STEPS,
        keys.WORLD_SIZE,
        keys.EFFECTIVE_BATCH_SIZE,
        keys.WARMUP_SAMPLES,
        keys.WARMUP_STEPS,
        keys.REFERENCE_BATCH_SIZE,
    }
)
_FLOAT_KEYS = frozenset(
    {
        keys.LR,
        keys.WEIGHT_DECAY,
        keys.LR_SCALE,
        keys.LR_MULTIPLIER,
        keys.WEIGHT_DECAY_MULTIPLIER,
        keys.REFERENCE_LR,
        keys.REFERENCE_WEIGHT_DECAY,
    }
)


def carried_recipe(config: Mapping[str, Any], source: str = "a trial's Tune config") -> TrialConfig:
    """The recipe a Tune config carries: the searcher's, derived once where its knobs were
    chosen and carried through Tune, read back here and never derived again. The search's
    side of the Tune boundary, wherever a config comes back (a result, a resource request, the
    study's record); the trial's side checks the carried recipe against its knobs
    (:meth:`raybatch.SearchSpace.recipe_of`).

    Raises:
        ConfigError: The config carries no whole recipe (a key missing or of the wrong kind).
    """
    return TrialConfig.from_dict(config, source)


def _coerce(name: str, value: Any) -> Any:
    """Convert one value read back from a dict (JSON, YAML, numpy from Ray) to its type."""
    if name in _INT_KEYS:
        if isinstance(value, bool) or not isinstance(value, Integral):
            raise TypeError(f"must be an integer, got {value!r}")
        return int(value)
    if name in _FLOAT_KEYS:
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise TypeError(f"must be a finite number, got {value!r}")
        return float(value)
    if name in (keys.LR_RULE, keys.WEIGHT_DECAY_RULE):
        return ScalingRule(value)
    if name == keys.OPTIMIZER:
        return OptimizerFamily(value)
    if name == keys.OPTIMIZER_KWARGS:
        if not isinstance(value, Mapping):
            raise TypeError(f"must be a mapping, got {value!r}")
        return dict(value)
    if not isinstance(value, str):
        raise TypeError(f"must be a string, got {value!r}")
    return value


RECIPE_KEYS = tuple(f.name for f in dataclasses.fields(TrialConfig))
"""The keys of a whole recipe in a flat config (:meth:`TrialConfig.to_dict`)."""


def same_value(carried: Any, derived: Any) -> bool:
    """Whether a carried recipe value is the derived one (floats through JSON or YAML)."""
    if isinstance(derived, float) and isinstance(carried, int | float):
        return math.isclose(float(carried), derived, rel_tol=1e-9, abs_tol=1e-15)
    if isinstance(derived, dict) and isinstance(carried, Mapping):
        return {k: list(v) if isinstance(v, tuple) else v for k, v in carried.items()} == {
            k: list(v) if isinstance(v, tuple) else v for k, v in derived.items()
        }
    return bool(carried == derived)
