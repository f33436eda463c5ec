"""A trial paused at an evaluation goes on where it was: the same batches, the same random
draws, the same curve, its clock and counts from where they stood."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import raybatch
from raybatch import Target, keys
from raybatch.examples.digits import DigitsWorkload
from raybatch.trial.loop import LoopOptions, train
from raybatch.trial.pause import STATE_FILE, Saver, load
from raybatch.trial.reporting import TrialReporter

SPACE = raybatch.load_space("digits_cnn_sgd")


class NoisyDigits(DigitsWorkload):
    """Dropout (a resumed trial must draw what an uninterrupted one draws) and a validation
    set large enough for early evaluations on a subset (where its validation stands is part of
    the state)."""

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Sequential(super().build_model(), torch.nn.Dropout(0.3))

    def val_dataset(self) -> Any:
        from torch.utils.data import TensorDataset

        parts = [self.train_dataset(), super().val_dataset()]
        tensors = [torch.cat([p.tensors[i] for p in parts for _ in range(2)]) for i in (0, 1)]
        return TensorDataset(*tensors)  # 3,594 items: a subset of 1,000 early


RECIPE = SPACE.derive(32, 2)  # accumulation: the data position is in micro batches
EVERY = 256


def _reporter(reports: list[dict[str, Any]], saves: list[str], keep: Path) -> TrialReporter:
    # Near the target (the whole set read from then on) a few marks before reaching it.
    reporter = TrialReporter(Target(0.9), eval_every_samples=EVERY, max_time_s=300,
                             max_samples=EVERY * 40, report_fn=reports.append)  # fmt: skip

    def with_state(report: dict[str, Any], directory: str) -> None:
        kept = keep / f"save{len(saves)}"
        shutil.copytree(directory, kept)  # as Tune copies it into the trial's storage
        saves.append(str(kept))
        reports.append(report)

    reporter.channel.report_with_state = with_state
    return reporter


def _evaluations(reports: list[dict[str, Any]]) -> dict[int, float]:
    return {r[keys.SAMPLES_SEEN]: r[keys.METRIC] for r in reports
            if not r[keys.HEARTBEAT] and r[keys.METRIC] is not None}  # fmt: skip


class _Checkpoint:
    """What ``ray.tune.get_checkpoint()`` gives back: a directory to read."""

    def __init__(self, path: str) -> None:
        self.path = path

    def as_directory(self) -> Any:
        from contextlib import nullcontext

        return nullcontext(self.path)


def test_a_trial_resumed_from_a_save_follows_the_curve_of_one_never_paused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import functools

    import raybatch.trial.loop as loop

    # A save at every evaluation (not sqrt(3) apart in training time): the same saves on any
    # machine, however fast.
    monkeypatch.setattr(loop, "Saver", functools.partial(Saver, ratio=1.0, share=1e9))
    workload = NoisyDigits()
    options = LoopOptions(seed=5, ema_decay=0.9)
    whole: list[dict[str, Any]] = []
    saves: list[str] = []
    reporter = _reporter(whole, saves, tmp_path)
    train(workload, RECIPE, reporter, torch.device("cpu"), options, save=True)
    assert len(saves) == len(_evaluations(whole)) - 1  # each evaluation it went on from
    states = [load(_Checkpoint(path)) for path in saves]
    # The first save past the switch to the whole validation set, with evaluations after it.
    state = next(s for s in states[:-1] if s is not None and not s["validation"]["on_subset"])
    assert state["micro_steps"] > 0 and state["validation"]["near"]

    resumed: list[dict[str, Any]] = []
    again = _reporter(resumed, [], tmp_path / "again")
    train(NoisyDigits(), RECIPE, again, torch.device("cpu"), options, resume=state)
    saved_at = state["reporter"]["samples_seen"]
    before = {s: m for s, m in _evaluations(whole).items() if s > saved_at}
    after = _evaluations(resumed)
    assert before and after.keys() == before.keys()
    for samples, metric in before.items():
        assert after[samples] == pytest.approx(metric, abs=1e-6)
    assert (
        again.tally.samples_seen == reporter.tally.samples_seen
        and again.tally.steps == reporter.tally.steps
    )
    clock = state["reporter"]["clock"]
    first = next(r for r in resumed if not r[keys.HEARTBEAT])
    assert first[keys.TRAIN_S] > clock["elapsed_s"] - clock["eval_s"]  # its clock went on


def test_saves_come_at_evaluations_a_factor_apart_and_none_is_kept_after_its_report(
    tmp_path: Path,
) -> None:
    saver = Saver(lambda: {"x": 1}, ratio=2.0)
    assert saver.due(1.0)
    first = saver.save(1.0)
    assert (Path(first) / STATE_FILE).is_file()
    assert not saver.due(1.5) and saver.due(2.5)  # too soon after the last; then due
    second = saver.save(2.5)
    assert not Path(first).exists()
    saver.close()  # after Tune copied it with the report
    assert not Path(second).exists()
    # A dear save waits for more training: 5 % of the training since the last at most.
    saver.cost_s = 1.0
    assert not saver.due(10.0) and saver.due(22.5)


def test_the_first_evaluation_past_a_rung_saves_however_dear_the_save(tmp_path: Path) -> None:
    """Where a scheduler may pause the trial (its rungs), the evaluation just past one saves
    even where the ratio and the cost rules would not: a pause goes on from there, not from
    the save before (a trial trained that stretch again)."""
    saver = Saver(lambda: {"x": 1}, ratio=2.0, rungs=[0.185, 0.556])
    saver.save(0.1)
    saver.cost_s = 1.0  # dear: the cost rule alone would wait for 20 s of training
    assert not saver.due(0.15)  # no rung since the last save
    assert saver.due(0.19)  # the evaluation just past the 0.185 s rung
    saver.save(0.19)
    assert not saver.due(0.4) and saver.due(0.56)
    saver.save(0.56)
    assert not saver.due(1.0)  # past every rung: the rules as before
    saver.close()


def test_the_rung_grid_is_every_other_time_mark_below_the_cap() -> None:
    """The trial's pause points are where the scheduler's grid rungs sit, anchored as
    ``CappingScheduler.for_time_cap`` anchors them (the cap / eta), below any ``B``."""
    from raybatch.trial.cadence import rung_grid
    from raybatch.tuning.rungs import DEFAULT_ETA, grid_rungs

    cap = 15.0
    grid = rung_grid(cap)
    assert grid == pytest.approx([cap / 3**k for k in range(5, 0, -1)])
    for best in (0.5, 1.7, 4.2):
        below = grid_rungs(best, cap / DEFAULT_ETA)[:-1]
        assert all(any(r == pytest.approx(g) for g in grid) for r in below), (best, below)


def test_a_state_that_does_not_fit_the_trial_trains_it_afresh(tmp_path: Path) -> None:
    """Another format, or a model changed since the save: said, and trained from the first
    step (never a trial that fails for its own save, run again by Tune to fail again)."""
    reports: list[dict[str, Any]] = []
    reporter = _reporter(reports, [], tmp_path)
    stale = {"format": 0, "model": {}}
    train(NoisyDigits(), RECIPE, reporter, torch.device("cpu"), LoopOptions(seed=5),
          resume=stale)  # fmt: skip
    evaluations = _evaluations(reports)
    assert min(evaluations) == EVERY  # from its first step
    assert reporter.stopped


def test_a_save_that_cannot_be_read_trains_the_trial_afresh(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_bytes(b"not a torch file")
    assert load(_Checkpoint(str(tmp_path))) is None
    assert load(_Checkpoint(str(tmp_path / "gone"))) is None
    assert load(None) is None


@pytest.mark.slow
def test_a_trial_tune_pauses_goes_on_from_its_last_save_not_from_its_first_step(
    ray_session: None, tmp_path: Path
) -> None:
    """Tune's own PAUSE, as its schedulers issue it: the trial's process ends, and when Tune
    runs it again it reads the state its last evaluation saved; its counts and clock go on."""
    from ray import tune
    from ray.tune.schedulers import FIFOScheduler, TrialScheduler

    class PauseOnce(FIFOScheduler):
        def __init__(self) -> None:
            super().__init__()
            self.paused_at: int | None = None

        def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]
                            ) -> str:  # fmt: skip
            if self.paused_at is None and result.get(keys.SAMPLES_SEEN, 0) >= 4 * EVERY:
                self.paused_at = int(result[keys.SAMPLES_SEEN])
                return TrialScheduler.PAUSE
            return TrialScheduler.CONTINUE

    fn = raybatch.trainable(DigitsWorkload(), SPACE, target=1.0, max_time_s=300,
                            max_samples=EVERY * 12, eval_every_samples=EVERY)  # fmt: skip
    scheduler = PauseOnce()
    tuner = tune.Tuner(
        raybatch.with_resources(fn, gpus_per_trial=0, cpus_per_trial=1),
        param_space={"micro_batch_size": 32, "accumulation_steps": 2},
        tune_config=tune.TuneConfig(scheduler=scheduler),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="pause", verbose=0,
                                  checkpoint_config=tune.CheckpointConfig(num_to_keep=1)),
    )  # fmt: skip
    [result] = list(tuner.fit())
    assert scheduler.paused_at is not None
    frame = result.metrics_dataframe
    processes = list(dict.fromkeys(frame["pid"]))
    assert len(processes) == 2  # paused: its process ended, and another went on
    samples = list(frame[keys.SAMPLES_SEEN])
    first_again = samples[list(frame["pid"]).index(processes[1])]
    # From a save (one at an evaluation, at or before the pause), not from its first step;
    # its clock went on from the save's training seconds.
    assert EVERY < first_again <= scheduler.paused_at + EVERY
    again = frame[frame["pid"] == processes[1]]
    assert again[keys.TRAIN_S].iloc[0] > frame[keys.TRAIN_S].iloc[0]
    assert result.metrics[keys.STATUS] == "censored"
    assert result.metrics[keys.SAMPLES_SEEN] == EVERY * 12
