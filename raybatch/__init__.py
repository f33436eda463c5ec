"""raybatch: find the batch-size recipe that reaches a target accuracy fastest, on Ray Tune.

The public face is re-exported here; everything else is private. Heavy dependencies (Ray,
Optuna, PyTorch) are imported only by the functions that need them, so ``import raybatch``
and the CLI's light commands stay fast.
"""

from __future__ import annotations

from raybatch.config import TrialConfig
from raybatch.errors import (
    ConfigError,
    InputError,
    Issue,
    PresetNotFoundError,
    RaybatchError,
    SpaceError,
)
from raybatch.presets import list_presets, load_space
from raybatch.rules import OptimizerFamily, ScalingRule
from raybatch.space import SearchSpace
from raybatch.tune_space import optuna_space, tune_param_space

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "InputError",
    "Issue",
    "OptimizerFamily",
    "PresetNotFoundError",
    "RaybatchError",
    "ScalingRule",
    "SearchSpace",
    "SpaceError",
    "TrialConfig",
    "__version__",
    "list_presets",
    "load_space",
    "optuna_space",
    "tune_param_space",
]
