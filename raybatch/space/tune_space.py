"""Adapters from a :class:`~raybatch.SearchSpace` to Optuna and Ray Tune search spaces.

This is the only module where the space meets Ray and Optuna (both imported lazily). Two
forms, one per Ray Tune search style:

- :func:`optuna_space`: a define-by-run function for
  ``ray.tune.search.optuna.OptunaSearch(space=...)``. Optuna samples only the raw knobs; the
  derived recipe is returned as constants (so every trial's config carries it) and never
  searched. Ray Tune does not show constants to Optuna, so the define-by-run function records
  them itself: the values that vary (effective batch, lr, weight decay, warmup) as each
  trial's user attributes, the space that fixes the rest once as a study user attribute, so
  the study in SQLite (and ``optuna-dashboard``) holds the whole recipe.
- :func:`tune_param_space`: a plain ``param_space`` for ``tune.Tuner`` with Ray's own
  sampling (random search); derived keys are ``tune.sample_from`` functions of the knobs.

Integer knobs are categorical: the choices are an arbitrary list (often powers of two), and
Optuna's TPE handles categorical parameters in its multivariate mode. A knob with a single
choice is a constant, not a parameter, so it does not clutter the study.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, cast

from raybatch import keys
from raybatch.keys import KnobPoint
from raybatch.space.config import TrialConfig
from raybatch.space.search_space import MultiplierRange, SearchSpace

if TYPE_CHECKING:
    import optuna

DERIVED_KEYS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(TrialConfig) if f.name not in keys.RAW_KNOBS
)
"""Keys of a trial config that are computed from the raw knobs, never sampled."""

RECORDED_PER_TRIAL: tuple[str, ...] = (
    keys.EFFECTIVE_BATCH_SIZE,
    keys.LR,
    keys.WEIGHT_DECAY,
    keys.WARMUP_STEPS,
)
"""Derived values stored as Optuna user attributes of each trial: the recipe a person reads
in ``optuna-dashboard``. The rest follows from them, the params and the study's space."""

STUDY_SPACE_ATTR = "raybatch_space"
"""Study user attribute holding the whole space (reference, rules, knobs, limits) as JSON."""


def _integer_knobs(space: SearchSpace) -> tuple[tuple[str, list[int]], ...]:
    s = space.search
    return (
        (keys.MICRO_BATCH_SIZE, s.micro_batch_size),
        (keys.ACCUMULATION_STEPS, s.accumulation_steps),
        (keys.WORLD_SIZE, s.world_size),
    )


def _multiplier_knobs(space: SearchSpace) -> tuple[tuple[str, MultiplierRange | None], ...]:
    s = space.search
    return (
        (keys.LR_MULTIPLIER, s.lr_multiplier),
        (keys.WEIGHT_DECAY_MULTIPLIER, s.weight_decay_multiplier),
    )


class OptunaDefineByRun:
    """Define-by-run function over a space's raw knobs (see :func:`optuna_space`).

    A class rather than a closure so that Ray Tune's ``OptunaSearch.save`` (plain pickle)
    can checkpoint it for resume. ``record=False`` skips the user attributes, for callers that
    store the whole config themselves (each attribute is a database write).
    """

    def __init__(self, space: SearchSpace, record: bool = True) -> None:
        self.space = space
        self.record = record
        self._space_recorded = False

    def __call__(self, trial: optuna.Trial) -> dict[str, Any]:
        knobs, sampled = self.knobs(trial)
        return self.constants(trial, knobs, sampled)

    def knobs(self, trial: optuna.Trial) -> tuple[KnobPoint, set[str]]:
        """The raw knobs of ``trial`` (those with one choice filled in), and which of them
        Optuna sampled."""
        knobs: dict[str, float] = {}
        sampled: set[str] = set()
        for name, choices in _integer_knobs(self.space):
            if len(choices) > 1:
                knobs[name] = trial.suggest_categorical(name, choices)
                sampled.add(name)
            else:
                knobs[name] = choices[0]
        for name, rng in _multiplier_knobs(self.space):
            if rng is not None and rng.low < rng.high:
                knobs[name] = trial.suggest_float(name, rng.low, rng.high, log=True)
                sampled.add(name)
            else:
                knobs[name] = 1.0 if rng is None else rng.low
        return cast(KnobPoint, knobs), sampled

    def constants(self, trial: optuna.Trial, knobs: KnobPoint, sampled: set[str]) -> dict[str, Any]:
        """The recipe's values Optuna did not sample (derived from ``knobs``), recorded on the
        trial where ``record``.

        Raises:
            ConfigError: The space's limits refuse the knobs
                (:meth:`~raybatch.SearchSpace.refusal` says so without raising).
        """
        constants = {
            k: v for k, v in self.space.derive(**knobs).to_dict().items() if k not in sampled
        }
        # Each storage write is a transaction (milliseconds on SQLite), so only the values
        # that vary between trials go on the trial; the space itself, which fixes everything
        # else, is written once on the study.
        if not self.record:
            return constants
        for key in RECORDED_PER_TRIAL:
            trial.set_user_attr(key, constants[key])
        if not self._space_recorded:
            trial.study.set_user_attr(STUDY_SPACE_ATTR, self.space.model_dump(mode="json"))
            self._space_recorded = True
        return constants


def optuna_space(space: SearchSpace) -> OptunaDefineByRun:
    """A define-by-run search space for Ray Tune's ``OptunaSearch``.

    Example:
        >>> from ray.tune.search.optuna import OptunaSearch
        >>> import raybatch
        >>> from raybatch.space.tune_space import optuna_space
        >>> space = raybatch.load_space("digits_cnn_sgd")
        >>> searcher = OptunaSearch(space=optuna_space(space),
        ...                         metric="time_to_target_s", mode="min")
    """
    return OptunaDefineByRun(space)


class _DerivedValue:
    """``tune.sample_from`` callable: one derived key, computed from the sampled knobs."""

    def __init__(self, space: SearchSpace, key: str) -> None:
        self.space = space
        self.key = key

    def __call__(self, config: dict[str, Any]) -> Any:
        return self.space.derive_from(config).to_dict()[self.key]


def tune_param_space(space: SearchSpace) -> dict[str, Any]:
    """A Ray Tune ``param_space`` (random sampling) with the derived keys attached.

    Example:
        >>> from ray import tune
        >>> import raybatch
        >>> from raybatch.space.tune_space import tune_param_space
        >>> space = raybatch.load_space("digits_cnn_sgd")
        >>> param_space = tune_param_space(space)
        >>> sorted(param_space)[:3]
        ['accumulation_steps', 'effective_batch_size', 'lr']
    """
    from ray import tune

    out: dict[str, Any] = {}
    for name, choices in _integer_knobs(space):
        out[name] = tune.choice(choices) if len(choices) > 1 else choices[0]
    for name, rng in _multiplier_knobs(space):
        if rng is not None and rng.low < rng.high:
            out[name] = tune.loguniform(rng.low, rng.high)
        else:
            out[name] = 1.0 if rng is None else rng.low
    for key in DERIVED_KEYS:
        out[key] = tune.sample_from(_DerivedValue(space, key))
    return out
