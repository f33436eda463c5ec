"""raybatch: find the batch-size recipe that reaches a target accuracy fastest, on Ray Tune.

The public face is re-exported here; everything else is private. Names are loaded lazily
(PEP 562): ``import raybatch`` costs almost nothing, and a trial worker that only needs
``raybatch.TrialReporter`` imports that module alone. Every trial of a search runs in a fresh
Ray worker process, so an eager package import was paid once per trial (measured by
``bench/plugin_overhead.py``). Heavy dependencies (Ray, Optuna, PyTorch) are imported only by
the functions that need them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raybatch.errors import (
        BudgetUnavailableError,
        ClusterUnreachableError,
        ConfigError,
        ExportError,
        InputError,
        Issue,
        MemoryBudgetError,
        OptionError,
        OutputFileError,
        PresetNotFoundError,
        RaybatchError,
        SpaceError,
        TargetError,
        TraceError,
        TrialDeviceError,
        TrialsFailedError,
        WorkloadError,
    )
    from raybatch.export import BestConfig, load_best
    from raybatch.memory import LinearMemoryModel, MemoryEstimator, PrescreenResult
    from raybatch.memory.budget import MemoryBudget, parse_size, resolve_budget
    from raybatch.metric import Metric, Target
    from raybatch.run.driver import analyze_run, resume, search
    from raybatch.run.failfast import FailFast
    from raybatch.run.options import SearchOptions
    from raybatch.run.rundir import SearchResult
    from raybatch.run.scheduler import CappingScheduler
    from raybatch.run.searcher import RaybatchSearcher
    from raybatch.space.config import TrialConfig
    from raybatch.space.presets import list_presets, load_space
    from raybatch.space.rules import OptimizerFamily, ScalingRule
    from raybatch.space.search_space import SearchSpace
    from raybatch.space.tune_space import optuna_space, tune_param_space
    from raybatch.trial.reporting import TrialReporter
    from raybatch.trial.resources import trial_resources, with_resources
    from raybatch.trial.status import TrialStatus
    from raybatch.trial.wrapper import TrialSettings, trainable
    from raybatch.workload import SimpleWorkload, Workload, load_workload

_EXPORTS: dict[str, tuple[str, ...]] = {
    "raybatch.memory.budget": (
        "MemoryBudget",
        "parse_size",
        "resolve_budget",
    ),
    "raybatch.space.config": ("TrialConfig",),
    "raybatch.errors": (
        "BudgetUnavailableError",
        "ClusterUnreachableError",
        "ConfigError",
        "ExportError",
        "InputError",
        "Issue",
        "MemoryBudgetError",
        "OptionError",
        "OutputFileError",
        "PresetNotFoundError",
        "RaybatchError",
        "SpaceError",
        "TargetError",
        "TraceError",
        "TrialDeviceError",
        "TrialsFailedError",
        "WorkloadError",
    ),
    "raybatch.export": (
        "BestConfig",
        "load_best",
    ),
    "raybatch.memory": (
        "LinearMemoryModel",
        "MemoryEstimator",
        "PrescreenResult",
    ),
    "raybatch.metric": (
        "Metric",
        "Target",
    ),
    "raybatch.space.presets": (
        "list_presets",
        "load_space",
    ),
    "raybatch.trial.reporting": ("TrialReporter",),
    "raybatch.trial.resources": (
        "trial_resources",
        "with_resources",
    ),
    "raybatch.space.rules": (
        "OptimizerFamily",
        "ScalingRule",
    ),
    "raybatch.run.options": ("SearchOptions",),
    "raybatch.run.rundir": ("SearchResult",),
    "raybatch.run.failfast": ("FailFast",),
    "raybatch.run.driver": (
        "analyze_run",
        "resume",
        "search",
    ),
    "raybatch.run.scheduler": ("CappingScheduler",),
    "raybatch.run.searcher": ("RaybatchSearcher",),
    "raybatch.space.search_space": ("SearchSpace",),
    "raybatch.trial.status": ("TrialStatus",),
    "raybatch.trial.wrapper": (
        "TrialSettings",
        "trainable",
    ),
    "raybatch.space.tune_space": (
        "optuna_space",
        "tune_param_space",
    ),
    "raybatch.workload": (
        "SimpleWorkload",
        "Workload",
        "load_workload",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__version__ = "0.1.0"

__all__ = [
    "BestConfig",
    "BudgetUnavailableError",
    "CappingScheduler",
    "ClusterUnreachableError",
    "ConfigError",
    "ExportError",
    "FailFast",
    "InputError",
    "Issue",
    "LinearMemoryModel",
    "MemoryBudget",
    "MemoryBudgetError",
    "MemoryEstimator",
    "Metric",
    "OptimizerFamily",
    "OptionError",
    "OutputFileError",
    "PrescreenResult",
    "PresetNotFoundError",
    "RaybatchError",
    "RaybatchSearcher",
    "ScalingRule",
    "SearchOptions",
    "SearchResult",
    "SearchSpace",
    "SimpleWorkload",
    "SpaceError",
    "Target",
    "TargetError",
    "TraceError",
    "TrialConfig",
    "TrialDeviceError",
    "TrialReporter",
    "TrialSettings",
    "TrialStatus",
    "TrialsFailedError",
    "Workload",
    "WorkloadError",
    "__version__",
    "analyze_run",
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


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'raybatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
