"""The coupled batch-size search space: what is searched, and how the rest is derived.

Optuna (or Ray Tune's random search) samples only the *raw knobs* (micro batch, accumulation,
world size, LR and weight-decay multipliers); the space's rules derive the rest, and a space
with any point that breaks a rule is refused, so every sampled point is a sensible recipe
(``docs/spaces.md``). It is plain Python and pydantic and knows nothing of Ray or Optuna
(:mod:`raybatch.space.tune_space` adapts it to both).

Example:
    >>> from raybatch import SearchSpace
    >>> space = SearchSpace.from_dict({
    ...     "name": "demo", "rules": {"lr": "linear"},
    ...     "reference": {"batch_size": 256, "lr": 0.1, "weight_decay": 1e-4, "optimizer": "sgd"},
    ...     "search": {"micro_batch_size": [128, 256], "accumulation_steps": [1, 2, 4]},
    ...     "warmup": {"samples_per_scale": 200182}})
    >>> cfg = space.derive(micro_batch_size=256, accumulation_steps=4)
    >>> cfg.effective_batch_size, round(cfg.lr, 6), cfg.warmup_steps
    (1024, 0.4, 782)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from numbers import Integral, Real
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from raybatch import keys
from raybatch.errors import ConfigError, Issue, SpaceError, render_issues
from raybatch.space._yaml import load_mapping
from raybatch.space.config import RECIPE_KEYS, TrialConfig, same_value
from raybatch.space.rules import OptimizerFamily, ScalingRule

PositiveInt = Annotated[int, Field(strict=True, gt=0)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]

DEFAULT_MAX_ACCUMULATION_STEPS = 16
"""Seed 003, Pitfall 7: beyond 16 accumulation steps the slowdown rarely pays off."""

DEFAULT_WARMUP_REQUIRED_FROM_SCALE = 8.0
"""Seed 003, Pattern 2: an LR scaled 8x or more must warm up or it risks divergence."""


class _Model(BaseModel):
    """Frozen, strict-keyed base: a typo in a space file is an error, not a silent default."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Reference(_Model):
    """The recipe the rules scale from: values tuned (and published) at one batch size."""

    batch_size: PositiveInt
    lr: PositiveFloat
    weight_decay: NonNegativeFloat = 0.0
    optimizer: OptimizerFamily
    optimizer_kwargs: dict[str, Any] = Field(default_factory=dict)


class Rules(_Model):
    """Which scaling rule each hyperparameter follows."""

    lr: ScalingRule
    weight_decay: ScalingRule = ScalingRule.SQRT


class MultiplierRange(_Model):
    """A log-uniform range for a searched correction on top of a rule."""

    low: PositiveFloat
    high: PositiveFloat

    @model_validator(mode="after")
    def _ordered(self) -> MultiplierRange:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


def _unique(values: list[int]) -> list[int]:
    duplicates = sorted({v for v in values if values.count(v) > 1})
    if duplicates:
        raise ValueError(f"choices must be distinct, repeated: {duplicates}")
    return values


class Knobs(_Model):
    """The raw knobs the searcher samples (the ``search:`` section of a space file)."""

    micro_batch_size: list[PositiveInt] = Field(min_length=1)
    accumulation_steps: list[PositiveInt] = Field(default=[1], min_length=1)
    world_size: list[PositiveInt] = Field(default=[1], min_length=1)
    lr_multiplier: MultiplierRange | None = None
    weight_decay_multiplier: MultiplierRange | None = None

    _distinct = field_validator("micro_batch_size", "accumulation_steps", "world_size")(_unique)


class Warmup(_Model):
    """Linear LR warmup whose length grows with the LR scale factor.

    ``warmup_samples = samples_per_scale x lr_scale`` when ``lr_scale > from_scale``, else
    no warmup. Counting in samples keeps the warmup the same amount of data whatever the
    batch; the derived config also gives it in optimizer steps.
    """

    samples_per_scale: NonNegativeFloat = 0.0
    from_scale: NonNegativeFloat = 1.0
    required_from_scale: Annotated[float, Field(ge=1, allow_inf_nan=False)] = (
        DEFAULT_WARMUP_REQUIRED_FROM_SCALE
    )


class Limits(_Model):
    """Hard limits every derived recipe must respect."""

    max_accumulation_steps: PositiveInt = DEFAULT_MAX_ACCUMULATION_STEPS
    dataset_size: PositiveInt | None = None


class SearchSpace(_Model):
    """A batch-size search space: a reference recipe, scaling rules and the raw knobs.

    Built from a file (:meth:`from_yaml`), a dict (:meth:`from_dict`) or keywords; each route
    raises :class:`raybatch.errors.SpaceError` naming the source, the field and what is allowed.

    Attributes:
        name: Recorded in every recipe it derives (from a file: the file's stem by default).
        description: One line, shown by ``raybatch spaces``.
        sync_batchnorm: Convert BatchNorm to SyncBatchNorm in data-parallel trials.
        reference: The recipe the rules scale from, tuned at one batch size.
        rules: The scaling rule the LR and the weight decay each follow.
        search: The raw knobs the searcher samples; the rest of a recipe is derived.
        warmup: The LR warmup, longer as the LR scales up.
        limits: Hard limits on every derived recipe (accumulation, dataset size).

    Example::

        import raybatch
        from raybatch.examples.digits import workload

        space = raybatch.SearchSpace.from_yaml("my_space.yaml")  # a preset: raybatch.load_space
        print(space.derive(micro_batch_size=128, accumulation_steps=2).explain())
        fn = raybatch.trainable(workload, space, "accuracy>=0.97", max_time_s=60)
    """

    name: str = Field(min_length=1)
    description: str = ""
    sync_batchnorm: bool = False  # seed 003, Pitfall 6
    reference: Reference
    rules: Rules
    search: Knobs
    warmup: Warmup = Field(default_factory=Warmup)
    limits: Limits = Field(default_factory=Limits)

    _source: str = PrivateAttr(default="<python>")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise SpaceError(_issues_from_pydantic(exc, type(self))) from None
        if issues := _cross_field_issues(self):
            raise SpaceError(issues)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<python>") -> SearchSpace:
        """Validate a plain mapping (as read from YAML or JSON) into a space."""
        _check_keys(data, source)
        try:
            space = cls(**dict(data))
        except SpaceError as exc:
            raise exc.located(source) from None
        space._source = source
        return space

    @classmethod
    def from_yaml(cls, path: str | Path) -> SearchSpace:
        """Load a space file; the name defaults to the file stem.

        Raises:
            SpaceError: With the file path, the line, the field and what is allowed.
        """
        path = Path(path)
        data, locate = load_mapping(path)
        _check_keys(data, str(path))
        data.setdefault("name", path.stem)
        try:
            space = cls(**data)
        except SpaceError as exc:
            raise exc.located(str(path), locate) from None
        space._source = str(path)
        return space

    @property
    def source(self) -> str:
        """Where the space was read from (a path, or ``<python>``)."""
        return self._source

    # ---------------------------------------------------------------- derivation

    def derive(
        self,
        micro_batch_size: int,
        accumulation_steps: int = 1,
        world_size: int = 1,
        lr_multiplier: float = 1.0,
        weight_decay_multiplier: float = 1.0,
    ) -> TrialConfig:
        """Derive the full recipe for one setting of the raw knobs.

        The knobs need not be among the space's search choices (so a hand-picked batch can
        be inspected), but they must respect its limits.

        Raises:
            ConfigError: A knob is not a positive integer/number, accumulation exceeds
                ``limits.max_accumulation_steps``, the effective batch exceeds
                ``limits.dataset_size``, or the LR would scale past the warmup threshold
                with warmup disabled.
        """
        issues: list[Issue] = []
        m = _positive_int(keys.MICRO_BATCH_SIZE, micro_batch_size, issues)
        a = _positive_int(keys.ACCUMULATION_STEPS, accumulation_steps, issues)
        w = _positive_int(keys.WORLD_SIZE, world_size, issues)
        lr_mult = _positive_float(keys.LR_MULTIPLIER, lr_multiplier, issues)
        wd_mult = _positive_float(keys.WEIGHT_DECAY_MULTIPLIER, weight_decay_multiplier, issues)
        if issues:
            raise ConfigError(issues, self._source)

        if issues := _limit_issues(self, m, a, w, lr_mult):
            raise ConfigError(issues, self._source)
        ref = self.reference
        effective = m * a * w
        ratio = effective / ref.batch_size
        lr_scale = self.rules.lr.factor(ratio) * lr_mult
        warmup_samples = self.warmup_samples(lr_scale)
        return TrialConfig(
            micro_batch_size=m,
            accumulation_steps=a,
            world_size=w,
            effective_batch_size=effective,
            lr=ref.lr * lr_scale,
            weight_decay=ref.weight_decay * self.rules.weight_decay.factor(ratio) * wd_mult,
            lr_scale=lr_scale,
            lr_multiplier=lr_mult,
            weight_decay_multiplier=wd_mult,
            warmup_samples=warmup_samples,
            warmup_steps=math.ceil(warmup_samples / effective),
            **self.recipe_constants(),
        )

    def refusal(
        self,
        micro_batch_size: int,
        accumulation_steps: int = 1,
        world_size: int = 1,
        lr_multiplier: float = 1.0,
    ) -> str | None:
        """Why the space's limits refuse these knobs (as :meth:`derive` would say it), or
        ``None``: a searcher asks before deriving, and tells a refused combination to its
        sampler rather than catching the error."""
        issues = _limit_issues(self, micro_batch_size, accumulation_steps, world_size,
                               lr_multiplier)  # fmt: skip
        return render_issues(issues, self._source) if issues else None

    def recipe_of(self, config: Mapping[str, Any]) -> TrialConfig:
        """The recipe of a Ray Tune config: that of its knobs, which must agree with any
        recipe the config carries (the searcher's and ``optuna_space``'s carry the whole
        recipe); a carried ``lr`` typed beside the knobs, or a recipe from an edited space, is
        refused by name rather than trained under knobs that say something else.

        Raises:
            ConfigError: The knobs are invalid, or a carried value disagrees with them.
        """
        derived = self.derive_from(config)
        values = derived.to_dict()
        issues = [
            Issue(k, f"is {config[k]!r}, but the space's rules give {values[k]!r} for these"
                     " knobs (change the knobs or the multipliers, not the value)")
            for k in RECIPE_KEYS
            if k in config and k not in keys.RAW_KNOBS and not same_value(config[k], values[k])
        ]  # fmt: skip
        if issues:
            raise ConfigError(issues, self._source)
        return derived

    def derive_from(self, config: Mapping[str, Any]) -> TrialConfig:
        """Derive from the raw knobs found in a (Ray Tune) config dict.

        Knobs the dict lacks take their default (accumulation 1, world size 1, multipliers
        1.0); other keys are ignored, so a trial can pass its whole config.
        """
        if keys.MICRO_BATCH_SIZE not in config:
            raise ConfigError([Issue(keys.MICRO_BATCH_SIZE, "missing")], self._source)
        return self.derive(
            micro_batch_size=config[keys.MICRO_BATCH_SIZE],
            accumulation_steps=config.get(keys.ACCUMULATION_STEPS, 1),
            world_size=config.get(keys.WORLD_SIZE, 1),
            lr_multiplier=config.get(keys.LR_MULTIPLIER, 1.0),
            weight_decay_multiplier=config.get(keys.WEIGHT_DECAY_MULTIPLIER, 1.0),
        )

    def grid(self) -> Iterator[TrialConfig]:
        """Every combination of the integer knobs, with both multipliers at 1.0.

        Ordered by effective batch, then micro batch: the order a person reads a table in.
        """
        s = self.search
        combos = sorted(
            itertools.product(s.micro_batch_size, s.accumulation_steps, s.world_size),
            key=lambda c: (c[0] * c[1] * c[2], c[0], c[2]),
        )
        for m, a, w in combos:
            yield self.derive(m, a, w)

    def reference_config(self) -> TrialConfig:
        """The reference recipe itself, as a trial config (micro batch = reference batch)."""
        return self.derive(self.reference.batch_size, 1, 1)

    def recipe_constants(self) -> dict[str, Any]:
        """What every recipe of this space shares, whatever its knobs: the space's name, its
        rules, optimizer and reference (the :class:`TrialConfig` fields no knob changes)."""
        ref = self.reference
        return {"space": self.name, "lr_rule": self.rules.lr,
                "weight_decay_rule": self.rules.weight_decay, "optimizer": ref.optimizer,
                "reference_batch_size": ref.batch_size, "reference_lr": ref.lr,
                "reference_weight_decay": ref.weight_decay,
                "optimizer_kwargs": dict(ref.optimizer_kwargs)}  # fmt: skip

    def warmup_samples(self, lr_scale: float) -> int:
        """Warmup length in samples at an LR scale (none at or below the rule's ``from_scale``)."""
        w = self.warmup
        if w.samples_per_scale == 0 or lr_scale <= w.from_scale:
            return 0
        return math.ceil(w.samples_per_scale * lr_scale)

    def max_effective_batch_size(self) -> int:
        """The largest effective batch any point of the space reaches."""
        s = self.search
        return max(s.micro_batch_size) * max(s.accumulation_steps) * max(s.world_size)

    def max_lr_scale(self) -> float:
        """The largest LR scale factor any point of the space reaches (rules are monotone)."""
        ratio = self.max_effective_batch_size() / self.reference.batch_size
        high = self.search.lr_multiplier.high if self.search.lr_multiplier else 1.0
        return self.rules.lr.factor(ratio) * high


def _limit_issues(space: SearchSpace, m: int, a: int, w: int, lr_mult: float) -> list[Issue]:
    """What the space's limits and warmup rule refuse in valid-looking knobs."""
    issues: list[Issue] = []
    limit = space.limits.max_accumulation_steps
    if a > limit:
        why = f"{a} exceeds limits.max_accumulation_steps = {limit}; allowed: 1..{limit}"
        issues.append(Issue(keys.ACCUMULATION_STEPS, why))
    effective = m * a * w
    dataset = space.limits.dataset_size
    if dataset is not None and effective > dataset:
        why = (
            f"{effective} (micro {m} x accumulation {a} x world {w}) exceeds"
            f" limits.dataset_size = {dataset} training samples"
        )
        issues.append(Issue(keys.EFFECTIVE_BATCH_SIZE, why))
    ref = space.reference
    ratio = effective / ref.batch_size
    lr_scale = space.rules.lr.factor(ratio) * lr_mult
    warmup_samples = space.warmup_samples(lr_scale)
    if lr_scale >= space.warmup.required_from_scale and warmup_samples == 0:
        why = (
            f"LR scale {lr_scale:.4g}x reaches warmup.required_from_scale ="
            f" {space.warmup.required_from_scale:g}x, where warmup is mandatory,"
            " but this space's warmup gives none (warmup.samples_per_scale ="
            f" {space.warmup.samples_per_scale:g})"
        )
        issues.append(Issue(keys.LR_MULTIPLIER, why))
    return issues


def _cross_field_issues(space: SearchSpace) -> list[Issue]:
    """Checks that need several sections at once: every point must be a valid recipe."""
    issues: list[Issue] = []
    s, limit = space.search, space.limits.max_accumulation_steps
    for i, a in enumerate(s.accumulation_steps):
        if a > limit:
            why = (
                f"{a} exceeds limits.max_accumulation_steps = {limit} (past it the"
                f" slowdown of accumulation rarely pays); allowed: 1..{limit}"
            )
            issues.append(Issue(f"search.accumulation_steps[{i}]", why))
    dataset = space.limits.dataset_size
    largest = space.max_effective_batch_size()
    if dataset is not None and largest > dataset:
        why = (
            f"the largest effective batch of this space is {largest} (micro"
            f" {max(s.micro_batch_size)} x accumulation {max(s.accumulation_steps)}"
            f" x world {max(s.world_size)}), more than the {dataset} training"
            " samples; drop the largest choices"
        )
        issues.append(Issue("limits.dataset_size", why))
    w = space.warmup
    if w.samples_per_scale > 0 and w.from_scale >= w.required_from_scale:
        why = (
            f"{w.from_scale:g} leaves LR scales from {w.required_from_scale:g}x"
            f" (warmup.required_from_scale) to {w.from_scale:g}x without warmup;"
            f" allowed: below {w.required_from_scale:g}"
        )
        issues.append(Issue("warmup.from_scale", why))
    top = space.max_lr_scale()
    if w.samples_per_scale == 0 and top >= w.required_from_scale:
        why = (
            f"0 disables warmup, but this space scales the LR up to {top:.4g}x and"
            f" warmup is mandatory from {w.required_from_scale:g}x (a large LR jump"
            " without warmup risks divergence, Goyal et al. 2017);"
            " allowed: a positive number of samples"
        )
        issues.append(Issue("warmup.samples_per_scale", why))
    return issues


def _check_keys(data: Mapping[Any, Any], source: str) -> None:
    """Top-level field names must be strings (YAML allows ``? : x`` or ``1: x``)."""
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise SpaceError(
            [Issue("(document)", f"field names must be strings, got {bad[0]!r}", 1)], source
        )


def _positive_int(name: str, value: Any, issues: list[Issue]) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value <= 0:
        issues.append(Issue(name, f"must be a positive integer, got {value!r}"))
        return 1
    return int(value)


def _positive_float(name: str, value: Any, issues: list[Issue]) -> float:
    ok = isinstance(value, Real) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        issues.append(Issue(name, f"must be a positive finite number, got {value!r}"))
        return 1.0
    return float(value)


def _issues_from_pydantic(exc: ValidationError, root: type[BaseModel]) -> list[Issue]:
    """Turn pydantic's errors into issues that say the field and what is allowed."""
    issues = []
    for err in exc.errors(include_url=False):
        loc = err["loc"]
        field = _dotted(loc)
        kind = err["type"]
        if kind == "extra_forbidden":
            allowed = _allowed_fields(root, loc[:-1])
            message = "unknown field" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
        elif kind == "missing":
            message = "required field is missing"
        else:
            message = err["msg"].replace("Input should be", "must be").replace("Value error, ", "")
            if "input" in err and not isinstance(err["input"], dict | list):
                message += f" (got {err['input']!r})"
        issues.append(Issue(field or "(document)", message))
    return issues


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _allowed_fields(root: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the model found at ``loc`` under ``root`` (for 'unknown field')."""
    model: type[BaseModel] = root
    for part in loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        if info is None:
            return []
        candidates = [info.annotation, *getattr(info.annotation, "__args__", ())]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return []
        model = nested[0]
    return list(model.model_fields)
