"""raybatch's training loop: accumulation is exact, warmup ramps, statuses end the loop."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from raybatch import SearchSpace, Target, keys
from raybatch.space.config import warmup_factor
from raybatch.status import TrialStatus
from raybatch.trial.clock import TrialClock
from raybatch.trial.loop import LoopOptions, train
from raybatch.trial.reporting import TrialReporter

from .workloads import D, MLPWorkload


def _space(reference_batch: int, lr: float = 0.1, rules: str = "linear") -> SearchSpace:
    return SearchSpace.from_dict(
        {
            "name": "loop_test",
            "reference": {"batch_size": reference_batch, "lr": lr, "optimizer": "sgd"},
            "rules": {"lr": rules, "weight_decay": "none"},
            "search": {"micro_batch_size": [8], "accumulation_steps": [1, 4]},
        }
    )


class Keeping(MLPWorkload):
    """Keeps the models it builds, so a test can read the trained weights."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[torch.nn.Module] = []

    def build_model(self) -> torch.nn.Module:
        self.kept.append(super().build_model())
        return self.kept[-1]


def _one_step_params(micro: int, accumulation: int) -> list[torch.Tensor]:
    """Parameters after exactly one optimizer step of ``micro`` x ``accumulation`` samples."""
    workload = Keeping()
    recipe = _space(reference_batch=micro * accumulation).derive(micro, accumulation)
    reporter = TrialReporter(
        Target(2.0),  # unreachable: only the sample budget stops the loop
        eval_every_samples=10**9,
        max_time_s=60,
        max_samples=micro * accumulation,
        report_fn=lambda m: None,
    )
    train(workload, recipe, reporter, torch.device("cpu"), LoopOptions(seed=3))
    assert reporter.tally.steps == 1 and reporter.tally.samples_seen == micro * accumulation
    return [p.detach().clone() for p in workload.kept[-1].parameters()]


@pytest.mark.parametrize(("micro", "accumulation"), [(8, 4), (16, 2), (4, 8)])
def test_accumulated_micro_batches_update_exactly_like_one_large_batch(
    micro: int, accumulation: int
) -> None:
    accumulated = _one_step_params(micro, accumulation)
    whole = _one_step_params(micro * accumulation, 1)
    for a, b in zip(accumulated, whole, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_different_step_count_would_be_caught() -> None:
    """The comparison above is sharp: two steps of the large batch differ from one."""
    one = _one_step_params(32, 1)
    two_steps = _one_step_params(16, 1)
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(one, two_steps, strict=True))


def test_warmup_ramps_linearly_to_the_peak() -> None:
    assert [warmup_factor(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0, 0) == 1.0


def test_learning_rate_follows_the_warmup_during_training() -> None:
    lrs: list[float] = []

    class Recording(MLPWorkload):
        def build_optimizer(self, model: torch.nn.Module, config: Any) -> torch.optim.Optimizer:
            optimizer = super().build_optimizer(model, config)
            optimizer.register_step_pre_hook(lambda opt, *_: lrs.append(opt.param_groups[0]["lr"]))
            return optimizer

    space = SearchSpace.from_dict(
        {
            "name": "warm",
            "reference": {"batch_size": 8, "lr": 0.01, "optimizer": "sgd"},
            "rules": {"lr": "linear"},
            "search": {"micro_batch_size": [32]},
            "warmup": {"samples_per_scale": 32},  # 4x scale -> 128 samples = 4 steps of 32
        }
    )
    recipe = space.derive(32)
    assert recipe.warmup_steps == 4
    reporter = TrialReporter(2.0, eval_every_samples=10**9, max_time_s=60, max_samples=6 * 32,
                             report_fn=lambda m: None)  # fmt: skip
    train(Recording(), recipe, reporter, torch.device("cpu"), LoopOptions())
    assert lrs == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.04, 0.04])


def test_each_evaluation_says_whether_the_lr_still_ramps_up() -> None:
    """What the capping scheduler reads to leave a rung reached mid-warmup alone: evaluated
    every 32 samples (one step), a recipe with 4 warmup steps says it ramps up exactly while
    the LR its next step takes is below the recipe's."""
    space = SearchSpace.from_dict(
        {
            "name": "warm",
            "reference": {"batch_size": 8, "lr": 0.01, "optimizer": "sgd"},
            "rules": {"lr": "linear"},
            "search": {"micro_batch_size": [32]},
            "warmup": {"samples_per_scale": 32},
        }
    )
    recipe = space.derive(32)
    optimizers: list[torch.optim.Optimizer] = []

    class Keeping(MLPWorkload):
        def build_optimizer(self, model: torch.nn.Module, config: Any) -> torch.optim.Optimizer:
            optimizers.append(super().build_optimizer(model, config))
            return optimizers[-1]

    marks: list[tuple[float, bool]] = []  # (the LR the next step takes, what the report says)

    def report(r: dict[str, Any]) -> None:
        if not r[keys.HEARTBEAT] and r[keys.WARMING_UP] is not None:
            marks.append((optimizers[0].param_groups[0]["lr"], r[keys.WARMING_UP]))

    reporter = TrialReporter(2.0, eval_every_samples=32, max_time_s=60, max_samples=7 * 32,
                             report_fn=report)  # fmt: skip
    train(Keeping(), recipe, reporter, torch.device("cpu"), LoopOptions())
    assert marks and all(warming == (lr < recipe.lr * 0.999) for lr, warming in marks), marks
    assert {w for _, w in marks} == {True, False}


def test_micro_batch_larger_than_the_data_is_an_error_not_a_silent_empty_loop() -> None:
    workload = MLPWorkload()
    recipe = _space(reference_batch=512).derive(512)
    reporter = TrialReporter(2.0, eval_every_samples=10, max_time_s=5, report_fn=lambda m: None)
    with pytest.raises(ValueError, match="larger than the training set"):
        train(workload, recipe, reporter, torch.device("cpu"), LoopOptions())


def test_ema_is_what_gets_evaluated() -> None:
    evaluated: list[torch.nn.Module] = []

    class Watching(Keeping):
        def evaluate(self, model: torch.nn.Module, batches: Any) -> float:
            evaluated.append(model)
            return 0.0

    reporter = TrialReporter(2.0, eval_every_samples=D, max_time_s=60, max_samples=4 * D,
                             report_fn=lambda m: None)  # fmt: skip
    workload = Watching()
    train(workload, _space(8).derive(8), reporter, torch.device("cpu"), LoopOptions(ema_decay=0.9))
    assert evaluated and all(m is not workload.kept[-1] for m in evaluated)
    assert reporter.status is TrialStatus.CENSORED


def test_between_marks_the_device_loop_neither_reads_the_loss_nor_synchronises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CUDA policy, driven on CPU: the loss is summed on the device and read at marks
    only, and the clock synchronises only there, so syncs are bounded per mark, not per step."""
    import raybatch.trial.loop as loop

    reads: list[int] = []
    real_read = loop.read_loss
    monkeypatch.setattr(loop, "reads_loss_every_step", lambda device, distributed: False)
    monkeypatch.setattr(loop, "read_loss", lambda t, n: reads.append(n) or real_read(t, n))
    syncs: list[int] = []
    marks = 4
    reporter = TrialReporter(
        2.0, eval_every_samples=64, max_time_s=60, max_samples=marks * 64,
        report_fn=lambda m: None, clock=TrialClock(synchronize=lambda: syncs.append(1)),
    )  # fmt: skip
    train(MLPWorkload(), _space(8).derive(8), reporter, torch.device("cpu"), LoopOptions())
    assert reporter.tally.steps == marks * 8  # 32 optimizer steps
    assert reads == [8] * marks  # one read per mark, of the 8 steps since the last
    assert len(syncs) <= 4 * (marks + 1)
    assert reporter.tally.loss is not None and reporter.tally.initial_loss is not None


def test_on_cpu_the_loss_is_read_every_step_so_a_nan_stops_the_trial_at_once() -> None:
    class GoesNaN(MLPWorkload):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
            self.calls += 1
            loss = super().loss(model, batch)
            return loss * float("nan") if self.calls == 3 else loss

    reporter = TrialReporter(2.0, eval_every_samples=10**6, max_time_s=60, report_fn=lambda m: None)
    train(GoesNaN(), _space(8).derive(8), reporter, torch.device("cpu"), LoopOptions())
    assert reporter.status is TrialStatus.DIVERGED and reporter.tally.steps == 3


def test_an_fp16_step_the_scaler_skipped_moves_neither_the_schedule_nor_the_ema() -> None:
    """GradScaler skips the optimizer step on overflowing gradients; warmup and the weight
    average must skip it too (CPU's GradScaler behaves like CUDA's here)."""
    from raybatch.trial.ema import WeightAverage
    from raybatch.trial.loop import LoopParts, optimizer_step

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step + 1.0)
    ema = WeightAverage(model, 0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    parts = LoopParts(model, model, optimizer, scheduler, ema, scaler, None)
    before = [p.detach().clone() for p in model.parameters()]

    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    for p in model.parameters():
        p.grad = torch.full_like(p, float("inf"))
    optimizer_step(parts, LoopOptions())
    assert scheduler.last_epoch == 0
    assert ema.updates == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    optimizer_step(parts, LoopOptions())
    assert scheduler.last_epoch == 1
    assert ema.updates == 1


def test_the_weight_average_is_torchs_ema_without_a_device_read_per_step() -> None:
    """The same weights as ``AveragedModel`` with ``get_ema_multi_avg_fn`` over several steps,
    with the update count a Python int (``AveragedModel`` branches on a tensor: a host sync
    per optimizer step on CUDA), and current BatchNorm statistics."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    from raybatch.trial.ema import WeightAverage

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1)
    )
    ours = WeightAverage(model, 0.9)
    torchs = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        model(torch.randn(16, 4)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        ours.update(model)
        torchs.update_parameters(model)
    for a, b in zip(ours.module.parameters(), torchs.module.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    assert isinstance(ours.updates, int) and ours.updates == 5
    running = ours.module[1].running_mean  # type: ignore[index]
    assert torch.equal(running, model[1].running_mean)  # type: ignore[index]
    assert not any(p.requires_grad for p in ours.module.parameters())
