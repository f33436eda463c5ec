"""raybatch's version, and the format of what a search writes, each in one place.

The version is the installed distribution's metadata (``pyproject.toml``). A source tree that
is not installed (``PYTHONPATH`` pointing at a checkout) has no metadata: it reports
``0+unknown`` rather than a number that might be stale.

The format (:data:`RUN_FORMAT`) is what a later raybatch reads back: ``run.json``,
``best_config.yaml``/``.json`` and the searcher's Tune checkpoint each carry it, and
:func:`check_format` is the one place that reads it, refusing what it cannot read with the
file named, instead of misreading it.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from raybatch.errors import Issue, RunDirError

RUN_FORMAT = 7
"""The format of the files a search writes and reads back. Bump it when any of them changes in
a way this reader would misread; older formats of that file are then refused (or migrated
here). 2: the searcher Tune pickles whole, and its checkpoint, are composed of other parts
(its screen, its launches); 3: its launches hold the screen and devices, its plan an opening,
the scheduler Tune also pickles a hang guard, and what ran out of memory is kept as typed
records; 4: the scheduler Tune pickles judges trials at rungs (its state changed shape), and
``run.json``'s options name the rungs' ``zone`` (a format-1 to 3 file's ``level_slack`` is
ignored); 5: the search's Tuner runs the confirmation's race too, its searcher (what Tune
pickles) the search's wrapped with the race's state (:class:`~raybatch.tuning.phases.
SearchThenRace`); 6: what Tune pickles lives in :mod:`raybatch.tuning` (it was
``raybatch.run``), so an unfinished run of format 5 or older is refused by its ``run.json``
before Tune unpickles it; 7: the scheduler Tune pickles holds its rungs' rule and verdicts in a
judge (:class:`~raybatch.tuning.judge.RungJudge`), and no part reads a pickle older than its
format. ``run.json`` and ``best_config.yaml`` read as in 1 (:data:`SAME_SINCE`)."""
SAME_SINCE = 1
"""The oldest format ``run.json`` and ``best_config.yaml`` are read from: a finished run of
format 1 is analysed and exported as it is; only resuming one is refused (its searcher)."""
FORMAT_KEY = "format"
"""Where each file keeps it."""


def check_format(found: object, source: str, oldest: int = RUN_FORMAT) -> None:
    """Refuse a file (``source``) whose format this raybatch cannot read: older than
    ``oldest`` (the first format this kind of file has had since it last changed: a bump for
    one file leaves the others readable), or newer than :data:`RUN_FORMAT`.

    Raises:
        RunDirError: Written by a raybatch of another format, or by none (no format).
    """
    if isinstance(found, int) and not isinstance(found, bool) and oldest <= found <= RUN_FORMAT:
        return
    what = "missing" if found is None else f"{found!r}"
    reads = f"format {RUN_FORMAT}" if oldest == RUN_FORMAT else f"formats {oldest}-{RUN_FORMAT}"
    why = (
        f"{what}: written by another raybatch version (this one reads {reads});"
        " use the raybatch that wrote it, or start a new search"
    )
    raise RunDirError([Issue(FORMAT_KEY, why)], source)


try:
    __version__ = version("raybatch")
except PackageNotFoundError:
    __version__ = "0+unknown"

__all__ = ["FORMAT_KEY", "RUN_FORMAT", "SAME_SINCE", "__version__", "check_format"]
