"""One typed row per trial and per pre-screened config: :class:`TrialRow`, and ``trials.csv``.

The driver writes a row for every search trial, every config the pre-screen kept out and every
confirmation run; selection, :func:`raybatch.analyze_run`, the report and ``bench/`` read the
same rows back. The row is frozen and typed (the status a :class:`TrialStatus` member, counts
as ``int``, times as ``float``); strings exist only at the CSV edge. The CSV's columns are
declared once, here: the row's identity, its recipe's columns (flattened from the recipe it
holds) and its figures.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from raybatch import keys
from raybatch.errors import Issue, RunDirError
from raybatch.keys import KnobPoint
from raybatch.space.config import TrialConfig
from raybatch.status import TrialStatus

if TYPE_CHECKING:
    from raybatch.space.search_space import SearchSpace

TRIALS_CSV = "trials.csv"


@dataclass(frozen=True)
class TrialRow:
    """A trial's recipe and what it measured. The recipe is held once, in :attr:`config`; its
    columns in ``trials.csv`` (the knobs and the derived values, :data:`RECIPE_COLUMNS`) are
    read from it, and the other fields are the file's other columns, by the same names
    (:mod:`raybatch.keys`'s).

    ``time_to_target_s`` is the objective (training only); ``elapsed_to_target_s`` is the same
    moment with evaluation counted, as the objective was before, kept for comparison.
    ``candidate`` and ``seed`` are set on confirmation runs, ``predicted_time_s`` when the
    search measured its time model; ``peak_memory_bytes`` of a pre-screened row is the
    prediction that kept it out.
    """

    phase: str
    trial_id: str
    status: TrialStatus
    config: TrialConfig
    """The recipe itself: the searcher's, carried through Tune's config and back, so that what
    follows the search reads the record it measured instead of deriving it again; a row read
    back from ``trials.csv`` gets the one its columns recorded (:func:`recorded_recipe`)."""
    time_to_target_s: float | None = None
    elapsed_to_target_s: float | None = None
    samples_to_target: int | None = None
    train_s: float | None = None
    eval_s: float | None = None
    elapsed_s: float | None = None
    held_s: float | None = None
    started_at: float | None = None
    startup_s: float | None = None
    gpu_share: float | None = None
    gpu_name: str | None = None
    gpu_id: str | None = None
    node_ip: str | None = None
    metric: float | None = None
    peak_memory_bytes: int | None = None
    throughput: float | None = None
    data_wait_fraction: float | None = None
    objective: float | None = None
    candidate: int | None = None
    seed: int | None = None
    meet_level: float | None = None
    """A confirmation run's meeting level: its ``time_to_target_s`` is its time to that level
    (on its seed, beside its rival's), not to the target."""
    predicted_time_s: float | None = None
    reason: str | None = None

    @classmethod
    def of(
        cls, recipe: TrialConfig, phase: str, trial_id: str, status: TrialStatus, **figures: Any
    ) -> TrialRow:
        """The row of ``recipe`` (derived once, by the caller) with ``figures``, any of the
        figure fields by name.

        Raises:
            TypeError: A figure that is not a column (a misspelt name is never dropped).
        """
        unknown = sorted(set(figures) - set(_FIGURES))
        if unknown:  # the recipe's columns come from the recipe, never beside it
            raise TypeError(f"not figures of a trial row: {unknown}")
        if not isinstance(status, TrialStatus):
            raise TypeError(f"status must be a TrialStatus, got {status!r}")
        named = {keys.PHASE: phase, keys.TRIAL_ID: trial_id, keys.STATUS: status}
        return cls(config=recipe, **_converted({**figures, **named}))

    @classmethod
    def from_result(
        cls,
        recipe: TrialConfig,
        phase: str,
        trial_id: str,
        status: TrialStatus,
        metrics: Mapping[str, Any],
        **extra: Any,
    ) -> TrialRow:
        """The row of a finished Tune trial: the figures a trial reports (:data:`REPORTED`),
        picked from its last result's ``metrics`` (the rest of a Tune result is not a row's),
        and ``extra`` figures the driver knows (a confirmation run's seed and candidate)."""
        return cls.of(recipe, phase, trial_id, status,
                      **{k: metrics.get(k) for k in REPORTED}, **extra)  # fmt: skip

    @classmethod
    def from_csv(cls, cells: Mapping[str, str], space: SearchSpace) -> TrialRow:
        """A ``trials.csv`` row, typed again (empty cells: ``None``), its recipe the one its
        columns recorded under ``space``'s constants (:func:`recorded_recipe`)."""
        values = {k: (None if v == "" else v) for k, v in cells.items()}
        recipe_cells = {k: _cell(k, values.get(k)) for k in RECIPE_COLUMNS}
        return cls(config=recorded_recipe(space, recipe_cells), **_converted(values))

    def to_csv(self) -> dict[str, Any]:
        """The CSV cells (the status as its string, the recipe flattened into its columns)."""
        cells = {k: getattr(self, k) for k in COLUMNS}
        cells[keys.STATUS] = self.status.value
        return cells

    # The recipe's columns, read from the recipe (held once).

    @property
    def micro_batch_size(self) -> int:
        return self.config.micro_batch_size

    @property
    def accumulation_steps(self) -> int:
        return self.config.accumulation_steps

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def lr_multiplier(self) -> float:
        return self.config.lr_multiplier

    @property
    def weight_decay_multiplier(self) -> float:
        return self.config.weight_decay_multiplier

    @property
    def effective_batch_size(self) -> int:
        return self.config.effective_batch_size

    @property
    def lr(self) -> float:
        return self.config.lr

    @property
    def weight_decay(self) -> float:
        return self.config.weight_decay

    @property
    def warmup_steps(self) -> int:
        return self.config.warmup_steps

    @property
    def lr_scale(self) -> float:
        return self.config.lr_scale

    @property
    def knobs(self) -> tuple[int, int, int, float, float]:
        """The raw knobs, in :data:`raybatch.keys.RAW_KNOBS` order: what identifies a recipe."""
        c = self.config
        return (
            c.micro_batch_size, c.accumulation_steps, c.world_size,
            c.lr_multiplier, c.weight_decay_multiplier,
        )  # fmt: skip

    def knob_dict(self) -> KnobPoint:
        """The raw knobs by name (a Tune config's, for :meth:`SearchSpace.derive_from`)."""
        return cast(KnobPoint, dict(zip(keys.RAW_KNOBS, self.knobs, strict=True)))

    @property
    def reached(self) -> bool:
        """Whether the run reached what it trained to: the target, or its meeting level."""
        return self.status is TrialStatus.REACHED

    @property
    def to_target(self) -> bool:
        """Whether the run reached the target itself (not a confirmation's meeting level):
        its ``time_to_target_s`` is a time to target."""
        return self.reached and self.meet_level is None


def recorded_recipe(space: SearchSpace, cells: Mapping[str, Any]) -> TrialConfig:
    """The recipe a row recorded: its knobs and derived values as they ran (``cells``, the
    :data:`RECIPE_COLUMNS`), with ``space``'s constants (:meth:`SearchSpace.recipe_constants`:
    its name, rules, optimizer and reference) and its warmup in samples (not a column: the
    row's ``warmup_steps`` is what ran). Not derived again, nor checked against the space's
    limits: the row says what ran, and a space edited since would otherwise change it (its
    reference may then no longer be the one the row's ``lr_scale`` was taken against).

    Raises:
        ConfigError: A recorded value is missing or not of its kind.
    """
    scale = cells.get(keys.LR_SCALE)
    warmup = None  # a missing or malformed scale: from_dict names the cell
    if isinstance(scale, int | float) and not isinstance(scale, bool):
        warmup = space.warmup_samples(float(scale))
    values = {**cells, keys.WARMUP_SAMPLES: warmup, **space.recipe_constants()}
    return TrialConfig.from_dict(values, "a trial row")


RECIPE_COLUMNS: tuple[str, ...] = (
    *keys.RAW_KNOBS, keys.EFFECTIVE_BATCH_SIZE, keys.LR, keys.WEIGHT_DECAY, keys.WARMUP_STEPS,
    keys.LR_SCALE,
)  # fmt: skip
"""The recipe's columns in ``trials.csv``, flattened from :attr:`TrialRow.config`."""

_FIGURES = tuple(
    f.name
    for f in dataclasses.fields(TrialRow)
    if f.name not in ("phase", "trial_id", "status", "config")
)
"""The fields that are the trial's figures (all but its identity and its recipe)."""

COLUMNS: tuple[str, ...] = (keys.PHASE, keys.TRIAL_ID, keys.STATUS, *RECIPE_COLUMNS, *_FIGURES)
"""``trials.csv``'s columns, in order: the row's identity, its recipe's columns, its figures."""

REPORTED = (
    keys.TIME_TO_TARGET_S, keys.ELAPSED_TO_TARGET_S, keys.SAMPLES_TO_TARGET, keys.TRAIN_S,
    keys.EVAL_S, keys.ELAPSED_S, keys.HELD_S, keys.STARTED_AT, keys.STARTUP_S, keys.GPU_SHARE,
    keys.GPU_NAME, keys.GPU_ID, keys.NODE_IP, keys.METRIC,
    keys.PEAK_MEMORY_BYTES, keys.THROUGHPUT, keys.DATA_WAIT_FRACTION, keys.OBJECTIVE, keys.REASON,
)  # fmt: skip
"""The columns a trial's own reports fill (:mod:`raybatch.trial.reporting`), and the driver's
``objective`` and ``reason``; the seed, candidate and prediction are the driver's to add."""

_INTS = frozenset(
    {keys.MICRO_BATCH_SIZE, keys.ACCUMULATION_STEPS, keys.WORLD_SIZE, keys.EFFECTIVE_BATCH_SIZE,
     keys.WARMUP_STEPS, keys.SAMPLES_TO_TARGET, keys.PEAK_MEMORY_BYTES, keys.CANDIDATE,
     keys.SEED}
)  # fmt: skip
_TEXTS = frozenset({keys.PHASE, keys.TRIAL_ID, keys.REASON, keys.GPU_NAME, keys.GPU_ID,
                    keys.NODE_IP})  # fmt: skip


_ANSI_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def plain_text(text: str) -> str:
    """``text`` without terminal escape sequences (colours, cursor moves): a trial's reason
    may quote a traceback coloured for a terminal, which trials.csv and the report show as is."""
    return _ANSI_ESCAPE.sub("", text)


def _converted(values: Mapping[str, Any]) -> dict[str, Any]:
    """The row's identity and figures from ``values`` (text or numbers), typed."""
    return {
        name: _cell(name, values.get(name))
        for name in (keys.PHASE, keys.TRIAL_ID, keys.STATUS, *_FIGURES)
    }


def _cell(name: str, value: Any) -> Any:
    """One column's value, typed (the status a member; ``None`` stays ``None``)."""
    if name == keys.STATUS:
        return TrialStatus(value)  # an empty or unknown status is damage
    if value is None:
        return "" if name in (keys.PHASE, keys.TRIAL_ID) else None
    if name in _TEXTS:
        return plain_text(str(value))
    if name in _INTS:
        return _integer(name, value)
    return float(value)


def _integer(name: str, value: Any) -> int:
    """An int column's value, exactly (a seed of 2**60 stays itself; ``1e5`` reads as 100000;
    ``12.7`` is an error, never truncated)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value)
    try:
        return int(text)
    except ValueError:
        number = float(text)
    if not number.is_integer():
        raise ValueError(f"{name}: {text!r} is not a whole number")
    return int(number)


def write_trials_csv(path: Path, rows: Iterable[TrialRow]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow(row.to_csv())


def read_trials_csv(path: Path) -> list[dict[str, str]]:
    """The cells of ``trials.csv`` as text, the way a spreadsheet reads them."""
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def stored_rows(run_dir: Path, space: SearchSpace) -> list[TrialRow]:
    """The typed rows of a finished run's ``trials.csv``, each with the recipe it recorded
    under the run's ``space`` (:func:`recorded_recipe`).

    Raises:
        RunDirError: The search has not finished (no trials.csv), or a cell is malformed.
    """
    path = run_dir / TRIALS_CSV
    if not path.is_file():
        raise RunDirError([Issue(TRIALS_CSV, "missing: the search has not finished")], str(run_dir))
    try:
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
        cells_of_rows = read_trials_csv(path)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise RunDirError([Issue(TRIALS_CSV, _damaged(str(exc)))], str(run_dir)) from None
    missing = [c for c in _REQUIRED if c not in header]
    if missing:
        why = _damaged(f"its header lacks {', '.join(missing)}")
        raise RunDirError([Issue(TRIALS_CSV, why)], str(run_dir))
    if not cells_of_rows:
        raise RunDirError([Issue(TRIALS_CSV, _damaged("it holds no trial"))], str(run_dir))
    rows = []
    for line, cells in enumerate(cells_of_rows, start=2):
        try:
            rows.append(TrialRow.from_csv(cells, space))
        except (ValueError, OverflowError) as exc:
            raise RunDirError([Issue(f"line {line}", _damaged(str(exc)))], str(path)) from None
    return rows


_ADDED = (keys.GPU_NAME, keys.GPU_ID, keys.NODE_IP, keys.MEET_LEVEL)
"""Columns a trials.csv written before they were added lacks: read as empty."""
_REQUIRED = tuple(c for c in COLUMNS if c not in _ADDED)
"""Columns every trials.csv holds: raybatch writes them all, so a missing one is damage."""


def _damaged(why: str) -> str:
    return (
        f"damaged ({why}); optuna.db and tune/ still hold the search's trials: delete"
        " trials.csv and run `raybatch resume` on the run to write it again (the confirmation"
        " runs again)"
    )


def status_counts(rows: Iterable[TrialRow]) -> dict[str, int]:
    """How many trials of the search (pre-screened included, confirmation runs not) ended in
    each status: the summary the CLI prints and the report shows."""
    return dict(Counter(r.status.value for r in rows if r.phase != keys.PHASE_CONFIRMATION))


__all__ = [
    "COLUMNS", "REPORTED", "TRIALS_CSV", "TrialRow", "plain_text", "read_trials_csv",
    "status_counts", "stored_rows", "write_trials_csv",
]  # fmt: skip
