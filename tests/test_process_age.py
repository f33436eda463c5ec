"""A reused trial process: the start-up it is charged (once, by its first trial or by the
raybatch task it first ran) and how long Tune waits to reuse it."""

from __future__ import annotations

import os
import time

import pytest

from raybatch.cluster import process_age


def test_the_first_trial_in_a_process_is_charged_from_raybatchs_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process_age, "_charged", False)
    monkeypatch.setattr(process_age, "IMPORTED_AT", time.perf_counter() - 7.0)
    before = time.perf_counter()
    first, startup = process_age.start_trial()
    assert before - 8.0 < first <= before - 7.0  # the import and the unpickling: charged
    assert startup is not None and 7.0 <= startup < 8.0  # said as the process's start-up
    later, none = process_age.start_trial()
    assert later >= before and none is None  # every later trial from its own start


def test_a_process_that_ran_a_raybatch_task_first_charges_its_trial_from_its_own_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its start-up was charged to the task (the time model, a device reading)."""
    monkeypatch.setattr(process_age, "_charged", False)
    monkeypatch.setattr(process_age, "IMPORTED_AT", time.perf_counter() - 7.0)
    assert process_age.charged_to_task(lambda x: x + 1)(1) == 2
    before = time.perf_counter()
    since, startup = process_age.start_trial()
    assert since >= before and startup is None


def test_tune_waits_for_a_stopped_trials_cleanup_before_reusing_its_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TUNE_FUNCTION_THREAD_TIMEOUT_S", raising=False)
    process_age.start_trial()
    assert os.environ["TUNE_FUNCTION_THREAD_TIMEOUT_S"] == str(process_age.REUSE_WAIT_S)
    monkeypatch.setenv("TUNE_FUNCTION_THREAD_TIMEOUT_S", "5")  # the user's own setting wins
    process_age.start_trial()
    assert os.environ["TUNE_FUNCTION_THREAD_TIMEOUT_S"] == "5"
