"""A winner's provenance is a typed record: written and read back field by field, a file's
unknown field refused with the file and field named, autocast's "fp32" told from "not said"."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from raybatch.errors import ConfigError, RunDirError
from raybatch.export import BEST_YAML, BestConfig, load_best, write_best
from raybatch.keys import KnobPoint
from raybatch.provenance import Comparison, Provenance, RetargetVerdict, RunnerUp, SearchCost
from raybatch.space.presets import load_space

KNOBS = KnobPoint(micro_batch_size=64, accumulation_steps=1, world_size=1, lr_multiplier=1.0,
                  weight_decay_multiplier=1.0)  # fmt: skip


def _best(provenance: Provenance) -> BestConfig:
    return BestConfig(load_space("digits_cnn_sgd").derive(64, 1, 1), provenance)


def test_a_provenance_written_to_best_config_reads_back_equal(tmp_path: Path) -> None:
    written = Provenance(
        median_time_to_target_s=1.5, time_to_target_s_runs=[1.4, 1.6], device="CPU (test)",
        amp_dtype="bf16", amp_recorded=True, trial_id="t1",
        compared={"reference": Comparison("64 x 1", KNOBS, "capped", 2.0, "at_least", train_s=3.0),
                  "max_batch": Comparison("256 x 1", KNOBS, "failed", reason="crashed")},
        runner_up=RunnerUp(KNOBS, 1.3, 2, 3, False),
        retargeted=RetargetVerdict(4, False, "moved", {"effective_batch_size": 64}),
        search_cost=SearchCost(30.0, 12.0, 1.5, 7),
    )  # fmt: skip
    write_best(tmp_path, _best(written))
    file = yaml.safe_load((tmp_path / BEST_YAML).read_text())["provenance"]
    assert file["runner_up"]["micro_batch_size"] == 64  # flat: its knobs beside its verdict
    assert file["compared"]["max_batch"] == {
        "recipe": "256 x 1",
        **KNOBS,
        "status": "failed",
        "ratio": None,
        "bound": None,
        "reason": "crashed",
    }
    read = load_best(tmp_path).provenance
    assert read == written and read.amp_recorded
    assert read.retargeted is not None and read.retargeted.note == "moved"
    assert read.search_cost is not None and read.search_cost.trainings == 20.0


def test_an_fp32_run_is_told_from_one_that_did_not_record_its_autocast(tmp_path: Path) -> None:
    fp32 = Provenance(amp_dtype=None, amp_recorded=True)
    assert fp32.to_dict() == {"amp_dtype": None}  # written: the run trained in fp32
    assert Provenance.from_dict({"amp_dtype": None}).amp_recorded
    assert not Provenance.from_dict({}).amp_recorded
    assert not _best(Provenance()).amp_recorded and _best(fp32).amp_recorded
    assert Provenance(amp_dtype="bf16").to_dict() == {"amp_dtype": "bf16"}  # given: recorded
    assert fp32 != Provenance()  # recorded fp32 and "not said" are two records


def test_an_unknown_provenance_field_in_a_file_is_refused_naming_file_and_field(
    tmp_path: Path,
) -> None:
    write_best(tmp_path, _best(Provenance(device="CPU (test)")))
    path = tmp_path / BEST_YAML
    data = yaml.safe_load(path.read_text())
    data["provenance"]["devise"] = "typo"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RunDirError, match=r"provenance\.devise: unknown field") as caught:
        load_best(tmp_path)
    assert caught.value.source == str(path)


def test_a_mapping_given_as_provenance_is_read_as_the_record() -> None:
    """What a snippet's written-out ``best`` passes: a mapping, read field by field."""
    best = BestConfig(
        load_space("digits_cnn_sgd").derive(64, 1, 1), {"trial_id": "t9", "device": "x"}
    )
    assert isinstance(best.provenance, Provenance) and best.provenance.trial_id == "t9"
    with pytest.raises(ConfigError, match=r"provenance\.nope"):
        BestConfig(best.config, {"nope": 1})
    with pytest.raises(ConfigError, match=r"provenance\.retargeted: not a retarget's record"):
        BestConfig(best.config, {"retargeted": {"measured": False, "nott": "x"}})


def test_a_malformed_comparison_in_a_file_is_refused_naming_the_comparison(
    tmp_path: Path,
) -> None:
    compared = {"reference": Comparison("64 x 1", KNOBS, "reached", 1.2, "measured")}
    write_best(
        tmp_path, _best(Provenance(compared=compared, runner_up=RunnerUp(KNOBS, 1, 1, 1, True)))
    )
    path = tmp_path / BEST_YAML
    data = yaml.safe_load(path.read_text())
    data["provenance"]["compared"]["reference"]["bound"] = "roughly"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RunDirError, match=r"provenance\.compared\.reference: bound must be one"):
        load_best(tmp_path)
    data["provenance"]["compared"]["reference"]["bound"] = "measured"
    data["provenance"]["compared"]["reference"]["ratio"] = "fast"
    del data["provenance"]["compared"]["reference"]["lr_multiplier"]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RunDirError) as caught:
        load_best(tmp_path)
    assert "compared.reference.lr_multiplier: must be a number" in str(caught.value)
    assert "compared.reference.ratio: must be float | None, got 'fast'" in str(caught.value)
    data["provenance"]["compared"]["reference"].update(ratio=1.2, lr_multiplier=1.0)
    del data["provenance"]["runner_up"]["pairs"]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RunDirError, match=r"provenance\.runner_up: a runner-up's verdict needs"):
        load_best(tmp_path)


OLD_COMPARISONS = """
runner_up: {micro_batch_size: 256, accumulation_steps: 1, world_size: 1, lr_multiplier: 1.0,
  weight_decay_multiplier: 1.0, paired_ratio: 1.07, wins: 2, pairs: 3, within_noise: true,
  indifference: 0.1}
compared:
  max_batch: {recipe: 256 x 1 at 1x, micro_batch_size: 256, accumulation_steps: 1,
    world_size: 1, lr_multiplier: 1.0, weight_decay_multiplier: 1.0, status: capped,
    ratio: 2.5, bound: at_least, train_s: 5.0}
  reference: {recipe: 64 x 1 at 1x, micro_batch_size: 64, accumulation_steps: 1, world_size: 1,
    lr_multiplier: 1.0, weight_decay_multiplier: 1.0, status: reached, is_winner: true,
    ratio: 1.0, bound: measured}
"""
"""The comparisons as raybatch wrote them before they were typed (format 1 and 2)."""


def test_comparisons_written_before_they_were_typed_read_and_write_back_unchanged() -> None:
    data = yaml.safe_load(OLD_COMPARISONS)
    read = Provenance.from_dict(data)
    assert read.runner_up is not None and read.runner_up.wins == 2
    assert read.compared is not None and read.compared["reference"].is_winner
    assert read.compared["max_batch"].knobs["micro_batch_size"] == 256
    written = read.to_dict()
    assert written == data
    for name in ("runner_up",):
        assert list(written[name]) == list(data[name])  # the same keys, in the same order
    for name, comparison in data["compared"].items():
        assert list(written["compared"][name]) == list(comparison)
