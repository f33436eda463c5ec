"""The workload contract: what a user implements once so raybatch can trace and train.

A workload is the part of a training job that does not depend on the batch-size recipe: the
model, the data, the loss and the metric. raybatch supplies everything that does depend on it
(DataLoader batch size, accumulation, optimizer lr / weight decay, warmup). The contract is
deliberately small and PyTorch-native: an existing ``nn.Module`` and ``Dataset`` drop in, and
only three methods are required:

- :meth:`Workload.build_model` -> ``nn.Module`` (built on the CPU; raybatch moves it);
- :meth:`Workload.train_dataset` / :meth:`Workload.val_dataset` -> ``torch.utils.data.Dataset``.

Everything else has a default for a classifier whose dataset yields ``(input, label)``:
cross-entropy loss, accuracy, a batch made by collating dataset items, and the optimizer of the
space's family. Override what differs. :class:`SimpleWorkload` wraps existing parts without
subclassing.

Workloads are referenced from the CLI as ``path/to/file.py:NAME`` or ``package.module:NAME``,
where ``NAME`` is a :class:`Workload` instance, a subclass, or a function returning one.
"""

from __future__ import annotations

import abc
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from raybatch.errors import WorkloadError, first_line
from raybatch.metric import ACCURACY, Metric
from raybatch.space.config import TrialConfig
from raybatch.space.rules import OptimizerFamily

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import Dataset

    from raybatch.space.infer import FoundRecipe


class Workload(abc.ABC):
    """Base class of a training workload.

    Attributes:
        name: Shown in reports and exported configs.
        space: The search space this workload is usually searched with (a preset name or
            path), used when a command is given none.
        amp_dtype: ``None`` (fp32), ``"bf16"`` or ``"fp16"``: the autocast dtype the model
            trains with; the memory trace uses it too.
        gpu_prefetch_batches: Batches the input pipeline places on the GPU ahead of use
            (e.g. a CUDA prefetcher or DALI). Each costs a full batch of GPU memory (seed 000),
            so the memory estimate adds them. 0 for a plain ``DataLoader`` with pinned memory.
        metrics: The validation metrics :meth:`evaluate` returns, first the one a bare target
            (``--target 0.97``) means. Each states its direction and range, so a target that
            cannot be met (``--target 97`` for an accuracy in [0, 1]) is refused before any
            trial runs. Default: accuracy, higher is better, 0..1.

    Example::

        import torch
        from torch.utils.data import TensorDataset, random_split
        import raybatch

        x = torch.randn(1280, 4)  # a toy task: is the sum of x positive?
        train, val = random_split(TensorDataset(x, (x.sum(dim=1) > 0).long()), [1024, 256])

        class Halfspace(raybatch.Workload):
            name = "halfspace"

            def build_model(self):  # built on the CPU; raybatch moves it
                return torch.nn.Linear(4, 2)

            def train_dataset(self):
                return train

            def val_dataset(self):
                return val

        fn = raybatch.trainable(Halfspace(), "generic_adamw", "accuracy>=0.95", max_time_s=60)
    """

    name: str = "workload"
    space: str | None = None
    amp_dtype: str | None = None
    gpu_prefetch_batches: int = 0
    metrics: tuple[Metric, ...] = (ACCURACY,)

    @abc.abstractmethod
    def build_model(self) -> nn.Module:
        """A freshly initialised model on the CPU (called once per trial, and per trace)."""

    @abc.abstractmethod
    def train_dataset(self) -> Dataset[Any]:
        """The training data; its items are collated into batches."""

    @abc.abstractmethod
    def val_dataset(self) -> Dataset[Any]:
        """The validation data the target metric is measured on."""

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The training loss of one batch. Default: cross-entropy of ``model(x)`` against ``y``."""
        import torch.nn.functional as F

        inputs, targets = batch
        return F.cross_entropy(model(inputs), targets)

    def evaluate(self, model: nn.Module, batches: Iterable[Any]) -> float | Mapping[str, float]:
        """The validation metrics over ``batches`` (already on the model's device).

        Return a number (the value of the first of :attr:`metrics`) or a mapping from metric
        names to values (``{"accuracy": 0.93, "loss": 0.31}``) covering :attr:`metrics`; the
        target picks one by name. Default: classification accuracy.
        """
        import torch

        correct = total = 0
        with torch.no_grad():
            for inputs, targets in batches:
                correct += int((model(inputs).argmax(dim=1) == targets).sum())
                total += int(targets.numel())
        return correct / max(total, 1)

    def collate(self) -> Callable[[list[Any]], Any] | None:
        """How dataset items become one batch (a ``DataLoader``'s ``collate_fn``: padding
        sequences, building dicts); ``None``: PyTorch's ``default_collate``."""
        return None

    def eval_collate(self) -> Callable[[list[Any]], Any] | None:
        """How validation items become one batch (default: :meth:`collate`'s): a training
        collate that augments (MixUp, CutMix) must not touch the validation set."""
        return self.collate()

    def example_batch(self, batch_size: int) -> Any:
        """A batch of ``batch_size`` training items, for the memory trace and the real probe.

        The default collates the first items of the training set (cycling if it is smaller).
        The memory trace calls it with ``batch_size=1`` and widens each tensor along its first
        dimension, so the batch dimension must come first (PyTorch's convention).
        """
        from torch.utils.data import default_collate

        dataset = self.train_dataset()
        size = len(dataset)  # type: ignore[arg-type]
        if size == 0:
            raise WorkloadError(f"{self.name}: train_dataset() is empty")
        collate = self.collate() or default_collate
        return collate([dataset[i % size] for i in range(batch_size)])

    def build_optimizer(self, model: nn.Module, config: TrialConfig) -> torch.optim.Optimizer:
        """The optimizer of the space's family with the derived lr and weight decay."""
        return build_optimizer(model.parameters(), config)

    def left_out(self) -> list[str]:
        """What the user's own training code does that a search does not (an LR scheduler, a
        framework's hooks), said as the search starts: a recipe measured without them is not
        silently the recipe trained with them. A workload of raybatch's own: nothing."""
        return []

    def found_recipe(self) -> FoundRecipe | None:
        """The recipe the user's own training code trains with, each value with where it came
        from (``raybatch init-space`` writes a space around it); ``None`` for a workload of
        raybatch's own, whose recipe is its space."""
        return None


def build_optimizer(params: Iterable[Any], config: TrialConfig) -> torch.optim.Optimizer:
    """``torch.optim.SGD`` / ``AdamW`` / ``Adam`` with the recipe's lr, weight decay and kwargs."""
    import torch

    classes: dict[OptimizerFamily, Any] = {
        OptimizerFamily.SGD: torch.optim.SGD,
        OptimizerFamily.ADAMW: torch.optim.AdamW,
        OptimizerFamily.ADAM: torch.optim.Adam,
    }
    kwargs = dict(config.optimizer_kwargs)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    optimizer: torch.optim.Optimizer = classes[config.optimizer](
        params, lr=config.lr, weight_decay=config.weight_decay, **kwargs
    )
    return optimizer


class SimpleWorkload(Workload):
    """A workload made of existing parts, for users who do not want to subclass.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from raybatch.workload import SimpleWorkload
        >>> data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
        >>> workload = SimpleWorkload(lambda: torch.nn.Linear(4, 2), data, data)
        >>> workload.example_batch(8)[0].shape
        torch.Size([8, 4])
    """

    def __init__(
        self,
        model_fn: Callable[[], nn.Module],
        train: Dataset[Any],
        val: Dataset[Any],
        *,
        loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
        name: str = "workload",
        amp_dtype: str | None = None,
        metrics: tuple[Metric, ...] = (ACCURACY,),
    ) -> None:
        self.metrics = metrics
        self._model_fn = model_fn
        self._train = train
        self._val = val
        self._loss_fn = loss_fn
        self.name = name
        self.amp_dtype = amp_dtype

    def build_model(self) -> nn.Module:
        return self._model_fn()

    def train_dataset(self) -> Dataset[Any]:
        return self._train

    def val_dataset(self) -> Dataset[Any]:
        return self._val

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        if self._loss_fn is None:
            return super().loss(model, batch)
        return self._loss_fn(model, batch)


def _import_file(reference: str, target: str) -> ModuleType:
    """Import ``target`` (a ``.py`` file) as Python imports a script: its folder on ``sys.path``.

    Sibling modules the file imports are found, as they would be by ``python file.py``; the
    module gets a private, stable name so it can never shadow an installed one. Ray workers
    receive it (and its siblings) by value, see :mod:`raybatch.shipping`.
    """
    path = Path(target)
    if not path.is_file():
        raise WorkloadError(f"{reference}: no such file {target}")
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    stem = "".join(c if c.isalnum() else "_" for c in resolved.stem)
    module_name = f"_raybatch_workload_{stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise WorkloadError(f"{reference}: cannot import {target}")
    module = importlib.util.module_from_spec(spec)
    folder = str(resolved.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[module_name] = module  # dataclasses and pickle look modules up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise WorkloadError(
            f"{reference}: importing {target} failed: {type(exc).__name__}: {first_line(exc)}"
        ) from exc
    return module


def absolute_reference(reference: str) -> str:
    """``reference`` with a file path made absolute, so ``resume`` works from any folder."""
    target, sep, attr = reference.rpartition(":")
    if sep and (target.endswith(".py") or "/" in target) and Path(target).is_file():
        return f"{Path(target).resolve()}:{attr}"
    return reference


def load_workload(reference: str) -> Workload:
    """Import a workload from ``path/to/file.py:NAME`` or ``package.module:NAME``.

    ``NAME`` may be a :class:`Workload` instance, a :class:`Workload` subclass (instantiated
    without arguments) or a function returning a workload.

    Raises:
        WorkloadError: The reference is malformed, the file or module cannot be imported, the
            name is missing, or it does not give a :class:`Workload`.
    """
    target, sep, attr = reference.rpartition(":")
    if not sep or not target or not attr:
        raise WorkloadError(
            f"{reference}: a workload is given as path/to/file.py:NAME or package.module:NAME"
        )
    if target.endswith(".py") or "/" in target:
        module = _import_file(reference, target)
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:  # ImportError, or whatever the module raises on import
            raise WorkloadError(
                f"{reference}: cannot import module {target}: {type(exc).__name__}:"
                f" {first_line(exc)}"
            ) from exc
    if not hasattr(module, attr):
        raise WorkloadError(f"{reference}: {target} has no attribute {attr!r}")
    obj = getattr(module, attr)
    if callable(obj) and not isinstance(obj, Workload):
        obj = obj()  # a Workload subclass, or a factory function
    if not isinstance(obj, Workload):
        raise WorkloadError(
            f"{reference}: {attr} is a {type(obj).__name__}, not a raybatch.Workload"
        )
    return obj


def autocast_context(workload: Workload, device_type: str) -> Any:
    """The workload's autocast (``amp_dtype``) on ``device_type``, or a no-op context.

    The trace runs on CPU fake tensors and uses CPU autocast, which lowers the same matmul and
    convolution ops to the reduced dtype as CUDA autocast does; :func:`cuda_autocast_policy`
    adds what CUDA autocast runs in float32 and CPU autocast does not.
    """
    import torch

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    if workload.amp_dtype is None:
        return nullcontext()
    if workload.amp_dtype not in dtypes:
        raise WorkloadError(
            f"{workload.name}: amp_dtype must be None, 'bf16' or 'fp16', got {workload.amp_dtype!r}"
        )
    return torch.autocast(device_type, dtype=dtypes[workload.amp_dtype])
