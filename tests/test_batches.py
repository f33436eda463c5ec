"""Batches for the built-in loop: one fetch per batch, every sample once an epoch, ranks apart."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from raybatch.batches import (
    CPU_EVAL_BATCH_LIMIT,
    eval_batch_size,
    eval_batches,
    tensor_source,
    train_batches,
)

CPU = torch.device("cpu")


def _numbered(n: int) -> TensorDataset:
    """Row i holds i in both tensors, so a batch shows which rows it took."""
    return TensorDataset(torch.arange(n).float().unsqueeze(1), torch.arange(n))


def _take(it: Any, n: int) -> list[Any]:
    return [next(it) for _ in range(n)]


def test_a_tensor_dataset_gives_every_sample_once_an_epoch_and_reshuffles() -> None:
    it = train_batches(_numbered(100), 32, CPU, seed=0)
    first, second = _take(it, 3), _take(it, 3)  # 3 full batches an epoch, the 4 left dropped
    rows = [torch.cat([b[1] for b in epoch]) for epoch in (first, second)]
    for epoch in rows:
        assert len(epoch) == 96 and len(set(epoch.tolist())) == 96
    assert rows[0].tolist() != rows[1].tolist()
    assert all(torch.equal(b[0].squeeze(1).long(), b[1]) for b in first + second)  # aligned


def test_the_order_is_the_seed_s() -> None:
    a = torch.cat([b[1] for b in _take(train_batches(_numbered(64), 8, CPU, seed=5), 8)])
    b = torch.cat([b[1] for b in _take(train_batches(_numbered(64), 8, CPU, seed=5), 8)])
    c = torch.cat([b[1] for b in _take(train_batches(_numbered(64), 8, CPU, seed=6), 8)])
    assert a.tolist() == b.tolist() != c.tolist()


def test_ranks_get_disjoint_slices_of_one_permutation() -> None:
    ranks = [train_batches(_numbered(50), 8, CPU, seed=1, rank=r, world_size=3) for r in range(3)]
    taken = [torch.cat([b[1] for b in _take(it, 2)]).tolist() for it in ranks]  # 16 each
    everything = [row for rows in taken for row in rows]
    assert len(everything) == 48 and len(set(everything)) == 48


def test_a_subset_of_a_tensor_dataset_is_indexed_through_its_rows() -> None:
    subset = Subset(Subset(_numbered(100), list(range(50, 100))), list(range(0, 50, 2)))
    _tensors, rows = tensor_source(subset)  # type: ignore[misc]
    assert rows is not None and rows.tolist() == list(range(50, 100, 2))
    batches = _take(train_batches(subset, 5, CPU, seed=0), 5)
    assert sorted(torch.cat([b[1] for b in batches]).tolist()) == list(range(50, 100, 2))
    assert [b[1].tolist() for b in eval_batches(subset, 10, CPU)] == [
        list(range(50, 70, 2)), list(range(70, 90, 2)), list(range(90, 100, 2))
    ]  # fmt: skip


class Batched(Dataset[Any]):
    """A computed dataset with PyTorch's batched-fetch protocol: counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> Any:
        raise AssertionError("fetched one item at a time")

    def __getitems__(self, indices: list[int]) -> list[Any]:
        self.calls += 1
        return [(torch.tensor([float(i)]), i) for i in indices]


def test_other_datasets_go_through_dataloader_one_fetch_per_batch() -> None:
    data = Batched()
    assert tensor_source(data) is None
    batches = _take(train_batches(data, 8, CPU, seed=0), 6)  # 5 an epoch: into the second
    assert data.calls == 6
    assert all(b[0].shape == (8, 1) for b in batches)


def test_a_tensor_dataset_subclass_is_not_assumed_to_be_plain_tensors() -> None:
    class Augmented(TensorDataset):
        def __getitem__(self, i: int) -> Any:
            x, y = super().__getitem__(i)
            return x + 1000, y

    data = Augmented(*_numbered(16).tensors)
    assert tensor_source(data) is None
    assert next(iter(eval_batches(data, 16, CPU)))[0].min() >= 1000


def test_too_large_a_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="larger than the training set"):
        train_batches(_numbered(20), 8, CPU, seed=0, world_size=3)


def test_evaluation_batches_are_large_and_independent_of_the_micro_batch() -> None:
    assert eval_batch_size(None, CPU, 8) == CPU_EVAL_BATCH_LIMIT
    assert eval_batch_size(None, torch.device("cuda", 0), 8) == 8
    assert eval_batch_size(100, CPU, 8) == 100
    batches = list(eval_batches(_numbered(300), eval_batch_size(None, CPU, 8), CPU))
    assert len(batches) == 1 and batches[0][1].tolist() == list(range(300))


@pytest.mark.parametrize(
    "pinned",
    [False, pytest.param(True, marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="pinned host memory needs CUDA"))],
)  # fmt: skip
def test_rows_are_gathered_in_one_copy_into_pinned_memory_on_cuda(pinned: bool) -> None:
    """``t[index].pin_memory()`` copied every batch twice inside the timed loop."""
    from raybatch.batches import gather

    t = torch.arange(40.0).reshape(20, 2)
    index = torch.tensor([3, 0, 7])
    got = gather(t, index, pinned)
    assert torch.equal(got, t[index]) and got.is_pinned() is pinned
