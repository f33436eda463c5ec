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


def sessions_in(attrs: Mapping[str, Any]) -> list[float]:
    """The driver sessions' starts a study's user attributes hold (none: a study written before
    they were recorded, read as one session)."""
    value = attrs.get(SESSIONS_ATTR)
    return [float(t) for t in value] if isinstance(value, list) else []


def sessions_recorded(db: Path, study_name: str) -> list[float]:
    """The driver sessions' starts the study ``study_name`` in ``db`` recorded, read with SQLite
    alone; none without a readable file."""
    if not db.is_file():
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
            row = c.execute(
                "SELECT a.value_json FROM study_user_attributes a JOIN studies s"
                " ON s.study_id = a.study_id WHERE a.key = ? AND s.study_name = ?",
                (SESSIONS_ATTR, study_name),
            ).fetchone()
    except sqlite3.Error:
        return []
    return sessions_in({SESSIONS_ATTR: json.loads(row[0])}) if row else []


__all__ = ["SESSIONS_ATTR", "sessions_in", "sessions_recorded"]
