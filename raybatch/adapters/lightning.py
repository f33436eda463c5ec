"""A LightningModule and a LightningDataModule searched as they are: no rewrite as a Workload.

People who search batch recipes already have a ``LightningModule`` and a
``LightningDataModule``; :class:`LightningWorkload` reads them as a :class:`raybatch.Workload`:

- **model**: the module itself, built fresh for every trial;
- **data**: the datasets of the datamodule's loaders (after ``prepare_data()`` and
  ``setup("fit")``, as ``Trainer.fit`` calls them), batched by raybatch at each recipe's micro
  batch with each loader's ``collate_fn``: batch size, shuffling and workers are the search's;
- **loss**: ``training_step``'s; **metrics**: what ``validation_step`` logs, reduced as
  Lightning's epoch end does (``self.log`` is a no-op while training: there is no ``Trainer``);
- **optimizer**: the space's, at the recipe's LR and weight decay (``raybatch init-space``
  writes the first one ``configure_optimizers()`` returns into the space; where the space
  names another, the search says so as it starts); the module's LR scheduler is not used, as
  the recipe's warmup is raybatch's.

Left out, and said rather than silently dropped: ``Trainer`` callbacks and hooks other than the
three steps (:data:`HOOKS`), manual optimization, several optimizers, and data-parallel recipes
(``training_step`` would have to run through DDP's forward). Precision is the workload's
``amp_dtype``, not the ``Trainer``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from raybatch.errors import WorkloadError
from raybatch.metric import Metric, metrics_named
from raybatch.workload import Workload

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import Dataset

    from raybatch.space.infer import FoundRecipe


def _ignore(*args: Any, **kwargs: Any) -> None:
    """``self.log`` while the module trains under raybatch: nothing to log to."""


class _Logged:
    """What ``validation_step`` logs over one evaluation: batch-weighted means by name, and
    ``torchmetrics`` objects to compute at the end."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.objects: dict[str, Any] = {}
        self.size = 1

    def log(self, name: str, value: Any, *args: Any, batch_size: int | None = None,
            **kwargs: Any) -> None:  # fmt: skip
        if hasattr(value, "compute") and hasattr(value, "reset"):  # a torchmetrics.Metric
            self.objects[name] = value
            return
        weight = float(batch_size if batch_size is not None else self.size)
        self.sums[name] = self.sums.get(name, 0.0) + float(value) * weight
        self.weights[name] = self.weights.get(name, 0.0) + weight

    def log_dict(self, values: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
        for name, value in values.items():
            self.log(name, value, *args, **kwargs)

    def values(self) -> dict[str, float]:
        out = {name: self.sums[name] / self.weights[name] for name in self.sums}
        for name, metric in self.objects.items():
            out[name] = float(metric.compute())
            metric.reset()
        return out


def _batch_size(batch: Any) -> int:
    """The first tensor's leading dimension (Lightning infers ``batch_size`` the same way)."""
    import torch
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return 1


def _returned(returned: Any) -> tuple[list[Any], list[Any]]:
    """The optimizers and the LR schedulers among the forms ``configure_optimizers`` may
    return (an optimizer, lists or tuples of them, dicts with ``optimizer`` and
    ``lr_scheduler``), in the order it gives them."""
    import torch

    optimizers: list[Any] = []
    schedulers: list[Any] = []
    candidates: list[Any] = [returned]
    while candidates:
        item = candidates.pop(0)
        if isinstance(item, torch.optim.Optimizer):
            optimizers.append(item)
        elif isinstance(item, Mapping):
            scheduler = item.get("lr_scheduler")
            scheduler = scheduler.get("scheduler") if isinstance(scheduler, Mapping) else scheduler
            if scheduler is not None:
                schedulers.append(scheduler)
            if "optimizer" in item:
                candidates.insert(0, item["optimizer"])
        elif isinstance(item, list | tuple):
            candidates[:0] = list(item)
        elif hasattr(item, "step") and hasattr(item, "get_last_lr"):
            schedulers.append(item)
    return optimizers, schedulers


def _first_optimizer(returned: Any) -> torch.optim.Optimizer:
    """The optimizer among the forms ``configure_optimizers`` may return."""
    optimizers, _ = _returned(returned)
    if not optimizers:
        raise WorkloadError("configure_optimizers() returned no torch.optim.Optimizer")
    return optimizers[0]  # type: ignore[no-any-return]


HOOKS = (
    "on_train_start", "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start",
    "on_train_batch_end", "on_after_backward", "on_before_optimizer_step",
    "on_validation_epoch_end", "configure_callbacks", "configure_gradient_clipping",
    "lr_scheduler_step",
)  # fmt: skip
"""The ``LightningModule`` hooks a ``Trainer`` calls and a search does not: one the module
overrides is said as the search starts."""


def _left_out(module: Any, returned: Any) -> list[str]:
    """What a search does not run of ``module``, whose ``configure_optimizers()`` returned
    ``returned``: its LR schedulers, optimizers after the first, manual optimization and the
    ``Trainer`` hooks it overrides (:data:`HOOKS`)."""
    cls = type(module).__name__
    optimizers, schedulers = _returned(returned)
    said = [f"{cls}.configure_optimizers()'s LR scheduler ({type(scheduler).__name__}): the"
            " recipe's warmup is the search's LR schedule" for scheduler in schedulers]  # fmt: skip
    if len(optimizers) > 1:
        said.append(f"{cls}.configure_optimizers() returned {len(optimizers)} optimizers: the"
                    " first alone trains")  # fmt: skip
    if getattr(module, "automatic_optimization", True) is False:
        said.append(f"{cls} optimizes by hand (automatic_optimization = False): the search"
                    " steps the optimizer itself, on training_step's loss")  # fmt: skip
    return said + [f"{cls}.{hook}(): no Trainer calls it" for hook in _overridden(module)]


def _overridden(module: Any) -> list[str]:
    """The :data:`HOOKS` the module's class overrides (against the ``LightningModule`` it
    derives from, whichever package it came from)."""
    base = next((c for c in type(module).__mro__ if c.__name__ == "LightningModule"), None)
    if base is None:
        return []
    return [h for h in HOOKS if getattr(type(module), h, None) is not getattr(base, h, None)]


def _own_collate(loader: Any) -> Callable[[list[Any]], Any] | None:
    from torch.utils.data import default_collate

    collate = getattr(loader, "collate_fn", None)
    return None if collate is None or collate is default_collate else collate


class LightningWorkload(Workload):
    """A ``LightningModule`` and a ``LightningDataModule``, searched without a rewrite.

    Args:
        module: Builds a freshly initialised ``LightningModule`` (its class, or a function).
        datamodule: The ``LightningDataModule`` (or a function building one); ``setup("fit")``
            is called once, on first use, in each process.
        metrics: What ``validation_step`` logs that a target may name, first the one a bare
            target means: a :class:`raybatch.Metric`, or a name (higher is better, ``loss``
            in the name: lower).
        name: Shown in reports (default: the module's class name).
        space: The search space this workload is usually searched with (a preset or a path).
        amp_dtype: ``None``, ``"bf16"`` or ``"fp16"``: the autocast the module trains with.

    Example:
        >>> from raybatch.adapters.lightning import LightningWorkload
        >>> # workload = LightningWorkload(MyModule, MyDataModule(), metrics=("val_acc",))
        >>> # raybatch search my_job.py:workload --target "val_acc>=0.9" --space my_space.yaml
    """

    def __init__(
        self,
        module: Callable[[], nn.Module],
        datamodule: Any,
        *,
        metrics: Iterable[Metric | str] = ("val_acc",),
        name: str | None = None,
        space: str | None = None,
        amp_dtype: str | None = None,
    ) -> None:
        self._module = module
        self._datamodule = datamodule
        self._ready: Any = None
        self.metrics = metrics_named(metrics, "LightningWorkload")
        self.name = name or str(getattr(module, "__name__", type(module).__name__))
        self.space = space
        self.amp_dtype = amp_dtype

    # ------------------------------------------------------------------ data

    def _data(self) -> Any:
        if self._ready is None:
            dm = self._datamodule
            if isinstance(dm, type) or not hasattr(dm, "train_dataloader"):
                dm = dm()  # a class, or a function building one
            # As Lightning's Trainer.fit: download and prepare, then load. The driver does it
            # first (the target's check reads the data); the workers get it set up, pickled.
            dm.prepare_data()
            dm.setup("fit")
            self._ready = dm
        return self._ready

    @staticmethod
    def _dataset(loader: Any, which: str) -> Dataset[Any]:
        dataset = getattr(loader, "dataset", None)
        if dataset is None:
            raise WorkloadError(f"{which}() returned no DataLoader with a dataset: {loader!r}")
        return dataset  # type: ignore[no-any-return]

    def train_dataset(self) -> Dataset[Any]:
        return self._dataset(self._data().train_dataloader(), "train_dataloader")

    def val_dataset(self) -> Dataset[Any]:
        return self._dataset(self._data().val_dataloader(), "val_dataloader")

    def collate(self) -> Callable[[list[Any]], Any] | None:
        """The training loader's ``collate_fn`` (``None`` where it is PyTorch's default)."""
        return _own_collate(self._data().train_dataloader())

    def eval_collate(self) -> Callable[[list[Any]], Any] | None:
        """The validation loader's ``collate_fn``."""
        return _own_collate(self._data().val_dataloader())

    # ------------------------------------------------------------------ model

    def build_model(self) -> nn.Module:
        module: Any = self._module()
        module.log = module.log_dict = _ignore  # no Trainer to log to
        return module  # type: ignore[no-any-return]

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        step = getattr(model, "training_step", None)
        if step is None:  # wrapped in DistributedDataParallel: a data-parallel recipe
            raise WorkloadError(
                f"{self.name}: data-parallel recipes (world_size > 1) are not searched with"
                " LightningWorkload: keep world_size [1] in the space"
            )
        out = step(batch, 0)
        if isinstance(out, Mapping):
            out = out.get("loss")
        if out is None:
            raise WorkloadError(
                f"{self.name}: training_step returned no loss (manual optimization is not searched)"
            )
        return out  # type: ignore[no-any-return]

    def evaluate(self, model: nn.Module, batches: Iterable[Any]) -> Mapping[str, float]:
        import torch

        logged = _Logged()
        module: Any = model
        saved = module.log, module.log_dict
        module.log, module.log_dict = logged.log, logged.log_dict
        try:
            with torch.no_grad():
                for i, batch in enumerate(batches):
                    logged.size = _batch_size(batch)
                    module.validation_step(batch, i)
        finally:
            module.log, module.log_dict = saved
        values = logged.values()
        missing = [m.name for m in self.metrics if m.name not in values]
        if missing:
            raise WorkloadError(
                f"{self.name}: validation_step logged {sorted(values)}, not {missing}"
            )
        return values

    def left_out(self) -> list[str]:
        """The module's LR scheduler, optimizers after the first, manual optimization and the
        ``Trainer`` hooks it overrides (:data:`HOOKS`): what a search does not run."""
        module = self.build_model()
        try:
            returned = module.configure_optimizers()  # type: ignore[operator]
        except RuntimeError:  # needs a Trainer: the search says so when it builds it
            returned = None
        return _left_out(module, returned)

    def found_recipe(self) -> FoundRecipe:
        """The recipe the module trains with: ``configure_optimizers()``'s optimizer, its
        first group's LR and the first weight decay it sets, and the batch size of the
        datamodule's ``train_dataloader()``.

        Raises:
            WorkloadError: ``configure_optimizers()`` needs a ``Trainer``, or its optimizer is
                not SGD, Adam or AdamW.
        """
        # the space's schema (pydantic) loads only where a space is written
        from raybatch.space.infer import FoundRecipe, family_of

        module = self.build_model()
        cls = type(module).__name__
        try:
            returned = module.configure_optimizers()  # type: ignore[operator]
        except RuntimeError as exc:
            raise WorkloadError(f"{self.name}: configure_optimizers() needs a Trainer ({exc})"
                                ) from exc  # fmt: skip
        optimizer = _first_optimizer(returned)
        family, kwargs = family_of(optimizer, f"{cls}.configure_optimizers()")
        groups = optimizer.param_groups
        decay = next((float(g["weight_decay"]) for g in groups if g.get("weight_decay")), 0.0)
        loader = self._data().train_dataloader()
        batch = getattr(loader, "batch_size", None)
        if not isinstance(batch, int) or batch < 1:
            raise WorkloadError(
                f"{self.name}: train_dataloader() has no batch_size (a batch sampler?): write"
                " the space's reference batch by hand"
            )
        opt, kind = f"{cls}.configure_optimizers()", type(optimizer).__name__
        sources = {
            "batch_size": f"{type(self._data()).__name__}.train_dataloader()'s batch size",
            "lr": f"{opt}: {kind}, its first group's lr",
            "weight_decay": f"{opt}: its first decayed group's" if decay
            else f"{opt}: no group decays",
            "optimizer": f"{opt}: {kind}",
        }  # fmt: skip
        return FoundRecipe(batch, float(groups[0]["lr"]), decay, family, kwargs, sources,
                           tuple(_left_out(module, returned)))  # fmt: skip

    def build_optimizer(self, model: nn.Module, config: Any) -> torch.optim.Optimizer:
        """The module's optimizer at the recipe's LR and weight decay. Parameter groups keep
        their ratios to the first group (a backbone at a tenth of the head's LR stays at a
        tenth), and a group without weight decay (biases, norms) stays without."""
        try:
            returned = model.configure_optimizers()  # type: ignore[operator]
        except RuntimeError as exc:  # e.g. self.trainer.estimated_stepping_batches
            raise WorkloadError(
                f"{self.name}: configure_optimizers() needs a Trainer ({exc}); under raybatch"
                " it must build its optimizer from the module alone (the LR schedule is the"
                " recipe's warmup)"
            ) from exc
        optimizer = _first_optimizer(returned)
        groups = optimizer.param_groups
        base_lr = float(groups[0]["lr"]) or 1.0
        decays = [float(g.get("weight_decay", 0.0)) for g in groups]
        base_wd = next((d for d in decays if d > 0), 1.0)
        for group, decay in zip(groups, decays, strict=True):
            group["lr"] = group["initial_lr"] = config.lr * float(group["lr"]) / base_lr
            if decay > 0:
                group["weight_decay"] = config.weight_decay * decay / base_wd
        return optimizer


__all__ = ["LightningWorkload"]
