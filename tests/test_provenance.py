"""A winner's provenance is a typed record: written and read back field by field, a file's
unknown field refused with the file and field named, autocast's "fp32" told from "not said"."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from raybatch.errors import ConfigError, RunDirError
from raybatch.export import BEST_YAML, BestConfig, load_best, write_best
from raybatch.provenance import Provenance, Retargeted, SearchCost
from raybatch.space.presets import load_space


def _best(provenance: Provenance) -> BestConfig:
    return BestConfig(load_space("digits_cnn_sgd").derive(64, 1, 1), provenance)


def test_a_provenance_written_to_best_config_reads_back_equal(tmp_path: Path) -> None:
    written = Provenance(
        median_time_to_target_s=1.5, time_to_target_s_runs=[1.4, 1.6], device="CPU (test)",
        amp_dtype="bf16", amp_recorded=True, trial_id="t1", compared={"reference": {"ratio": 2.0}},
        retargeted=Retargeted(4, False, "moved", {"effective_batch_size": 64}),
        search_cost=SearchCost(30.0, 12.0, 1.5, 7),
    )  # fmt: skip
    write_best(tmp_path, _best(written))
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
