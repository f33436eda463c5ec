"""When each driver session of a run started: the search, then each resume.

What a search cost the user is the slots x the wall clock it ran
(:func:`raybatch.results.cost.wall_clock`); a run interrupted and resumed a day later did not
cost that day. Each session's start is recorded in the run's Optuna study (a study attribute,
beside the trials it ran: one durable record), and the wall clock is counted within sessions.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SESSIONS_ATTR = "sessions"
"""Study attribute: when each driver session started, epoch seconds, in order."""
SLOTS_ATTR = "slots"
"""Study attribute: the most trials a driver session ran at once (the slots the user paid for;
a trial paused and resumed reports one span for all its processes, so the most spans that
overlap can overstate them)."""


def sessions_in(attrs: Mapping[str, Any]) -> list[float]:
    """The driver sessions' starts a study's user attributes hold (none: a study written before
    they were recorded, read as one session)."""
    value = attrs.get(SESSIONS_ATTR)
    return [float(t) for t in value] if isinstance(value, list) else []


def slots_in(attrs: Mapping[str, Any]) -> int | None:
    """The slots a study's user attributes hold (``None``: a study written before they were
    recorded; the cost then counts the most runs that overlapped)."""
    value = attrs.get(SLOTS_ATTR)
    return int(value) if isinstance(value, int | float) and value >= 1 else None


def _attr(db: Path, study_name: str, key: str) -> Any:
    """A study attribute's value, read with SQLite alone; ``None`` without a readable file."""
    if not db.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
            row = c.execute(
                "SELECT a.value_json FROM study_user_attributes a JOIN studies s"
                " ON s.study_id = a.study_id WHERE a.key = ? AND s.study_name = ?",
                (key, study_name),
            ).fetchone()
    except sqlite3.Error:
        return None
    return json.loads(row[0]) if row else None


def sessions_recorded(db: Path, study_name: str) -> list[float]:
    """The driver sessions' starts the study ``study_name`` in ``db`` recorded; none without a
    readable file."""
    return sessions_in({SESSIONS_ATTR: _attr(db, study_name, SESSIONS_ATTR)})


def slots_recorded(db: Path, study_name: str) -> int | None:
    """The slots the study ``study_name`` in ``db`` recorded (:func:`slots_in`)."""
    return slots_in({SLOTS_ATTR: _attr(db, study_name, SLOTS_ATTR)})


__all__ = [
    "SESSIONS_ATTR",
    "SLOTS_ATTR",
    "sessions_in",
    "sessions_recorded",
    "slots_in",
    "slots_recorded",
]
