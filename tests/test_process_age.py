"""The start-up a reused trial process is charged: once, by its first trial."""

from __future__ import annotations

import time

import pytest

from raybatch.trial import process_age


def test_the_first_trial_in_a_process_is_charged_from_the_process_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process_age, "_charged", False)
    age = process_age._age_s()
    assert age is not None and age > 0  # this test process has lived a while (imports)
    before = time.perf_counter()
    first = process_age.held_since()
    assert first <= before - age + 1.0  # charged back to about the process's start
    second = process_age.held_since()
    assert second >= before  # every later trial from its own start: start-up paid once


def test_without_proc_the_first_trial_is_charged_from_its_own_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process_age, "_charged", False)
    monkeypatch.setattr(process_age, "_age_s", lambda: None)
    before = time.perf_counter()
    assert process_age.held_since() >= before
