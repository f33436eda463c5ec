"""The plugin path: a raybatch trainable in the user's own Tuner, with the searcher, the
scheduler and the resources following from the one ``raybatch.trainable`` call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

import raybatch
from raybatch import keys
from raybatch.errors import NotATrainableError, OptionError, UnknownSettingError
from raybatch.examples.digits import DigitsWorkload
from raybatch.memory.sizes import parse_size
from raybatch.status import HANG_GRACE_S
from raybatch.trial.settings import parts_of

SPACE = raybatch.load_space("digits_cnn_sgd")


def _trainable(**settings: Any) -> Any:
    return raybatch.trainable(DigitsWorkload(), SPACE, target=0.97, **settings)


def test_the_penalty_and_the_hang_clock_follow_the_trainables_time_cap() -> None:
    fn = _trainable(max_time_s=7)
    searcher = raybatch.RaybatchSearcher.for_trainable(fn)
    scheduler = raybatch.CappingScheduler.for_trainable(fn)
    assert searcher.penalty == 70.0 == parts_of(fn).settings.penalty
    assert searcher.space is SPACE
    assert (
        scheduler.guard is not None
        and scheduler.guard.after_s == 7 + HANG_GRACE_S
        and scheduler.mode == "max"
    )
    assert raybatch.CappingScheduler.for_trainable(fn, slack=3.0).slack == 3.0
    pinned = _trainable(gpu_model="A100", data_parallel_gpus=True, cuda_context_bytes=300 << 20)
    searcher = raybatch.RaybatchSearcher.for_trainable(pinned)
    devices = searcher.devices
    assert (devices.gpu_model, devices.data_parallel_gpus) == ("A100", True)
    assert devices.context_bytes == 300 << 20


def test_a_misspelt_trial_setting_is_refused_not_dropped() -> None:
    """Refused by name with the setting it most likely meant: raybatch's own error (the CLI's
    one line), and a TypeError as Python's own for an unexpected keyword."""
    with pytest.raises(UnknownSettingError, match=r"max_time: .*did you mean 'max_time_s'"):
        _trainable(max_time=5)
    with pytest.raises(TypeError):
        _trainable(grad_clip=1.0)
    assert parts_of(_trainable(grad_clip_norm=1.0)).settings.loop.grad_clip_norm == 1.0


def test_a_searcher_is_built_with_a_penalty_or_from_a_trainable() -> None:
    with pytest.raises(TypeError, match=r"penalty"):
        raybatch.RaybatchSearcher(SPACE)  # type: ignore[call-arg]
    with pytest.raises(OptionError, match=r"penalty: must be a positive number"):
        raybatch.RaybatchSearcher(SPACE, penalty=float("nan"))
    # Each refusal names what the caller takes instead of a trainable of raybatch's.
    with pytest.raises(NotATrainableError, match=r"raybatch\.trainable.*RaybatchSearcher\(space"):
        raybatch.RaybatchSearcher.for_trainable(lambda config: None)
    with pytest.raises(NotATrainableError, match=r"raybatch\.trainable.*for_time_cap"):
        raybatch.CappingScheduler.for_trainable(lambda config: None)
    with pytest.raises(NotATrainableError, match=r"raybatch\.trainable.*trial_resources"):
        raybatch.with_resources(lambda config: None)


def test_the_trainables_memory_budget_turns_the_prescreen_on() -> None:
    from raybatch.tuning.gates import MemoryFits, gate_of

    screened = raybatch.RaybatchSearcher.for_trainable(_trainable(memory_budget="64MiB"))
    gate = gate_of(screened.gates, MemoryFits)
    assert isinstance(gate, MemoryFits) and gate.budget_bytes == parse_size("64MiB")
    unbudgeted = raybatch.RaybatchSearcher.for_trainable(_trainable())
    assert gate_of(unbudgeted.gates, MemoryFits) is None
    off = raybatch.RaybatchSearcher.for_trainable(
        _trainable(memory_budget="64MiB"), prescreen=False
    )
    assert gate_of(off.gates, MemoryFits) is None


def test_the_in_memory_study_is_kept_in_the_searchers_checkpoint(tmp_path: Path) -> None:
    """No storage URL: Optuna's in-memory storage, carried by the Tune checkpoint, so a
    restored experiment's searcher goes on with the trials already told."""
    fn = _trainable(max_time_s=5)
    searcher = raybatch.RaybatchSearcher.for_trainable(fn, seed=0)
    for i in range(3):
        assert searcher.suggest(f"t{i}") is not None
        reached = {keys.STATUS: "reached", keys.TIME_TO_TARGET_S: 1.0 + i, keys.OBJECTIVE: 1.0 + i}
        searcher.on_trial_complete(f"t{i}", reached)
    searcher.save(str(tmp_path / "ckpt.pkl"))
    restored = raybatch.RaybatchSearcher.for_trainable(fn, seed=0)
    restored.restore(str(tmp_path / "ckpt.pkl"))
    told = restored.study.get_trials(states=[optuna.trial.TrialState.COMPLETE])
    assert [t.value for t in told] == [1.0, 2.0, 3.0]
    assert restored.suggest("t3") is not None
    assert len(restored.study.trials) == 4
    # A fresh searcher without the checkpoint starts an empty study: the checkpoint carried it.
    assert raybatch.RaybatchSearcher.for_trainable(fn).study.trials == []
