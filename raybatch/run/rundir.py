"""The run directory: the files a search writes and reads back, and ``trials.csv``.

Layout of a run directory::

    run.json            workload reference, target and options (what resume needs)
    space.yaml          the space used, as validated
    driver.lock         held by the driver running here (raybatch.run.lock)
    optuna.db           the Optuna study (optuna-dashboard sqlite:///RUN_DIR/optuna.db)
    tune/search/        Ray Tune's experiment (storage), resumable
    tune/confirm/       the confirmation runs
    trials.csv          one row per trial and per pre-screened config (raybatch.results.rows),
                        written when the search ends: a run with it has finished
    search.log          the traceback of every trial that failed
    best_config.yaml    the winner with provenance (also .json), when a recipe won
    report.html         the report, beside its PNGs

Every path raybatch keeps is relative to the run directory, or re-pointed at it on resume
(the searcher Ray Tune restores), so a copied or moved directory resumes into itself.
``run.json``, ``best_config.yaml``/``.json`` and the searcher's checkpoint carry one format
stamp (:data:`raybatch.version.RUN_FORMAT`); a file of another format is refused, named.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from raybatch.errors import Issue, OptionError, RunDirError
from raybatch.export import TUNE_EXPERIMENT_WHY, is_tune_experiment
from raybatch.metric import Target
from raybatch.space.search_space import SearchSpace
from raybatch.tuning.options import SearchOptions
from raybatch.version import FORMAT_KEY, RUN_FORMAT, SAME_SINCE, check_format

RUN_FILE = "run.json"


SPACE_FILE = "space.yaml"


OPTUNA_DB = "optuna.db"


LOG_FILE = "search.log"


STUDY_NAME = "raybatch"


def write_run_files(
    run_dir: Path,
    workload_ref: str,
    space: SearchSpace,
    target: Target,
    options: SearchOptions,
) -> None:
    """Create the run directory and its first files, or fail before any trial starts."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / SPACE_FILE).write_text(
            yaml.safe_dump(space.model_dump(mode="json"), sort_keys=False)
        )
        (run_dir / RUN_FILE).write_text(
            json.dumps(
                {
                    FORMAT_KEY: RUN_FORMAT,
                    "workload": workload_ref,
                    "target": dataclasses.asdict(target),
                    "options": dataclasses.asdict(options),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                },
                indent=2,
            )
            + "\n"
        )
    except OSError as exc:  # read-only, disk full, a file where a directory should be...
        raise RunDirError(
            [Issue("(directory)", f"cannot write the run: {exc.strerror or exc}")], str(run_dir)
        ) from None


def forget_run_files(run_dir: Path) -> None:
    """Remove what :func:`write_run_files` wrote, for a search refused before its first trial
    (a mixed cluster, no GPU budget): the run directory then holds no run, and the same command
    can be run again once the cause is fixed."""
    for name in (RUN_FILE, SPACE_FILE):
        (run_dir / name).unlink(missing_ok=True)


@dataclass(frozen=True)
class RunRecord:
    """What a run directory says of its search: what :func:`write_run_files` wrote."""

    path: Path
    workload: str
    """How to import the workload again (``path.py:NAME``, or ``<object NAME>``)."""
    space: SearchSpace
    target: Target
    options: SearchOptions
    format: int = RUN_FORMAT
    """The format of the raybatch that wrote it: a finished run of an older one is read, an
    unfinished one is not resumed (Tune's pickles name that raybatch's classes)."""


def read_run(run_dir: str | Path) -> RunRecord:
    """The workload reference, space, target and options of an existing run directory.

    Raises:
        RunDirError: The directory is not a raybatch run (names the missing file).
    """
    path = Path(run_dir)
    if not (path / RUN_FILE).is_file() and is_tune_experiment(path):
        raise RunDirError([Issue(RUN_FILE, f"missing: {TUNE_EXPERIMENT_WHY}")], str(path))
    for name in (RUN_FILE, SPACE_FILE):
        if not (path / name).is_file():
            raise RunDirError([Issue(name, "missing: not a raybatch run directory")], str(path))
    space = SearchSpace.from_yaml(path / SPACE_FILE)
    try:
        run = json.loads((path / RUN_FILE).read_text())
        if not isinstance(run, dict):
            raise TypeError(f"holds a {type(run).__name__}, not an object")
    except (ValueError, TypeError) as exc:  # JSON, or not an object
        raise RunDirError([Issue(RUN_FILE, _damaged_run(exc))], str(path)) from None
    check_format(run.get(FORMAT_KEY), str(path / RUN_FILE), SAME_SINCE)  # another's: said so
    try:
        stored = dict(run["options"])
        # Format 3 and older capped at levels of the metric; its slack has no meaning now.
        stored.pop("level_slack", None)
        options = SearchOptions(**stored)
        target = Target(**run["target"])
        return RunRecord(path, str(run["workload"]), space, target, options, run[FORMAT_KEY])
    except OptionError as exc:
        names = {name: f"options.{name}" for name in SearchOptions.field_names()}
        raise RunDirError(exc.renamed(names, "").issues, str(path / RUN_FILE)) from None
    except (ValueError, TypeError, KeyError) as exc:  # a missing or mistyped entry
        raise RunDirError([Issue(RUN_FILE, _damaged_run(exc))], str(path)) from None


def _damaged_run(exc: Exception) -> str:
    return (
        f"damaged ({type(exc).__name__}: {exc}): it holds the workload, target and options"
        " the search started with, and resume needs it; the trials are kept in optuna.db"
        " and tune/ (and trials.csv, best_config.yaml if the search finished); restore the"
        " file from a copy"
    )
