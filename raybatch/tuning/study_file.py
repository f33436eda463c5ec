"""The run's study read and closed from outside the searcher, by the driver and the run's rows.

Before a resume the file is checked (:func:`check_study_file`) and its runs counted with SQLite
alone (:func:`runs_recorded`); at a session's start, the trials that ran the workload
(:func:`workload_ran`); at its end, the points queued that no trial will run are closed
(:func:`close_unrun`) and the configs the pre-screen kept are read back (:func:`prescreened`).
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from raybatch.errors import Issue, RunDirError
from raybatch.status import WORKLOAD_RAN, TrialStatus
from raybatch.tuning.study import (
    CONFIG_ATTR,
    PREDICTED_BYTES_ATTR,
    REASON_ATTR,
    STATUS_ATTR,
    TUNE_TRIAL_ID_ATTR,
    Prescreened,
    SearchStudy,
    recipe_recorded,
    trial_state,
)


def check_study_file(db: Path, run_dir: Path) -> None:
    """Refuse a damaged or missing SQLite study before a resume opens it, naming the file:
    SQLAlchemy would raise its own traceback ("database disk image is malformed") from deep
    inside the searcher, and a study deleted after trials ran would be created again empty
    beside them (the searcher then fails on every trial it restores). Without Optuna: SQLite's
    ``quick_check`` and the tables' presence. A missing file where no trial ever started (no
    trial folder in ``tune/search/``) is left to the search: it stopped before its first
    suggestion.

    Raises:
        RunDirError: The file is not a readable Optuna study, or it is gone after trials ran.
    """
    if not db.is_file():
        experiment = run_dir / "tune" / "search"
        started = [p for p in experiment.iterdir() if p.is_dir() and not p.name.startswith(".")
                   ] if experiment.is_dir() else []  # fmt: skip
        if started:
            why = (
                f"missing, though {len(started)} trial(s) started (tune/search/): the study held"
                " every trial the search told, and without it a resume would start an empty one"
                " beside them; put optuna.db back from a copy of the run, or start the search"
                " again in a new run directory"
            )
            raise RunDirError([Issue(db.name, why)], str(run_dir))
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=rw", uri=True)) as c:
            check = c.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(str(check[0] if check else "no answer"))
            c.execute("SELECT COUNT(*) FROM studies").fetchone()
            c.execute("SELECT COUNT(*) FROM trials").fetchone()
    except sqlite3.Error as exc:
        why = (
            f"damaged ({exc}): the Optuna study cannot be read, so this search cannot be"
            " resumed; the Ray Tune results in tune/search/ are kept; start the search again"
            " in a new run directory"
        )
        raise RunDirError([Issue(db.name, why)], str(run_dir)) from None


def runs_recorded(db: Path) -> int:
    """The Ray Tune runs a study file recorded as ended (each Optuna trial carries its Tune trial
    id: the search's trials and the race's runs; COMPLETE or PRUNED, not one an interruption
    left running and a resume closed as FAIL; a run Tune ran again after a kill, recorded twice,
    counts once), read with SQLite alone; 0 without a readable file."""
    if not db.is_file():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
            row = c.execute(
                "SELECT COUNT(DISTINCT a.value_json) FROM trials t JOIN trial_user_attributes a"
                " ON a.trial_id = t.trial_id WHERE a.key = ? AND t.state IN (?, ?)",
                (TUNE_TRIAL_ID_ATTR, "COMPLETE", "PRUNED"),
            ).fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0]) if row else 0


def close_unrun(record: SearchStudy) -> int:
    """Fail the points queued for TPE (the opening's, the ladder's) that the search ended
    before running: left WAITING they are ghosts in optuna-dashboard, queued for ever.
    Returns how many were closed, each with the reason."""
    import optuna

    states = (optuna.trial.TrialState.WAITING,)
    waiting = record.study.get_trials(deepcopy=False, states=states)
    storage = record.study._storage  # Optuna's tell refuses a trial that never ran
    why = "not run: the search ended before this queued point"
    for trial in waiting:
        storage.set_trial_user_attr(trial._trial_id, REASON_ATTR, why)
        storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
    return len(waiting)


def prescreened(record: SearchStudy) -> list[Prescreened]:
    """The configs the pre-screen kept from launching (they survive a resume here)."""
    return [
        Prescreened(
            t.number,
            dict(t.params),
            t.user_attrs.get(REASON_ATTR),
            t.user_attrs.get(PREDICTED_BYTES_ATTR),
            recipe_recorded(t.user_attrs.get(CONFIG_ATTR)),
        )
        for t in record.study.get_trials(deepcopy=False)
        if t.user_attrs.get(STATUS_ATTR) == TrialStatus.PRESCREENED_OUT.value
    ]


def workload_ran(record: SearchStudy) -> int:
    """Finished trials in which the workload was built and trained (not ``error``)."""
    states = (trial_state("COMPLETE"), trial_state("PRUNED"))
    ended = record.study.get_trials(deepcopy=False, states=states)
    return sum(1 for t in ended if t.user_attrs.get(STATUS_ATTR) in WORKLOAD_RAN)


__all__ = ["check_study_file", "close_unrun", "prescreened", "runs_recorded", "workload_ran"]
