"""Evaluations far from the target read a fixed subset; near it, and at the target, the whole
validation set (raybatch/trial/validation.py), through the training loop as a trial runs it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

from raybatch import SearchSpace, Target
from raybatch.status import TrialStatus
from raybatch.trial.loop import LoopOptions, train
from raybatch.trial.reporting import TrialReporter
from raybatch.trial.validation import MIN_SUBSET_ITEMS, Validation, early_subset_indices

from .workloads import C, D, MLPWorkload


def test_the_early_subset_is_the_same_quarter_of_a_large_validation_set_every_time() -> None:
    first = early_subset_indices(8000, 0.25)
    assert first is not None and len(first) == 2000 == len(set(first))
    assert first == sorted(first) and first == early_subset_indices(8000, 0.25)
    assert first != list(range(2000))  # drawn across the set: a sorted set's head is biased


def test_a_small_validation_set_or_no_fraction_is_read_whole_from_the_start() -> None:
    assert early_subset_indices(2 * MIN_SUBSET_ITEMS - 1, 0.25) is None
    assert early_subset_indices(8000, 0.0) is None
    assert early_subset_indices(8000, 1.0) is None
    assert early_subset_indices(2 * MIN_SUBSET_ITEMS, 0.25) is not None


def _scripted(early: list[float], whole: list[float], metric: str = "accuracy"
              ) -> tuple[Validation, Any]:  # fmt: skip
    """A validation whose batches say which set they are, and a run that answers from a script."""
    sets = {"early": list(early), "whole": list(whole)}

    def run(batches: Iterator[Any]) -> dict[str, float]:
        return {metric: sets[next(batches)].pop(0)}

    return Validation(lambda: iter(["whole"]), lambda: iter(["early"]), Target(0.8)), run


def test_far_from_the_target_the_subset_is_read_and_from_near_it_on_the_whole_set() -> None:
    validation, run = _scripted(early=[0.1, 0.4, 0.75], whole=[0.76, 0.79])
    read = [validation.evaluate(run) for _ in range(4)]
    # 0.75 is 93 % of the way from 0.1 to 0.8: that mark reads the whole set, and every later one
    assert [(v["accuracy"], whole) for v, whole in read] == [
        (0.1, False), (0.4, False), (0.76, True), (0.79, True),
    ]  # fmt: skip
    assert not validation.on_subset and validation.near


def test_a_set_read_whole_from_the_start_is_near_from_the_same_share_of_the_way() -> None:
    """Too small to cut: no subset, but the evaluations still come closer near the target."""
    validation = Validation(lambda: iter(["whole"]), None, Target(0.8))
    values = iter([0.1, 0.5, 0.74])
    seen = []
    for _ in range(3):
        validation.evaluate(lambda batches: {"accuracy": next(values)})
        seen.append(validation.near)
    assert seen == [False, False, True]  # 0.74 is 91 % of the way from 0.1 to 0.8


def test_a_subset_value_at_the_target_is_replaced_by_the_whole_sets_at_the_same_mark() -> None:
    validation, run = _scripted(early=[0.1, 0.85], whole=[0.78])
    validation.evaluate(run)
    values, whole = validation.evaluate(run)
    assert whole and values["accuracy"] == 0.78  # the subset's 0.85 never reaches the target


def test_a_loss_target_nears_from_above() -> None:
    sets = {"early": [1.0, 0.5, 0.18], "whole": [0.17]}
    validation = Validation(lambda: iter(["whole"]), lambda: iter(["early"]),
                            Target(0.1, "min", "loss"))  # fmt: skip

    def run(batches: Iterator[Any]) -> dict[str, float]:
        return {"loss": sets[next(batches)].pop(0)}

    flags = [validation.evaluate(run)[1] for _ in range(3)]
    assert flags == [False, False, True]  # 0.18 is 91 % of the way from 1.0 to 0.1


def _space() -> SearchSpace:
    return SearchSpace.from_dict({
        "name": "subset_test", "reference": {"batch_size": 8, "lr": 0.1, "optimizer": "sgd"},
        "rules": {"lr": "linear", "weight_decay": "none"}, "search": {"micro_batch_size": [8]},
    })  # fmt: skip


class _Counting(MLPWorkload):
    """4,000 validation items; an evaluation of the subset says 0.1 more each time, one of the
    whole set says 0.99; the items each evaluation read are kept."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        self.val = TensorDataset(torch.randn(4000, D, generator=generator),
                                 torch.randint(0, C, (4000,), generator=generator))  # fmt: skip
        self.read: list[int] = []

    def val_dataset(self) -> Dataset[Any]:
        return self.val

    def evaluate(self, model: torch.nn.Module, batches: Any) -> float:
        self.read.append(sum(len(b[1]) for b in batches))
        return 0.99 if self.read[-1] == 4000 else 0.1 * len(self.read)


def test_a_trial_evaluates_a_quarter_of_the_set_until_near_the_target_and_reaches_on_the_whole(
) -> None:  # fmt: skip
    workload = _Counting()
    space = _space()
    reports: list[dict[str, Any]] = []
    reporter = TrialReporter(0.95, eval_every_samples=8, max_time_s=60, report_fn=reports.append)
    train(workload, space.derive(8), reporter, torch.device("cpu"), LoopOptions())
    # 0.9 is 94 % of the way from 0.1 to 0.95: the ninth mark reads the whole set, and reaches
    assert workload.read == [1000] * 9 + [4000]
    assert reporter.status is TrialStatus.REACHED
    evaluations = [r for r in reports if not r.get("heartbeat")]
    assert [r["eval_whole"] for r in evaluations] == [False] * 8 + [True]


def test_early_eval_zero_reads_the_whole_set_at_every_mark() -> None:
    workload = _Counting()
    space = _space()
    reporter = TrialReporter(0.95, eval_every_samples=8, max_time_s=60, report_fn=lambda m: None)
    train(workload, space.derive(8), reporter, torch.device("cpu"), LoopOptions(early_eval=0.0))
    assert workload.read == [4000]
