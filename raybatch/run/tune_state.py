"""Ray Tune's saved experiment state, made safe to restore after the driver was killed.

Tune saves its state once per session (each start or resume of the driver) as a set of files
named by the session's timestamp: ``experiment_state-<s>.json``, the search algorithm's
``search_gen_state-<s>.json``, the searcher's ``searcher-state-<s>.pkl`` and the callbacks'
``callback-states-<s>.pkl``. Tune writes them atomically in its staging folder, but copies
them into the run's storage folder with plain file copies; a SIGKILL in the middle of that
copy leaves the newest session's files cut short or missing. ``Tuner.restore`` picks the
newest file of each kind by name, so it would then load a truncated pickle and fail, and the
search could not be resumed at all.

So at every step the driver keeps a whole copy of the state Tune has just saved, taken from
Tune's own staging folder (written whole, before the copy) into ``.whole/`` (a folder renamed
into place: a copy is there whole or not at all). Before a restore, a newest session cut short
is put back from that copy, at most one step old; without one, the sessions newer than the
newest whole one are set aside (moved into ``.cut/``, never deleted). The study in
``optuna.db`` is the record of what finished; a trial the restored state does not know of is
re-run from its start, and the searcher tells Optuna once, so nothing is counted twice.
"""

from __future__ import annotations

import contextlib
import json
import pickletools
import shutil
from pathlib import Path
from typing import Any

from ray.tune import Callback

from raybatch.errors import Issue, RunDirError
from raybatch.tuning.study_file import runs_recorded

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
WHOLE_FOLDER = ".whole"


def keep_whole(staging: Path, experiment: Path) -> bool:
    """Copy the state Tune saved last in ``staging`` (its driver staging folder) into
    ``experiment/.whole/``, replacing the copy before; whether it did. Only a session all of
    whose files read to their end is kept, and only when it changed; a failure to write (a full
    disk) leaves the copy before in place and never stops the search."""
    sessions = _sessions(staging)
    if not sessions:
        return False
    files = sessions[max(sessions)]
    state = experiment / WHOLE_FOLDER / "state"
    if all(_same(p, state / p.name) for p in files.values()):
        return False  # unchanged since the last copy
    if "experiment_state-" not in files or not all(_whole(p) for p in files.values()):
        return False
    fresh, old = experiment / WHOLE_FOLDER / "next", experiment / WHOLE_FOLDER / "old"
    try:
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir(parents=True)
        for path in files.values():
            shutil.copy2(path, fresh / path.name)
        shutil.rmtree(old, ignore_errors=True)
        if state.exists():
            state.rename(old)  # a kill from here on leaves the copy before, whole, in old/
        fresh.rename(state)  # whole or not at all
        shutil.rmtree(old, ignore_errors=True)
    except OSError:
        shutil.rmtree(fresh, ignore_errors=True)
        return False
    return True


class KeepWhole(Callback):
    """At the end of each of Tune's steps, keep a whole copy of the state it saved last
    (:func:`keep_whole`; it saves whenever a restore would read something new:
    :func:`save_on_change`).

    Args:
        experiment: The experiment's folder in the run directory (``tune/search``).
    """

    def __init__(self, experiment: Path) -> None:
        self.experiment = Path(experiment)

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        storage = getattr(trials[0], "storage", None) if trials else None
        staging = getattr(storage, "experiment_driver_staging_path", None)
        if staging:
            keep_whole(Path(staging), self.experiment)


def save_on_change() -> None:
    """Have Ray Tune save a raybatch experiment's state when it changed, not at every step.

    The driver sets ``TUNE_GLOBAL_CHECKPOINT_S`` to 0, so that a driver killed right after a
    trial ended does not forget it; but Tune's loop steps at every result and every 0.1 s
    without one, and each step then wrote the whole state (trials, searcher, callbacks), synced
    it into the run directory, and had :class:`KeepWhole` copy it: a third of a core on a
    2-core machine, taken from the trials it runs beside. What a restore reads changes only
    when a trial is added, changes status, or saves a checkpoint (a running trial starts again
    from its last checkpoint; the study holds its evaluations), so a step that changed none of
    these writes nothing. A forced save (Tune's last, at the end of a run) is always written.
    Only experiments with a :class:`KeepWhole` among their callbacks are affected (a user's own
    Tuner in the same process keeps Tune's behaviour); once per process."""
    from ray.tune.execution.tune_controller import TuneController

    every_step = TuneController.checkpoint
    if getattr(every_step, "saves_on_change", False):
        return

    def checkpoint(self: Any, force: bool = False, wait: bool = False) -> None:
        mark = _restorable_mark(self)
        if force or mark is None or mark != getattr(self, "_raybatch_saved", None):
            every_step(self, force=force, wait=wait)
            self._raybatch_saved = mark

    checkpoint.saves_on_change = True  # type: ignore[attr-defined]
    TuneController.checkpoint = checkpoint  # type: ignore[method-assign]


def _restorable_mark(controller: Any) -> tuple[Any, ...] | None:
    """What a restore of a raybatch experiment reads that can change between steps: each
    trial's id, status and latest checkpoint. ``None`` (save as Tune would) for an experiment
    without :class:`KeepWhole`, or where Tune's insides are not as expected."""
    try:
        if not any(isinstance(c, KeepWhole) for c in controller._callbacks._callbacks):
            return None
        return tuple(
            (t.trial_id, t.status, getattr(t.checkpoint, "path", None))
            for t in controller.get_trials()
        )
    except AttributeError:
        return None


def _same(path: Path, copy: Path) -> bool:
    try:
        a, b = path.stat(), copy.stat()
    except OSError:
        return False
    return (a.st_size, a.st_mtime_ns) == (b.st_size, b.st_mtime_ns)


def restore_whole(experiment: Path) -> list[str]:
    """Put the newest session back from its whole copy (:func:`keep_whole`) where any of its
    files is cut short or missing: every file of it, so the restored state is one step's; the
    files replaced are moved into ``.cut/``. Returns the names put back (empty: nothing was cut,
    or the copy is not of the newest session)."""
    sessions = _sessions(experiment)
    whole = experiment / WHOLE_FOLDER
    kept = _sessions(whole / "state" if (whole / "state").is_dir() else whole / "old")
    if not kept or not sessions or max(sessions) != max(kept):
        return []
    session = max(sessions)
    files, copies = sessions[session], kept[session]
    if set(files) >= set(copies) and all(_whole(p) for p in files.values()):
        return []  # nothing cut
    if not all(_whole(p) for p in copies.values()):
        return []
    (experiment / CUT_FOLDER).mkdir(exist_ok=True)
    for path in files.values():
        path.rename(experiment / CUT_FOLDER / path.name)
    for copy in copies.values():
        shutil.copy2(copy, experiment / copy.name)
    return sorted(c.name for c in copies.values())


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
    missing = "no experiment state" if not cut else "cut short"
    why = (
        f"{missing}, and no whole state to put back: the driver was killed, or the disk filled,"
        " while Ray Tune copied its state in the search's first session, before any whole"
        " copy was kept, so this run cannot be resumed; the trials that finished are kept in"
        " optuna.db; start the search again in a new run directory"
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


def repair_state(experiment: Path, run_dir: Path) -> list[str]:
    """Make Tune's saved state restorable before a resume, and say what was done: a newest
    session cut short is put back from its whole copy (:func:`restore_whole`), else set aside
    for the newest whole one (:func:`set_aside_cut_sessions`).

    Raises:
        RunDirError: What cannot be restored (:func:`check_experiment`).
    """
    notes = []
    tuner, kept = experiment / TUNER_FILE, experiment / WHOLE_FOLDER / TUNER_FILE
    if tuner.is_file() and _whole(tuner):  # a restore writes it again: a kill may cut that
        with contextlib.suppress(OSError):
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tuner, kept.with_suffix(".next"))
            kept.with_suffix(".next").replace(kept)
    elif tuner.is_file() and kept.is_file() and _whole(kept):
        shutil.copy2(tuner, tuner.with_suffix(".cut"))
        shutil.copy2(kept, tuner)
        notes.append(f"{TUNER_FILE} cut short by a kill put back from its whole copy (the cut"
                     f" file is {TUNER_FILE[:-4]}.cut)")  # fmt: skip
    put_back = restore_whole(experiment)
    if put_back:
        notes.append(f"Tune state cut short put back from its whole copy, one step older"
                     f" (the cut files are in {CUT_FOLDER}/): {put_back}")  # fmt: skip
    check_experiment(experiment, run_dir)
    cut = set_aside_cut_sessions(experiment)
    if cut:
        notes.append(f"Tune state cut short set aside in {CUT_FOLDER}/: {cut}")
    return notes


def restored_parts(tuner: Any) -> tuple[Any, Any, Any]:
    """The search algorithm, ``RunConfig`` and scheduler a restored ``Tuner`` will run: Tune
    unpickled them from ``tuner.pkl`` as they were when the search started. Ray Tune has
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
    return tune_config.search_alg, run_config, tune_config.scheduler


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
