"""Ray Tune's saved experiment state, made safe to restore after the driver was killed.

Tune saves its state once per session (each start or resume of the driver) as a set of files
named by the session's timestamp: ``experiment_state-<s>.json``, the search algorithm's
``search_gen_state-<s>.json``, the searcher's ``searcher-state-<s>.pkl`` and the callbacks'
``callback-states-<s>.pkl``. Tune writes them atomically in its staging folder, but copies
them into the run's storage folder with plain file copies; a SIGKILL in the middle of that
copy leaves the newest session's files cut short or missing. ``Tuner.restore`` picks the
newest file of each kind by name, so it would then load a truncated pickle and fail, and the
search could not be resumed at all.

So before a restore, the sessions newer than the newest *whole* one are set aside (moved into
``.cut/``, never deleted): Tune restores from the last state it saved completely. The study in
``optuna.db`` is the record of what finished; a trial the set-aside state knew of and the
restored one does not is re-run from its start, and the searcher tells Optuna once (it looks
trials up by Tune id), so nothing is counted twice.
"""

from __future__ import annotations

import json
import pickletools
from pathlib import Path
from typing import Any

from raybatch.errors import Issue, RunDirError
from raybatch.run.study import runs_recorded

TUNER_FILE = "tuner.pkl"
"""The Tuner Ray Tune pickles when the experiment starts (searcher and callbacks included)."""

# The kinds of file a Tune session writes, as (prefix, suffix) around the session string.
_KINDS = (
    ("experiment_state-", ".json"),
    ("search_gen_state-", ".json"),
    ("searcher-state-", ".pkl"),
    ("callback-states-", ".pkl"),
    ("basic-variant-state-", ".json"),
)
CUT_FOLDER = ".cut"


def _session_of(name: str) -> tuple[str, str] | None:
    """(kind prefix, session string) of a Tune state file's name, or None if it is not one."""
    for prefix, suffix in _KINDS:
        if name.startswith(prefix) and name.endswith(suffix):
            return prefix, name[len(prefix) : -len(suffix)]
    return None


def _whole(path: Path) -> bool:
    """Whether a state file reads to its end: JSON parses, a pickle's opcodes reach STOP.

    ``pickletools.genops`` walks the opcodes without building any object, so checking runs
    no code from the file.
    """
    try:
        data = path.read_bytes()
        if path.name.startswith("experiment_state-"):
            json.loads(data)
            return True
        opcodes = [op.name for op, _, _ in pickletools.genops(data)]
        return opcodes[-1:] == ["STOP"]
    except (OSError, ValueError):
        return False


def set_aside_cut_sessions(experiment: Path) -> list[str]:
    """Move the state files of sessions newer than the newest whole one into ``.cut/``.

    A session is whole when it holds an experiment state, every kind of file the older
    sessions hold, and each of its files reads to its end. Returns the sessions set aside
    (empty when the newest is whole, or when none is: :func:`check_restorable` says so).
    """
    sessions = _sessions(experiment)
    newest_whole = _newest_whole(sessions)
    if newest_whole is None:
        return []
    cut = [s for s in sorted(sessions) if s > newest_whole]
    for session in cut:
        (experiment / CUT_FOLDER).mkdir(exist_ok=True)
        for path in sessions[session].values():
            path.rename(experiment / CUT_FOLDER / path.name)
    return cut


def check_restorable(experiment: Path, run_dir: Path) -> None:
    """Refuse, in seconds and naming the file, a Tune state with no whole session: a kill
    during Tune's copy in the search's first session leaves nothing older to restore, and
    ``Tuner.restore`` would fail on the truncated file with an error that says none of this.

    Raises:
        RunDirError: A state file is cut short and no session is whole.
    """
    sessions = _sessions(experiment)
    if not sessions or _newest_whole(sessions) is not None:
        return
    cut = sorted(p.name for files in sessions.values() for p in files.values() if not _whole(p))
    missing = "no experiment state" if not cut else "cut short by the kill"
    why = (
        f"{missing}, and no older whole state: the driver was killed while Ray Tune copied its"
        " state in the search's first session, so this run cannot be resumed; the trials that"
        " finished are kept in optuna.db; start the search again in a new run directory"
    )
    where = f"{experiment.name}/{cut[0]}" if cut else experiment.name
    raise RunDirError([Issue(f"tune/{where}", why)], str(run_dir))


def check_experiment(experiment: Path, run_dir: Path) -> None:
    """Refuse, in seconds and naming the file, a Ray Tune experiment that cannot be restored:
    none at all, its ``tuner.pkl`` damaged, or no whole session (:func:`check_restorable`).

    Raises:
        RunDirError: What is missing or damaged, what survives and what can be done.
    """
    from ray import tune

    where = f"tune/{experiment.name}"
    # Absolute: Ray reads a relative path as a URI without a scheme, and fails.
    if not tune.Tuner.can_restore(str(experiment.resolve())):
        ran = runs_recorded(run_dir / "optuna.db")
        why = (
            f"missing: Ray Tune's experiment is gone, though {ran} trial(s) ran (optuna.db"
            " holds them); Tune cannot resume without it: put tune/ back from a copy of the"
            " run, or start the search again in a new run directory"
            if ran
            else "no Ray Tune experiment to resume: the search was stopped before its first"
            " trial; start it again in a new run directory"
        )
        raise RunDirError([Issue(where, why)], str(run_dir))
    if not _whole(experiment / TUNER_FILE):
        why = (
            "damaged (it does not read to its end): Ray Tune cannot restore the search; the"
            " trials that finished are kept in optuna.db and tune/; start the search again in"
            " a new run directory"
        )
        raise RunDirError([Issue(f"{where}/{TUNER_FILE}", why)], str(run_dir))
    check_restorable(experiment, run_dir)


def restored_parts(tuner: Any) -> tuple[Any, Any]:
    """The search algorithm and ``RunConfig`` a restored ``Tuner`` will run: Tune unpickled
    them from ``tuner.pkl`` as they were when the search started, paths included. Ray Tune has
    no public way to replace them, so they are read where ``Tuner.restore`` put them; a Ray
    that keeps them elsewhere fails here, rather than resume into another run directory.
    """
    internal = getattr(tuner, "_local_tuner", None)
    tune_config = getattr(internal, "_tune_config", None)
    run_config = getattr(internal, "_run_config", None)
    if tune_config is None or run_config is None:
        raise RuntimeError(
            "this version of Ray Tune keeps a restored Tuner's search algorithm elsewhere:"
            " raybatch cannot point it at the run directory (tuner._local_tuner._tune_config)"
        )
    return tune_config.search_alg, run_config


def _sessions(experiment: Path) -> dict[str, dict[str, Path]]:
    """Each session's state files by kind."""
    sessions: dict[str, dict[str, Path]] = {}
    for path in experiment.iterdir() if experiment.is_dir() else ():
        found = _session_of(path.name)
        if found and path.is_file():
            sessions.setdefault(found[1], {})[found[0]] = path
    return sessions


def _newest_whole(sessions: dict[str, dict[str, Path]]) -> str | None:
    kinds_seen: set[str] = set()
    newest_whole = None
    for session in sorted(sessions):
        files = sessions[session]
        whole = (
            "experiment_state-" in files
            and kinds_seen <= set(files)
            and all(_whole(p) for p in files.values())
        )
        kinds_seen |= set(files)
        if whole:
            newest_whole = session
    return newest_whole
