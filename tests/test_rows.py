"""The typed trial row: ``trials.csv`` is its serialisation, and reading it back gives the same
typed row (statuses as members, counts as ints), whatever the CSV's text looked like."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest

import raybatch
from raybatch import keys
from raybatch.errors import RunDirError
from raybatch.metric import Target
from raybatch.results.rows import (
    COLUMNS,
    TRIALS_CSV,
    TrialRow,
    read_trials_csv,
    status_counts,
    stored_rows,
    write_trials_csv,
)
from raybatch.results.selection import choose_winner
from raybatch.status import TrialStatus

SPACE = raybatch.load_space("digits_cnn_sgd")


def _rows() -> list[TrialRow]:
    recipe = SPACE.derive(32, 2, 1, 1.3)
    tune_result = {"time_to_target_s": 1.5, "samples_to_target": 4096, "throughput": 812.5,
                   "val_accuracy": 0.97, "steps": 12, "gpu_name": "NVIDIA H100 80GB HBM3",
                   "gpu_id": "3", "node_ip": "10.0.0.7"}  # fmt: skip
    return [
        TrialRow.from_result(
            recipe, keys.PHASE_SEARCH, "00012e45", TrialStatus.REACHED, tune_result
        ),
        TrialRow.of(
            SPACE.derive(256),
            keys.PHASE_PRESCREEN,
            "optuna_3",
            TrialStatus.PRESCREENED_OUT,
            reason="predicted 9.1 GiB > 8 GiB, budget",
            peak_memory_bytes=9 * 2**30,
        ),
        TrialRow.of(
            recipe, keys.PHASE_CONFIRMATION, "c1", TrialStatus.CENSORED, seed=8, candidate=0
        ),
    ]


def test_a_row_is_its_recipe_and_its_figures_typed() -> None:
    row = _rows()[0]
    assert row.status is TrialStatus.REACHED and row.reached
    assert (row.micro_batch_size, row.accumulation_steps, row.effective_batch_size) == (32, 2, 64)
    assert row.lr == pytest.approx(SPACE.derive(32, 2, 1, 1.3).lr)
    assert isinstance(row.samples_to_target, int) and row.time_to_target_s == 1.5
    assert row.config == SPACE.derive(32, 2, 1, 1.3)  # the row carries the recipe it measured
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.status = TrialStatus.CAPPED  # type: ignore[misc]
    # Only a trial's reported figures come from a Tune result; a misspelt figure is an error.
    assert row.seed is None and not hasattr(row, "val_accuracy")
    with pytest.raises(TypeError, match="time_to_targt_s"):
        TrialRow.of(SPACE.derive(32), keys.PHASE_SEARCH, "t", TrialStatus.REACHED,
                    time_to_targt_s=1.0)  # fmt: skip


def test_trials_csv_round_trips_every_row_exactly(tmp_path: Path) -> None:
    rows = _rows()
    write_trials_csv(tmp_path / TRIALS_CSV, rows)
    with (tmp_path / TRIALS_CSV).open() as f:
        assert tuple(next(csv.reader(f))) == COLUMNS  # identity, the recipe's columns, figures
    text = read_trials_csv(tmp_path / TRIALS_CSV)
    assert text[0]["status"] == "reached" and text[0]["trial_id"] == "00012e45"
    back = stored_rows(tmp_path, SPACE)
    assert back == rows  # a Tune id that looks like a number (00012e45) stays text
    assert status_counts(back) == {"reached": 1, "prescreened_out": 1}  # confirmations apart


def test_a_row_read_back_holds_the_recipe_it_recorded_not_one_derived_again(
    tmp_path: Path,
) -> None:
    """The recipe is held once, flattened into its columns only in the file; read back, it is
    the recipe as it ran, even under a space edited since (its rules would derive another)."""
    rows = _rows()
    write_trials_csv(tmp_path / TRIALS_CSV, rows)
    back = stored_rows(tmp_path, SPACE)
    assert "config" not in COLUMNS and [r.config for r in back] == [r.config for r in rows]
    edited = SPACE.model_copy(update={"reference": SPACE.reference.model_copy(update={"lr": 1.0})})
    again = stored_rows(tmp_path, edited)
    assert [r.config.lr for r in again] == [r.config.lr for r in rows]  # as measured
    assert edited.derive(32, 2, 1, 1.3).lr != rows[0].config.lr
    best = choose_winner(Target(0.97), back, confirmed=False)
    assert best is not None and best.config == rows[0].config


def test_a_csv_without_a_column_raybatch_writes_is_refused_as_damaged(tmp_path: Path) -> None:
    cut = [c for c in COLUMNS if c not in (keys.PREDICTED_TIME_S, keys.ELAPSED_TO_TARGET_S)]
    with (tmp_path / TRIALS_CSV).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=cut, extrasaction="ignore")
        writer.writeheader()
        writer.writerow(_rows()[0].to_csv())
    with pytest.raises(RunDirError, match="its header lacks elapsed_to_target_s, predicted_time_s"):
        stored_rows(tmp_path, SPACE)


def test_a_row_says_which_gpu_of_which_node_it_ran_on_and_an_older_csv_reads_without(
    tmp_path: Path,
) -> None:
    """Each row records its GPU's model and id and its node (a cluster of mixed GPUs is read
    right); a trials.csv written before those columns existed reads with them empty."""
    row = _rows()[0]
    assert (row.gpu_name, row.gpu_id, row.node_ip) == ("NVIDIA H100 80GB HBM3", "3", "10.0.0.7")
    older = [c for c in COLUMNS if c not in (keys.GPU_NAME, keys.GPU_ID, keys.NODE_IP)]
    with (tmp_path / TRIALS_CSV).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=older, extrasaction="ignore")
        writer.writeheader()
        writer.writerow(row.to_csv())
    back = stored_rows(tmp_path, SPACE)[0]
    assert (back.gpu_name, back.gpu_id, back.node_ip) == (None, None, None)
    assert back.time_to_target_s == row.time_to_target_s


def test_a_malformed_cell_names_the_file_and_line(tmp_path: Path) -> None:
    write_trials_csv(tmp_path / TRIALS_CSV, _rows())
    text = (tmp_path / TRIALS_CSV).read_text().replace("prescreened_out", "fitted", 1)
    (tmp_path / TRIALS_CSV).write_text(text)
    with pytest.raises(RunDirError) as caught:
        stored_rows(tmp_path, SPACE)
    assert "trials.csv" in str(caught.value) and "line 3" in str(caught.value)
    assert "'fitted' is not a valid TrialStatus" in str(caught.value)


def test_cells_read_back_exactly_or_are_refused_by_line(tmp_path: Path) -> None:
    """Integers stay exact (a seed past 2**53 is still itself), ``1e5`` is 100000, an empty
    status is damage, and a fraction in an integer column or an overflowing one is named,
    never truncated."""
    row = _rows()[2]
    big = dataclasses.replace(row, seed=2**60 + 1)
    write_trials_csv(tmp_path / TRIALS_CSV, [big])
    assert stored_rows(tmp_path, SPACE)[0].seed == 2**60 + 1
    cells = {**row.to_csv(), "samples_to_target": "1e5"}
    back = TrialRow.from_csv({k: "" if v is None else str(v) for k, v in cells.items()}, SPACE)
    assert back.status is row.status and back.samples_to_target == 100000
    with pytest.raises(ValueError, match="None is not a valid TrialStatus"):
        TrialRow.from_csv(
            {k: "" if v is None else str(v) for k, v in {**cells, "status": ""}.items()}, SPACE
        )
    for bad, why in (("12.7", "not a whole number"), ("inf", "")):
        cells = {**row.to_csv(), "samples_to_target": bad}
        with (tmp_path / TRIALS_CSV).open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerow(cells)
        with pytest.raises(RunDirError, match="line 2") as caught:
            stored_rows(tmp_path, SPACE)
        assert why in str(caught.value)
    assert "seed" in COLUMNS and "val_accuracy" not in COLUMNS


def test_a_meeting_runs_level_is_a_column_and_its_time_is_no_time_to_target(
    tmp_path: Path,
) -> None:
    """A confirmation run to the race's meeting level keeps the level in ``meet_level``: it
    reached what it trained to, but its time is to the level (``to_target`` is false); a
    trials.csv written before the column existed reads with it empty."""
    row = dataclasses.replace(_rows()[0], phase=keys.PHASE_CONFIRMATION, seed=4, meet_level=0.61,
                              status=TrialStatus.REACHED, time_to_target_s=1.5)  # fmt: skip
    write_trials_csv(tmp_path / TRIALS_CSV, [row])
    back = stored_rows(tmp_path, SPACE)[0]
    assert back.meet_level == 0.61 and back.reached and not back.to_target
    older = [c for c in COLUMNS if c != keys.MEET_LEVEL]
    with (tmp_path / TRIALS_CSV).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=older, extrasaction="ignore")
        writer.writeheader()
        writer.writerow(row.to_csv())
    back = stored_rows(tmp_path, SPACE)[0]
    assert back.meet_level is None and back.to_target
