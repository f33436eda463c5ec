"""A Hugging Face model with its datasets, collator and ``compute_metrics``, searched as it is.

What ``Trainer.hyperparameter_search`` takes (a ``model_init``, the datasets, a data collator
and ``compute_metrics``) is what :class:`HuggingFaceWorkload` takes, read as a
:class:`raybatch.Workload` the way the ``Trainer`` reads them:

- **model**: ``model_init()``, built fresh for every trial;
- **data**: the two datasets, batched by raybatch at each recipe's micro batch through the
  collator, without the columns ``model.forward`` does not take (``remove_unused_columns``);
- **loss**: ``model(**batch).loss``; **metrics**: ``compute_metrics`` over the whole evaluation
  set, as the ``Trainer`` calls it, and the evaluation loss;
- **optimizer**: the space's family at the recipe's LR and weight decay, with no decay on the
  parameters the ``Trainer`` exempts (biases, normalisation weights).

Left out: ``TrainingArguments`` (the recipe is the search's), the ``Trainer``'s LR schedule (the
recipe's warmup is raybatch's), callbacks, gradient clipping, label smoothing. Export the winner
with ``raybatch export RUN_DIR --format hf`` for the ``TrainingArguments`` you train with.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from raybatch.errors import WorkloadError
from raybatch.metric import Metric, metrics_named
from raybatch.workload import Workload, build_optimizer

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import Dataset

    from raybatch.space.infer import FoundRecipe

NO_DECAY = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)", re.IGNORECASE)
"""Parameter names the ``Trainer`` keeps out of weight decay (besides ``LayerNorm`` layers)."""


class _AsDict:
    """The collator, its ``BatchEncoding`` made a dict (picklable, for Ray's workers)."""

    def __init__(self, collator: Callable[[list[Any]], Any] | None) -> None:
        self.collator = collator

    def __call__(self, items: list[Any]) -> dict[str, Any]:
        if self.collator is None:
            from transformers import default_data_collator

            return dict(default_data_collator(items))
        return dict(self.collator(items))


def _decay_names(model: nn.Module) -> set[str]:
    """What the ``Trainer`` decays: every parameter outside ``LayerNorm`` layers whose name
    matches none of :data:`NO_DECAY`."""
    from torch import nn

    exempt: set[str] = set()
    for prefix, module in model.named_modules():
        if isinstance(module, nn.LayerNorm):
            exempt |= {f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters()}
    return {n for n, _ in model.named_parameters() if n not in exempt and not NO_DECAY.search(n)}


def _joined(parts: list[Any]) -> Any:
    """Per-batch arrays as one, padded with -100 along the sequence where batches were padded
    to different lengths (as the ``Trainer`` joins them for ``compute_metrics``)."""
    import numpy as np

    if all(p.ndim < 2 for p in parts) or len({p.shape[1] for p in parts}) == 1:
        return np.concatenate(parts)
    length = max(p.shape[1] for p in parts)
    padded = []
    for p in parts:
        out = np.full((p.shape[0], length, *p.shape[2:]), -100, dtype=p.dtype)
        out[:, : p.shape[1]] = p
        padded.append(out)
    return np.concatenate(padded)


class HuggingFaceWorkload(Workload):
    """A Hugging Face model and its data, searched without a rewrite.

    Args:
        model_init: Builds a freshly initialised model (``Trainer``'s ``model_init``).
        train_dataset: The training set (items the collator batches, ``labels`` among them).
        eval_dataset: The evaluation set the target is measured on.
        data_collator: Makes a batch of items (default: ``default_data_collator``).
        compute_metrics: ``EvalPrediction -> dict`` as for the ``Trainer`` (``None``: the
            evaluation loss only).
        metrics: What ``compute_metrics`` returns that a target may name, first the one a
            bare target means: a :class:`raybatch.Metric`, or a name (higher is better;
            ``loss`` in the name: lower). ``loss`` is always reported.
        name: Shown in reports.
        space: The search space this workload is usually searched with.
        amp_dtype: ``None``, ``"bf16"`` or ``"fp16"``.
    """

    def __init__(
        self,
        model_init: Callable[..., nn.Module],
        train_dataset: Dataset[Any],
        eval_dataset: Dataset[Any],
        *,
        data_collator: Callable[[list[Any]], Any] | None = None,
        compute_metrics: Callable[[Any], Mapping[str, float]] | None = None,
        metrics: Iterable[Metric | str] = ("accuracy",),
        name: str = "huggingface",
        space: str | None = None,
        amp_dtype: str | None = None,
    ) -> None:
        self._model_init = model_init
        self._train = train_dataset
        self._eval = eval_dataset
        self._collate = _AsDict(data_collator)
        self._compute_metrics = compute_metrics
        self.metrics = metrics_named(metrics, "HuggingFaceWorkload")
        self.name = name
        self.space = space
        self.amp_dtype = amp_dtype

    def build_model(self) -> nn.Module:
        takes_trial = len(inspect.signature(self._model_init).parameters) > 0
        return self._model_init(None) if takes_trial else self._model_init()

    def train_dataset(self) -> Dataset[Any]:
        return self._train

    def val_dataset(self) -> Dataset[Any]:
        return self._eval

    def collate(self) -> Callable[[list[Any]], Any]:
        return self._collate

    def _inputs(self, model: nn.Module, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The batch's columns ``model.forward`` accepts (the ``Trainer`` drops the others,
        ``remove_unused_columns``): an ``idx`` column must not reach the model."""
        params = inspect.signature(model.forward).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return dict(batch)
        return {k: v for k, v in batch.items() if k in params}

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        loss = model(**self._inputs(model, batch)).loss
        if loss is None:
            raise WorkloadError(f"{self.name}: the model returned no loss (do the batches carry"
                                " `labels`?)")  # fmt: skip
        return loss  # type: ignore[no-any-return]

    def evaluate(self, model: nn.Module, batches: Iterable[Any]) -> Mapping[str, float]:
        import numpy as np
        import torch

        logits: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        loss_sum, count = 0.0, 0
        with torch.no_grad():
            for batch in batches:
                out = model(**self._inputs(model, batch))
                size = int(batch["labels"].shape[0])
                if out.loss is not None:
                    loss_sum += float(out.loss) * size
                count += size
                logits.append(out.logits.float().cpu().numpy())
                labels.append(batch["labels"].cpu().numpy())
        values = {"loss": loss_sum / max(count, 1)}
        if self._compute_metrics is not None:
            from transformers import EvalPrediction

            found = self._compute_metrics(
                EvalPrediction(predictions=_joined(logits), label_ids=_joined(labels))
            )
            values |= {k.removeprefix("eval_"): float(v) for k, v in found.items()}
        missing = [m.name for m in self.metrics if m.name not in values]
        if missing:
            raise WorkloadError(f"{self.name}: compute_metrics returned {sorted(values)}, not"
                                f" {missing}")  # fmt: skip
        return values

    def found_recipe(self) -> FoundRecipe:
        """The recipe the ``Trainer`` trains with when ``TrainingArguments`` set none:
        ``TrainingArguments``' own defaults (per-device batch, ``learning_rate``,
        ``weight_decay``, AdamW's betas and epsilon), read from the class, since this
        workload carries no ``TrainingArguments`` of its own: put yours in the file."""
        from transformers import TrainingArguments

        # the space's schema (pydantic) loads only where a space is written
        from raybatch.space.infer import FoundRecipe, OptimizerFamily

        default: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
        said = "TrainingArguments' default: put your own"
        kwargs = {"betas": [default["adam_beta1"], default["adam_beta2"]],
                  "eps": default["adam_epsilon"]}  # fmt: skip
        return FoundRecipe(
            int(default["per_device_train_batch_size"]), float(default["learning_rate"]),
            float(default["weight_decay"]), OptimizerFamily.ADAMW, kwargs,
            {"batch_size": f"{said} per_device_train_batch_size",
             "lr": f"{said} learning_rate", "weight_decay": f"{said} weight_decay",
             "optimizer": "the Trainer's default optimizer (adamw_torch)"},
        )  # fmt: skip

    def build_optimizer(self, model: nn.Module, config: Any) -> torch.optim.Optimizer:
        decay = _decay_names(model)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        decayed = [p for n, p in named if n in decay]
        exempt = [p for n, p in named if n not in decay]
        groups: list[dict[str, Any]] = [{"params": decayed}] if decayed else []
        if exempt:
            groups.append({"params": exempt, "weight_decay": 0.0})
        return build_optimizer(groups, config)


__all__ = ["HuggingFaceWorkload"]
