"""Batches for the built-in loop, fetched the way a hand-written PyTorch loop would fetch them.

The trial's clock counts waiting for data, so the loop must add no cost of its own there (a
``DataLoader`` over a ``TensorDataset`` indexes and collates per *sample*: 0.165 s an epoch of
the bundled tabular example against 0.006 s for indexing the tensors by hand). So:

- **tensor-backed data** (a ``TensorDataset``, or a ``Subset`` of one, any depth) is indexed
  in one call per batch with a shuffled permutation drawn from the trial's seeded generator;
- **anything else** goes through ``DataLoader`` (an epoch's batches of indices at a time),
  which fetches a batch in one call when the dataset defines ``__getitems__`` (PyTorch's
  batched-fetch protocol), and honours ``num_workers``;
- on CUDA, tensor-backed batches are gathered straight into pinned host memory (one copy,
  :func:`gather`) and copied with ``non_blocking=True``, so the copy overlaps the previous
  step instead of stalling the host;
- evaluation batches are independent of the trial's micro batch (:func:`eval_batch_size`).

Both paths read the same batches from one seeded permutation an epoch (:func:`_epochs`): the
last short batch dropped and, when data-parallel, each rank a disjoint slice, as
``DistributedSampler(drop_last=True)`` does; a resumed trial starts at the batch it was at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from raybatch.errors import ConfigError, Issue

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset


def move_to(batch: Any, device: torch.device | str) -> Any:
    """``batch`` with every tensor leaf on ``device`` (tuples, lists and dicts preserved).

    Copies to CUDA are ``non_blocking``: from pinned memory (a ``DataLoader`` with
    ``pin_memory``) they overlap the running step; from pageable memory they are ordinary.
    """
    import torch
    from torch.utils._pytree import tree_map

    # Never non_blocking towards the CPU: that copy would return before the data arrived.
    overlap = torch.device(device).type == "cuda"
    if isinstance(batch, Mapping) and type(batch) is not dict:  # a tokenizer's BatchEncoding:
        batch = dict(batch)  # a leaf to torch's pytree, it would stay where it was
    return tree_map(
        lambda x: x.to(device, non_blocking=overlap) if isinstance(x, torch.Tensor) else x, batch
    )


CPU_EVAL_BATCH_LIMIT = 4096
"""On CPU the validation set is evaluated in batches of up to this many samples (the whole
set for the bundled examples): per-batch overhead is what costs there, not memory."""


def tensor_source(dataset: Any) -> tuple[Sequence[torch.Tensor], torch.Tensor | None] | None:
    """The tensors behind ``dataset`` and the row indices it selects, if it is tensor-backed.

    ``None`` for any other dataset (its items may be computed, augmented or loaded lazily).
    """
    import torch
    from torch.utils.data import Subset, TensorDataset

    if type(dataset) is TensorDataset:
        return dataset.tensors, None
    if type(dataset) is Subset:
        inner = tensor_source(dataset.dataset)
        if inner is None:
            return None
        tensors, rows = inner
        selected = torch.as_tensor(list(dataset.indices), dtype=torch.long)
        return tensors, selected if rows is None else rows[selected]
    return None


def gather(t: torch.Tensor, index: torch.Tensor, pinned: bool) -> torch.Tensor:
    """The rows ``index`` of ``t``, gathered straight into pinned host memory when ``pinned``
    (one copy; ``t[index].pin_memory()`` gathers, then copies again into pinned memory, which
    costs most at small batches, where steps are short). PyTorch's caching host allocator
    reuses the pinned block once the copy that read it has finished."""
    import torch

    if not pinned or t.device.type != "cpu":
        return t[index]
    out = torch.empty((len(index), *t.shape[1:]), dtype=t.dtype, pin_memory=True)
    return torch.index_select(t, 0, index, out=out)


def _to_device(batch: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """On CUDA: host rows through pinned memory, copied without blocking the host (tensors
    the user already keeps on the GPU are left where they are)."""
    if device.type != "cuda":
        return batch
    return [
        t.to(device, non_blocking=t.is_pinned()) if t.device.type == "cpu" else t.to(device)
        for t in batch
    ]


def _epochs(size: int, batch_size: int, seed: int, rank: int, world_size: int, start: int
            ) -> Iterator[tuple[int, list[torch.Tensor]]]:  # fmt: skip
    """This rank's micro batches of row indices, an epoch at a time, from the ``start``-th on.

    One seeded generator draws each epoch's permutation, as ``DistributedSampler(seed=...,
    drop_last=True)`` would: the rows are cut to a multiple of the world size and each rank
    takes every ``world_size``-th. Starting at ``start`` draws the epochs before it (a
    permutation each, no data read), so a trial resumed from its checkpoint sees the batches
    an uninterrupted one would.
    """
    import torch

    per_rank = size // world_size
    per_epoch = per_rank // batch_size
    generator = torch.Generator().manual_seed(seed)
    epoch, offset = divmod(start, per_epoch)
    for _ in range(epoch):
        torch.randperm(size, generator=generator)
    while True:
        order = torch.randperm(size, generator=generator)[: per_rank * world_size]
        mine = order[rank::world_size]
        yield epoch, [mine[i * batch_size : (i + 1) * batch_size] for i in range(offset, per_epoch)]
        epoch, offset = epoch + 1, 0


def _tensor_batches(
    tensors: Sequence[torch.Tensor],
    rows: torch.Tensor | None,
    epochs: Iterator[tuple[int, list[torch.Tensor]]],
    device: torch.device,
) -> Iterator[list[torch.Tensor]]:
    pinned = device.type == "cuda"
    for _, batches in epochs:
        for index in batches:
            if rows is not None:
                index = rows[index]
            yield _to_device([gather(t, index, pinned) for t in tensors], device)


def _loader_batches(
    dataset: Dataset[Any],
    epochs: Iterator[tuple[int, list[torch.Tensor]]],
    device: torch.device,
    num_workers: int,
    seed: int,
    collate: Callable[[list[Any]], Any] | None = None,
) -> Iterator[Any]:
    """Through a ``DataLoader`` an epoch at a time (its workers, pinning and collate): the same
    batches as the tensor path would index, in the same order. Each epoch's loader has a
    generator of its own (its workers' seeds), so it draws nothing from the global one: a
    trial resumed mid-epoch sees the random draws an uninterrupted one would."""
    import torch
    from torch.utils.data import DataLoader

    for epoch, batches in epochs:
        generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
        loader = DataLoader(dataset, batch_sampler=[b.tolist() for b in batches],
                            num_workers=num_workers, pin_memory=device.type == "cuda",
                            collate_fn=collate, generator=generator)  # fmt: skip
        for batch in loader:
            yield move_to(batch, device)


def train_batches(
    dataset: Dataset[Any],
    batch_size: int,
    device: torch.device,
    *,
    seed: int,
    num_workers: int = 0,
    rank: int = 0,
    world_size: int = 1,
    collate: Callable[[list[Any]], Any] | None = None,
    start: int = 0,
) -> Iterator[Any]:
    """Training micro batches on ``device``, epoch after epoch, reshuffled each epoch
    (``collate``: the workload's, :meth:`raybatch.Workload.collate`), from the ``start``-th
    micro batch on (a trial resumed from its checkpoint: :mod:`raybatch.trial.pause`).

    Raises:
        ConfigError: Not one full batch per rank fits in the dataset.
    """
    size = len(dataset)  # type: ignore[arg-type]
    if size // world_size < batch_size:
        message = (
            f"{batch_size} x world size {world_size} is larger than the training set ({size}"
            " samples)"
        )
        raise ConfigError([Issue("micro_batch_size", message)])
    epochs = _epochs(size, batch_size, seed, rank, world_size, start)
    source = tensor_source(dataset)
    if source is not None and num_workers == 0 and collate is None:
        return _tensor_batches(*source, epochs, device)
    return _loader_batches(dataset, epochs, device, num_workers, seed, collate)


def eval_batch_size(requested: int | None, device: torch.device, micro_batch_size: int) -> int:
    """The validation batch: ``requested`` when given, else a large one for the device.

    Evaluation keeps no activations for a backward pass, so any batch that trains fits when
    evaluated; on CUDA the default is the trial's micro batch (which passed the probe) unless
    the search passes a larger one predicted to fit; on CPU, :data:`CPU_EVAL_BATCH_LIMIT`.
    """
    if requested is not None:
        return requested
    return micro_batch_size if device.type == "cuda" else CPU_EVAL_BATCH_LIMIT


def eval_batches(
    dataset: Dataset[Any],
    batch_size: int,
    device: torch.device,
    collate: Callable[[list[Any]], Any] | None = None,
) -> Iterator[Any]:
    """The validation set in order, in batches of ``batch_size``, on ``device``."""
    from torch.utils.data import DataLoader

    source = tensor_source(dataset) if collate is None else None
    if source is None:
        loader = DataLoader(dataset, batch_size=batch_size, pin_memory=device.type == "cuda",
                            collate_fn=collate)  # fmt: skip
        for batch in loader:
            yield move_to(batch, device)
        return
    tensors, rows = source
    pinned = device.type == "cuda"
    size = len(rows) if rows is not None else len(tensors[0])
    for start in range(0, size, batch_size):
        if rows is None:
            yield _to_device([t[start : start + batch_size] for t in tensors], device)
        else:
            index = rows[start : start + batch_size]
            yield _to_device([gather(t, index, pinned) for t in tensors], device)


__all__ = ["CPU_EVAL_BATCH_LIMIT", "eval_batch_size", "eval_batches", "move_to",
           "tensor_source", "train_batches"]  # fmt: skip
