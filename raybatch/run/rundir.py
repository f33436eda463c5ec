"""The run directory: the files a search writes and reads back, and ``trials.csv``.

Layout of a run directory::

    run.json            workload reference, target and options (what resume needs)
    space.yaml          the space used, as validated
    optuna.db           the Optuna study (optuna-dashboard sqlite:///RUN_DIR/optuna.db)
    tune/search/        Ray Tune's experiment (storage), resumable
    tune/confirm/       the confirmation runs
    trials.csv          one row per trial and per pre-screened config, with a status
    search.log          the traceback of every trial that failed
    best_config.yaml    the winner with provenance (also .json)
    report.html         the report, beside its PNGs
"""

from __future__ import annotations

import csv
import dataclasses
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raybatch import keys
from raybatch.errors import Issue, OptionError, RunDirError
from raybatch.export import BestConfig
from raybatch.metric import Target
from raybatch.run.options import SearchOptions
from raybatch.space.search_space import SearchSpace

RUN_FILE = "run.json"


SPACE_FILE = "space.yaml"


OPTUNA_DB = "optuna.db"


TRIALS_CSV = "trials.csv"


LOG_FILE = "search.log"


STUDY_NAME = "raybatch"


@dataclass
class SearchResult:
    """What a finished search leaves: its directory, its rows and the winner (if any)."""

    run_dir: Path
    rows: list[dict[str, Any]]
    best: BestConfig | None
    baseline: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


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


def read_run(run_dir: str | Path) -> tuple[Path, str, SearchSpace, Target, SearchOptions]:
    """The workload reference, space, target and options of an existing run directory.

    Raises:
        RunDirError: The directory is not a raybatch run (names the missing file).
    """
    path = Path(run_dir)
    for name in (RUN_FILE, SPACE_FILE):
        if not (path / name).is_file():
            raise RunDirError([Issue(name, "missing: not a raybatch run directory")], str(path))
    run = json.loads((path / RUN_FILE).read_text())
    space = SearchSpace.from_yaml(path / SPACE_FILE)
    try:
        options = SearchOptions(**run["options"])
    except OptionError as exc:
        names = {name: f"options.{name}" for name in SearchOptions.field_names()}
        raise RunDirError(exc.renamed(names, "").issues, str(path / RUN_FILE)) from None
    return path, run["workload"], space, Target(**run["target"]), options


CSV_COLUMNS = (
    keys.PHASE, keys.TRIAL_ID, keys.STATUS, *keys.RAW_KNOBS, keys.EFFECTIVE_BATCH_SIZE, keys.LR,
    keys.WEIGHT_DECAY, keys.WARMUP_STEPS, keys.LR_SCALE, keys.TIME_TO_TARGET_S,
    keys.ELAPSED_TO_TARGET_S, keys.SAMPLES_TO_TARGET, keys.TRAIN_S, keys.EVAL_S, keys.ELAPSED_S,
    keys.METRIC, keys.PEAK_MEMORY_BYTES, keys.THROUGHPUT, keys.DATA_WAIT_FRACTION, keys.OBJECTIVE,
    keys.CANDIDATE, keys.SEED, keys.PREDICTED_TIME_S, keys.REASON,
)  # fmt: skip
"""``time_to_target_s`` is the objective (training only); ``elapsed_to_target_s`` is the same
moment with evaluation counted, as the objective was before, kept for comparison."""


def write_trials_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k) for k in CSV_COLUMNS})


def read_trials_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


TEXT_COLUMNS = frozenset({keys.PHASE, keys.TRIAL_ID, keys.STATUS, keys.REASON})
"""Never numbers, even when they look like one (a Tune trial id such as ``00012e45``)."""


def _typed(row: dict[str, str]) -> dict[str, Any]:
    """A ``trials.csv`` row with its numbers as numbers again (empty cells become None)."""
    out: dict[str, Any] = {}
    for key, text in row.items():
        if text == "":
            out[key] = None
            continue
        if key in TEXT_COLUMNS:
            out[key] = text
            continue
        try:
            number = float(text)
        except ValueError:
            out[key] = text
            continue
        out[key] = int(number) if number.is_integer() and "." not in text else number
    return out


def stored_rows(path: Path) -> list[dict[str, Any]]:
    """The typed rows of a finished run's ``trials.csv``.

    Raises:
        RunDirError: The search has not finished (no trials.csv).
    """
    if not (path / TRIALS_CSV).is_file():
        raise RunDirError([Issue(TRIALS_CSV, "missing: the search has not finished")], str(path))
    return [_typed(r) for r in read_trials_csv(path / TRIALS_CSV)]


def status_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many trials of the search (pre-screened included, confirmation runs not) ended in
    each status: the summary the CLI prints and the report shows."""
    return dict(Counter(r[keys.STATUS] for r in rows if r[keys.PHASE] != keys.PHASE_CONFIRMATION))


def row_of(space: SearchSpace, config: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """A ``trials.csv`` row: the recipe derived from ``config``, and the trial's figures."""
    recipe = space.derive_from(config).to_dict()
    recipe.pop(keys.OPTIMIZER_KWARGS, None)
    row = {**recipe}
    for key in (
        keys.STATUS, keys.TIME_TO_TARGET_S, keys.ELAPSED_TO_TARGET_S, keys.SAMPLES_TO_TARGET,
        keys.TRAIN_S, keys.EVAL_S, keys.ELAPSED_S, keys.METRIC, keys.PEAK_MEMORY_BYTES,
        keys.THROUGHPUT, keys.DATA_WAIT_FRACTION, keys.OBJECTIVE, keys.REASON,
    ):  # fmt: skip
        row[key] = metrics.get(key)
    return row
