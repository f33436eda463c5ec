"""A trial's tally on its own: what a report reads of it, and what a paused trial keeps."""

from __future__ import annotations

from raybatch import keys
from raybatch.trial.tally import TrialTally


def test_a_report_reads_rates_per_training_second_and_every_validation_value() -> None:
    tally = TrialTally(samples_seen=600, steps=3, metric=0.8, values={"accuracy": 0.8, "f1": 0.7})
    fields = tally.fields(train_s=2.0, data_wait_s=0.5)
    assert fields[keys.THROUGHPUT] == 300.0 and fields[keys.DATA_WAIT_FRACTION] == 0.25
    assert fields[keys.VALIDATION_PREFIX + "f1"] == 0.7 and fields[keys.SAMPLES_SEEN] == 600
    before = TrialTally().fields(train_s=0.0, data_wait_s=0.0)  # no training yet: no rate
    assert before[keys.THROUGHPUT] == 0.0 and before[keys.DATA_WAIT_FRACTION] == 0.0


def test_a_paused_trial_keeps_its_counts_and_readings_not_a_time_to_target() -> None:
    tally = TrialTally(samples_seen=64, steps=2, reports=1, loss=1.5, initial_loss=2.0,
                       time_to_target_s=3.0)  # fmt: skip
    kept = tally.kept()
    assert set(kept) == set(TrialTally.KEPT) and kept["samples_seen"] == 64
    assert "time_to_target_s" not in kept
