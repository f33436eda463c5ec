"""A finished run read back from its files alone: its stored result, its winner chosen again
from ``trials.csv``, its report written again. Nothing here runs a trial or starts Ray."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raybatch import keys
from raybatch.errors import Issue, RaybatchError, RunDirError
from raybatch.export import BEST_YAML, BestConfig, load_best
from raybatch.keys import RAW_KNOBS
from raybatch.memory.estimator import MemoryEstimator
from raybatch.provenance import Provenance
from raybatch.report import write_report
from raybatch.results.outcome import SearchResult
from raybatch.results.rows import TRIALS_CSV, TrialRow, stored_rows, write_trials_csv
from raybatch.results.selection import choose_winner
from raybatch.run.rundir import OPTUNA_DB, STUDY_NAME, read_run
from raybatch.space.search_space import SearchSpace
from raybatch.status import TrialStatus
from raybatch.tuning.seeding import budget_check, max_batch_point, reference_point
from raybatch.tuning.sessions import sessions_recorded, slots_recorded
from raybatch.tuning.study import (
    CONFIG_ATTR,
    STATUS_ATTR,
    TIME_TO_TARGET_ATTR,
    TUNE_TRIAL_ID_ATTR,
)
from raybatch.tuning.study_file import runs_recorded
from raybatch.workload import load_workload

if TYPE_CHECKING:
    import optuna


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
    """``trials.csv``'s rows, refused where they are fewer than the runs the study recorded,
    or the file is not the one the search wrote (its digest, :data:`ROWS_DIGEST_ATTR`): a file
    cut short (a full disk) or edited would otherwise choose, and draw, another winner than
    the one the search measured.

    Raises:
        RunDirError: Rows missing, or edited (the first row that disagrees with the study is
            named), with the way to write the file again.
    """
    rows = stored_rows(path, space)
    recorded = runs_recorded(path / OPTUNA_DB)
    measured = [r for r in rows if r.phase in (keys.PHASE_SEARCH, keys.PHASE_CONFIRMATION)]
    again = ("delete trials.csv and `raybatch resume` writes it again from the run (every run"
             " kept)")  # fmt: skip
    if len(measured) < recorded:
        why = (f"holds {len(measured)} run(s) where optuna.db recorded {recorded}: cut short or"
               f" edited; the winner is not chosen from part of the record: {again}")  # fmt: skip
        raise RunDirError([Issue(TRIALS_CSV, why)], str(path))
    written = _digest_recorded(path / OPTUNA_DB)
    if written is not None and written != _digest(path / TRIALS_CSV):
        told = _told(path / OPTUNA_DB)
        differs = ((r.trial_id, _differs(r, told.get(r.trial_id))) for r in measured)
        first = next((f"trial {t}'s row says {d}" for t, d in differs if d is not None),
                     "it is not the file the search wrote")  # fmt: skip
        why = (f"{first}: edited since the search wrote it; the winner is chosen from what was"
               f" measured only: {again}")  # fmt: skip
        raise RunDirError([Issue(TRIALS_CSV, why)], str(path))
    return rows


ROWS_DIGEST_ATTR = "trials_csv_sha256"
"""Study attribute: the SHA-256 of the ``trials.csv`` the search wrote, so that a file edited
since (a time, a status, a recipe: a winner nobody measured) is refused, and a run Tune ran
again after a kill, whose row may differ from the study's first record of it, is not."""


def write_rows(path: Path, rows: list[TrialRow], study: optuna.Study) -> None:
    """``trials.csv`` written into run directory ``path``, its digest kept in ``study``."""
    write_trials_csv(path / TRIALS_CSV, rows)
    study.set_user_attr(ROWS_DIGEST_ATTR, _digest(path / TRIALS_CSV))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _digest_recorded(db: Path) -> str | None:
    """The digest the search study recorded (``None``: a run written before it was kept)."""
    query = ("SELECT a.value_json FROM study_user_attributes a JOIN studies s ON a.study_id ="
             " s.study_id WHERE s.study_name = ? AND a.key = ?")  # fmt: skip
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
            found = c.execute(query, (STUDY_NAME, ROWS_DIGEST_ATTR)).fetchone()
        return str(json.loads(found[0])) if found else None
    except (sqlite3.Error, ValueError):
        return None


_TOLD = (STATUS_ATTR, TIME_TO_TARGET_ATTR, CONFIG_ATTR, TUNE_TRIAL_ID_ATTR)
"""What a study holds of each run that ``trials.csv`` says again: how it ended, its time to
target, its recipe (the Tune config), and which Tune trial it was."""


def _told(db: Path) -> dict[str, list[dict[str, Any]]]:
    """Tune trial -> what the study file recorded of each ended run of it (a run Tune ran again
    after a kill may be recorded twice), read with SQLite alone; empty without a readable
    file (the row count is the only check then)."""
    if not db.is_file():
        return {}
    query = ("SELECT a.trial_id, a.key, a.value_json FROM trial_user_attributes a JOIN trials t"
             " ON a.trial_id = t.trial_id WHERE t.state IN ('COMPLETE', 'PRUNED') AND a.key IN"
             f" ({', '.join('?' for _ in _TOLD)})")  # fmt: skip
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
            found = c.execute(query, _TOLD).fetchall()
        by_trial: dict[int, dict[str, Any]] = {}
        for trial, key, value in found:
            by_trial.setdefault(trial, {})[key] = json.loads(value)
    except (sqlite3.Error, ValueError):
        return {}
    told: dict[str, list[dict[str, Any]]] = {}
    for attrs in by_trial.values():
        if isinstance(attrs.get(TUNE_TRIAL_ID_ATTR), str):
            told.setdefault(attrs[TUNE_TRIAL_ID_ATTR], []).append(attrs)
    return told


def _differs(row: TrialRow, told: list[dict[str, Any]] | None) -> str | None:
    """What ``row`` says that no record of its run in the study says: whether it reached, its
    time to target, its recipe (``None``: one record agrees, or the study has none to compare,
    as for a run it closed as failed)."""
    said = None
    for attrs in told or []:
        config = attrs.get(CONFIG_ATTR) or {}
        knobs = [config.get(k) for k in (*RAW_KNOBS[:2], keys.LR_MULTIPLIER)]
        mine = [row.micro_batch_size, row.accumulation_steps, row.lr_multiplier]
        checks = [
            ("reached", row.status is TrialStatus.REACHED,
             attrs.get(STATUS_ATTR) == TrialStatus.REACHED.value),
            ("time_to_target_s", row.time_to_target_s, attrs.get(TIME_TO_TARGET_ATTR)),
            ("meet_level", row.meet_level, attrs.get(keys.MEET_LEVEL)),
            *([("recipe", mine, knobs)] if None not in knobs else []),
        ]  # fmt: skip
        wrong = [(name, a, b) for name, a, b in checks if not _same(a, b)]
        if not wrong:
            return None
        said = "{} {} where optuna.db recorded {}".format(*wrong[0])
    return said


def _same(mine: Any, theirs: Any) -> bool:
    if isinstance(mine, list):
        return all(_same(a, b) for a, b in zip(mine, theirs, strict=True))
    if isinstance(mine, float) or isinstance(theirs, float):
        return mine is not None and theirs is not None and math.isclose(mine, theirs, rel_tol=1e-9)
    return bool(mine == theirs)


__all__ = ["ROWS_DIGEST_ATTR", "analyze_run", "rebuild_report", "stored_result", "write_rows"]
