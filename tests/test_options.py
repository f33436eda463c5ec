"""SearchOptions refuses what no search can run with, in Python as on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raybatch.errors import OptionError, RunDirError
from raybatch.run.rundir import read_run
from raybatch.tuning.options import SearchOptions


def test_defaults_are_valid() -> None:
    assert SearchOptions().trials == 20


def test_every_bad_option_is_named_at_once() -> None:
    with pytest.raises(OptionError) as err:
        SearchOptions(trials=0, gpus_per_trial="lots", confirm_seeds=-1, memory_budget="3GX")
    fields = [issue.field for issue in err.value.issues]
    assert fields == ["trials", "gpus_per_trial", "confirm_seeds", "memory_budget"]
    assert "<python>: trials: must be an integer >= 1, got 0" in str(err.value)
    assert "unknown unit 'GX'" in str(err.value)


@pytest.mark.parametrize(
    "bad",
    [
        {"max_time_s": 0},
        {"max_time_s": True},
        {"gpus_per_trial": -1},
        {"cpus_per_trial": 0},
        {"max_concurrent": 0},
        {"slack": 0.5},
        {"confirm_top": -1},
        {"eval_every_samples": 0},
        {"max_failures": -2},
        {"hang_grace_s": -5.0},
        {"trials": 2.5},
    ],
)
def test_out_of_range_values_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(OptionError) as err:
        SearchOptions(**bad)  # type: ignore[arg-type]
    assert [i.field for i in err.value.issues] == list(bad)


def test_memory_budget_is_kept_as_written_and_read_in_bytes() -> None:
    options = SearchOptions(memory_budget="2GiB", gpus_per_trial="auto", confirm_top=0)
    assert options.memory_budget == "2GiB"
    assert options.memory_budget_bytes == 2 * 2**30
    assert SearchOptions().memory_budget_bytes is None


def test_a_run_json_with_bad_options_blames_the_file_and_field(tmp_path: Path) -> None:
    from raybatch.metric import Target
    from raybatch.run.rundir import write_run_files
    from raybatch.space.presets import load_space

    space, target = load_space("generic_adamw"), Target(0.9)
    write_run_files(tmp_path / "r", "wl.py:w", space, target, SearchOptions())
    tmp_path = tmp_path / "r"
    run_json = tmp_path / "run.json"
    run = json.loads(run_json.read_text())
    run["options"]["trials"] = 0
    run_json.write_text(json.dumps(run))
    with pytest.raises(RunDirError) as err:
        read_run(tmp_path)
    assert f"{run_json}: options.trials: must be an integer >= 1, got 0" in str(err.value)


def test_files_of_another_format_are_refused_naming_the_file(tmp_path: Path) -> None:
    """run.json, best_config.yaml and the searcher's checkpoint carry one format stamp, read by
    one function: a file without it, or of another, is refused with the file named, not
    misread. The files the product writes carry the current one (they read back)."""
    import raybatch
    from raybatch.export import BestConfig, load_best, write_best
    from raybatch.metric import Target
    from raybatch.run.rundir import write_run_files
    from raybatch.space.presets import load_space
    from raybatch.tuning.searcher import read_checkpoint, write_checkpoint
    from raybatch.version import RUN_FORMAT, SAME_SINCE

    space = load_space("generic_adamw")
    write_run_files(tmp_path, "wl.py:w", space, Target(0.9), SearchOptions())
    assert read_run(tmp_path).workload == "wl.py:w"
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["format"] == RUN_FORMAT
    (tmp_path / "run.json").write_text(json.dumps({**run, "format": SAME_SINCE}))
    assert read_run(tmp_path).workload == "wl.py:w"  # a finished run of format 1 reads as is
    # Unfinished, it is not resumed: Tune's pickles name classes of the raybatch that wrote it
    # (before format 6 the searcher lived in raybatch.run), refused by run.json, not unpickled.
    with pytest.raises(RunDirError, match=rf"run\.json: format: {SAME_SINCE}: written by another"):
        raybatch.resume(tmp_path)
    # Formats 1-3 capped at levels of the metric: their level_slack means nothing now.
    older = {**run, "format": 3, "options": {**run["options"], "level_slack": 1.5}}
    older["options"].pop("zone")
    (tmp_path / "run.json").write_text(json.dumps(older))
    assert read_run(tmp_path).options.zone == SearchOptions().zone
    (tmp_path / "run.json").write_text(json.dumps({**run, "format": RUN_FORMAT + 1}))
    with pytest.raises(
        RunDirError, match=rf"run\.json: format: {RUN_FORMAT + 1}: written by another raybatch"
    ) as e:
        read_run(tmp_path)
    assert "damaged" not in str(e.value)  # said as what it is
    (tmp_path / "run.json").write_text("[1, 2]")
    with pytest.raises(RunDirError, match=r"run\.json: damaged \(TypeError: holds a list"):
        read_run(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps(run))

    write_best(tmp_path, BestConfig(space.derive(16), {"space": space.name}))
    assert load_best(tmp_path).config == space.derive(16)
    best = tmp_path / "best_config.yaml"
    written = best.read_text()
    best.write_text(written.replace(f"format: {RUN_FORMAT}\n", f"format: {SAME_SINCE}\n"))
    assert load_best(tmp_path).config == space.derive(16)  # a format bump elsewhere: still read
    best.write_text(written.replace(f"format: {RUN_FORMAT}\n", ""))
    with pytest.raises(RunDirError, match=r"best_config\.yaml: format: missing"):
        load_best(tmp_path)

    searcher = raybatch.RaybatchSearcher(space, penalty=60.0)
    searcher.save(str(tmp_path / "ckpt.pkl"))
    raybatch.RaybatchSearcher(space, penalty=60.0).restore(str(tmp_path / "ckpt.pkl"))
    state = read_checkpoint(str(tmp_path / "ckpt.pkl"), searcher.record)
    write_checkpoint({**state, "format": SAME_SINCE}, str(tmp_path / "old.pkl"), searcher.record)
    with pytest.raises(RunDirError, match=rf"old\.pkl: format: {SAME_SINCE}: .* reads format"):
        raybatch.RaybatchSearcher(space, penalty=60.0).restore(str(tmp_path / "old.pkl"))
