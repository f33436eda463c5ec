"""A full disk, said in one line: the file, the cause, and the resume command.

A search writes as it goes: Optuna's study (every evaluation, every trial told), Ray Tune's
results and experiment state, the run's own files. When the disk fills, the write that fails
raises deep inside whichever library made it -- SQLite's "database or disk is full" under
SQLAlchemy under Optuna under Ray Tune's controller, an ``OSError`` (ENOSPC) elsewhere -- and
the search ended in a page of chained tracebacks naming none of what a user needs.
:func:`disk_full_said` finds the cause in the chain and says it as one
:class:`~raybatch.errors.DiskFullError`; what was written before is kept (the study commits
each write, Tune's state is replaced whole), so ``raybatch resume`` goes on once there is room.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from raybatch.errors import DiskFullError

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE_TEXT = (*(os.strerror(code) for code in NO_SPACE), "database or disk is full")
_STATE_COPY_LOGGERS = ("ray.train._internal.syncer", "ray.tune.execution.experiment_state")
"""Where Ray Tune says its copy of the experiment state into the run failed (a warning with a
traceback, and the search goes on): for want of space, raybatch says it once, in one line."""


class _FullDiskSaidOnce(logging.Filter):
    """Drops Tune's page about a state copy that failed for want of space: the search stops
    at the next write that fails, with :class:`DiskFullError`'s one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info:
            text += "".join(traceback.format_exception(*record.exc_info))
        return not any(marker in text for marker in _NO_SPACE_TEXT)


def full_disk_in(exc: BaseException) -> tuple[str | None, str] | None:
    """A full disk in ``exc``'s chain of causes: the file that could not be written (``None``
    where the cause names none: SQLite's) and the cause as said there; ``None``: no full disk
    in the chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sqlite3.OperationalError) and "full" in str(current):
            return None, str(current)
        if isinstance(current, OSError) and current.errno in NO_SPACE:
            file = str(current.filename) if current.filename else None
            return file, str(current.strerror or current)
        current = current.__cause__ or current.__context__
    return None


@contextmanager
def disk_full_said(run_dir: Path, study_file: Path) -> Iterator[None]:
    """Within the block, a full disk anywhere in a raised exception's chain ends the search as
    one :class:`DiskFullError` (SQLite's names no file: it is the study's, ``study_file``).

    Raises:
        DiskFullError: A write failed for want of space.
    """
    quiet = _FullDiskSaidOnce()
    loggers = [logging.getLogger(name) for name in _STATE_COPY_LOGGERS]
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    except Exception as exc:
        found = full_disk_in(exc)
        if found is None:
            raise
        file, cause = found
        raise DiskFullError(
            f"{file or study_file}: {cause}: the search stopped; what was written before is"
            f" kept: free some space, then continue with `raybatch resume {run_dir}`"
        ) from None
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


__all__ = ["NO_SPACE", "disk_full_said", "full_disk_in"]
