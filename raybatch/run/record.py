"""A finished run read back from its files alone: its stored result, its winner chosen again
from ``trials.csv``, its report written again. Nothing here runs a trial or starts Ray."""

from __future__ import annotations

from pathlib import Path

from raybatch import keys
from raybatch.errors import Issue, RaybatchError, RunDirError
from raybatch.export import BEST_YAML, BestConfig, load_best
from raybatch.memory.estimator import MemoryEstimator
from raybatch.provenance import Provenance
from raybatch.report import write_report
from raybatch.results.outcome import SearchResult
from raybatch.results.rows import TRIALS_CSV, TrialRow, stored_rows
from raybatch.results.selection import choose_winner
from raybatch.run.rundir import OPTUNA_DB, STUDY_NAME, read_run
from raybatch.run.seeding import budget_check, max_batch_point, reference_point
from raybatch.run.sessions import sessions_recorded, slots_recorded
from raybatch.run.study import runs_recorded
from raybatch.space.search_space import SearchSpace
from raybatch.workload import load_workload


def analyze_run(run_dir: str | Path) -> BestConfig | None:
    """The winner a finished run's stored trials give, chosen again from ``trials.csv`` alone.

    The same rule as at the end of the search (:func:`raybatch.results.selection.select_winner`:
    the lowest median over the confirmation runs among the recipes — candidates, max-batch
    baseline, reference — that reached the target every time), so
    ``best_config.yaml`` can be audited — and after a resume, checked — against the record.
    Only the provenance's ``created`` time differs from the file the search wrote.

    Raises:
        RunDirError: Not a run directory, or its search has not finished (no trials.csv).
    """

    run = read_run(run_dir)
    path, space, target, options = run.path, run.space, run.target, run.options
    measured_on: Provenance | None = None
    if (path / BEST_YAML).is_file():  # what the rows cannot say, as the search recorded it
        try:
            measured_on = load_best(path).provenance.measured_on()
        except RaybatchError:  # damaged: the rows alone choose the winner again
            measured_on = Provenance()
    sessions = sessions_recorded(path / OPTUNA_DB, STUDY_NAME)
    return choose_winner(target, _whole_rows(path, space), options.confirms, measured_on,
                         sessions, slots_recorded(path / OPTUNA_DB, STUDY_NAME))  # fmt: skip


def rebuild_report(run_dir: str | Path) -> Path:
    """Write the report of a finished run again, from its files alone.

    Raises:
        RunDirError: Not a run directory, or its search has not finished (no trials.csv).
    """

    run = read_run(run_dir)
    path, ref, space, target, options = run.path, run.workload, run.space, run.target, run.options
    stored = stored_result(path)
    estimator, budget = None, options.memory_budget
    if budget is not None:
        try:
            workload = load_workload(ref)
        except RaybatchError:
            workload = None  # the report is still written, without the memory plot
        if workload is not None:
            estimator = MemoryEstimator.for_space(workload, space)
    budget_bytes = options.memory_budget_bytes
    stored.baseline = max_batch_point(space, budget_check(estimator, budget_bytes))
    return write_report(stored, space, target, estimator, budget_bytes)


def stored_result(run_dir: str | Path) -> SearchResult:
    """A finished run's result from its files alone: ``trials.csv`` and, when the search
    found a winner, ``best_config.yaml``.

    Raises:
        RunDirError: Not a run directory, its search has not finished (no trials.csv), or a
            file is damaged (named).
    """
    run = read_run(run_dir)
    path, space = run.path, run.space
    rows = _whole_rows(path, space)
    best = load_best(path) if (path / BEST_YAML).is_file() else None
    baseline = best.provenance.baseline_point if best is not None else None
    return SearchResult(path, rows, best, baseline, reference_point(space), target=run.target)


def _whole_rows(path: Path, space: SearchSpace) -> list[TrialRow]:
    """``trials.csv``'s rows, refused where they are fewer than the runs the study recorded:
    a file cut short (a full disk, an edit) would otherwise choose, and draw, another winner
    than the one the search chose.

    Raises:
        RunDirError: Rows missing (named, with the way to write the file again).
    """
    rows = stored_rows(path, space)
    recorded = runs_recorded(path / OPTUNA_DB)
    measured = sum(1 for r in rows if r.phase in (keys.PHASE_SEARCH, keys.PHASE_CONFIRMATION))
    if measured < recorded:
        why = (
            f"holds {measured} run(s) where optuna.db recorded {recorded}: cut short or edited;"
            " the winner is not chosen from part of the record: delete trials.csv and"
            " `raybatch resume` writes it again from the run (every run kept)"
        )
        raise RunDirError([Issue(TRIALS_CSV, why)], str(path))
    return rows


__all__ = ["analyze_run", "rebuild_report", "stored_result"]
