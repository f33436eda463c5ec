"""raybatch: find the batch-size recipe that reaches a target accuracy fastest, on Ray Tune.

The public face is the names below, each loaded lazily from the module that defines it (PEP 562,
:mod:`raybatch._lazy`): ``import raybatch`` costs almost nothing, and a trial worker imports only
the modules its trial needs (Ray, Optuna and PyTorch only in the functions that need them).

- a search: :func:`search`, :func:`resume`, :class:`SearchOptions`, :func:`analyze_run`; what
  it searches: :class:`SearchSpace`, :func:`load_space`, :class:`TrialConfig`; what it trains:
  :class:`Workload`, :class:`Metric`, :class:`Target`;
- the winner: :func:`verdict` (what the CLI says at the end), :func:`load_best`,
  :class:`BestConfig`;
- raybatch inside your own Ray Tune run (the plugin): :class:`RaybatchSearcher`,
  :class:`CappingScheduler` (its :class:`RungRule`), :func:`trainable`, :func:`with_resources`;
- the errors a caller catches: :class:`RaybatchError` (every error raybatch raises on purpose),
  :class:`InputError` (bad input), :class:`TrialsFailedError`, :class:`SearchInterrupted`.

Everything else is imported from its defining module (``raybatch.trial.reporting``,
``raybatch.status``, ``raybatch.space.tune_space``...): no name has a second address.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raybatch._lazy import lazy_exports

if TYPE_CHECKING:  # the same names, typed for mypy and IDEs
    from raybatch.errors import InputError, RaybatchError, SearchInterrupted, TrialsFailedError
    from raybatch.export import BestConfig, load_best
    from raybatch.metric import Metric, Target
    from raybatch.report import verdict
    from raybatch.run.driver import resume, search
    from raybatch.run.record import analyze_run
    from raybatch.space.config import TrialConfig
    from raybatch.space.presets import load_space
    from raybatch.space.search_space import SearchSpace
    from raybatch.trial.with_resources import with_resources
    from raybatch.trial.wrapper import trainable
    from raybatch.tuning.options import SearchOptions
    from raybatch.tuning.rungs import RungRule
    from raybatch.tuning.scheduler import CappingScheduler
    from raybatch.tuning.searcher import RaybatchSearcher
    from raybatch.version import __version__
    from raybatch.workload import Workload

EXPORTS: dict[str, tuple[str, ...]] = {
    "errors": ("InputError", "RaybatchError", "SearchInterrupted", "TrialsFailedError"),
    "export": ("BestConfig", "load_best"),
    "metric": ("Metric", "Target"),
    "report": ("verdict",),
    "run.driver": ("resume", "search"),
    "run.record": ("analyze_run",),
    "tuning.options": ("SearchOptions",),
    "tuning.rungs": ("RungRule",),
    "tuning.scheduler": ("CappingScheduler",),
    "tuning.searcher": ("RaybatchSearcher",),
    "space.config": ("TrialConfig",),
    "space.presets": ("load_space",),
    "space.search_space": ("SearchSpace",),
    "trial.with_resources": ("with_resources",),
    "trial.wrapper": ("trainable",),
    "version": ("__version__",),
    "workload": ("Workload",),
}
"""Which module defines each public name (the one table the lazy loader and ``__all__`` use)."""

__all__ = [
    "BestConfig", "CappingScheduler", "InputError", "Metric", "RaybatchError",
    "RaybatchSearcher", "RungRule", "SearchInterrupted", "SearchOptions", "SearchSpace", "Target",
    "TrialConfig", "TrialsFailedError", "Workload", "__version__", "analyze_run", "load_best",
    "load_space", "resume", "search", "trainable", "verdict", "with_resources",
]  # fmt: skip
# A literal list, so that mypy and IDEs see the exports; a test checks it names EXPORTS exactly.

_names, __getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
