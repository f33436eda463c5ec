"""raybatch: find the batch-size recipe that reaches a target accuracy fastest, on Ray Tune.

The public face is re-exported here; everything else is private. Heavy dependencies (Ray,
Optuna, PyTorch) are imported only by the functions that need them, so ``import raybatch``
and the CLI's light commands stay fast.
"""

from __future__ import annotations

from raybatch.budget import MemoryBudget, parse_size, resolve_budget
from raybatch.config import TrialConfig
from raybatch.errors import (
    BudgetUnavailableError,
    ConfigError,
    InputError,
    Issue,
    MemoryBudgetError,
    PresetNotFoundError,
    RaybatchError,
    SpaceError,
    TraceError,
    WorkloadError,
)
from raybatch.export import BestConfig, load_best
from raybatch.memory import LinearMemoryModel, MemoryEstimator, PrescreenResult
from raybatch.presets import list_presets, load_space
from raybatch.reporting import Target, TrialReporter
from raybatch.resources import trial_resources, with_resources
from raybatch.rules import OptimizerFamily, ScalingRule
from raybatch.run import SearchOptions, SearchResult, resume, search
from raybatch.space import SearchSpace
from raybatch.status import TrialStatus
from raybatch.trial import TrialSettings, trainable
from raybatch.tune_space import optuna_space, tune_param_space
from raybatch.workload import SimpleWorkload, Workload, load_workload

__version__ = "0.1.0"

__all__ = [
    "BestConfig",
    "BudgetUnavailableError",
    "ConfigError",
    "InputError",
    "Issue",
    "LinearMemoryModel",
    "MemoryBudget",
    "MemoryBudgetError",
    "MemoryEstimator",
    "OptimizerFamily",
    "PrescreenResult",
    "PresetNotFoundError",
    "RaybatchError",
    "ScalingRule",
    "SearchOptions",
    "SearchResult",
    "SearchSpace",
    "SimpleWorkload",
    "SpaceError",
    "Target",
    "TraceError",
    "TrialConfig",
    "TrialReporter",
    "TrialSettings",
    "TrialStatus",
    "Workload",
    "WorkloadError",
    "__version__",
    "list_presets",
    "load_best",
    "load_space",
    "load_workload",
    "optuna_space",
    "parse_size",
    "resolve_budget",
    "resume",
    "search",
    "trainable",
    "trial_resources",
    "tune_param_space",
    "with_resources",
]
