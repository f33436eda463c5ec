"""The recipe as Hugging Face ``TrainingArguments`` (field names of transformers 5.23).

| recipe | ``TrainingArguments`` |
| --- | --- |
| micro batch | ``per_device_train_batch_size`` |
| accumulation | ``gradient_accumulation_steps`` |
| LR, weight decay | ``learning_rate``, ``weight_decay`` |
| warmup steps, then constant | ``warmup_steps``, ``lr_scheduler_type="constant_with_warmup"`` |
| AdamW, betas, eps | ``optim="adamw_torch"``, ``adam_beta1``, ``adam_beta2``, ``adam_epsilon`` |
| SGD, momentum, nesterov, dampening | ``optim="sgd"``, ``optim_args="momentum=...,..."`` |
| drop the last partial batch | ``dataloader_drop_last=True`` |
| the workload's autocast | ``bf16`` / ``fp16`` |
| the clipping it was measured with | ``max_grad_norm`` (0.0: none; the Trainer's default is 1.0) |

Not mapped, and said so: plain Adam with weight decay (an L2 penalty; every Adam the Trainer
offers decouples weight decay) is an :class:`~raybatch.errors.ExportError`; the world size is
the number of processes the script is launched with (``torchrun``/``accelerate``), not an
argument. Two documented differences remain, stated in the snippet: the Trainer exempts biases
and normalisation weights from weight decay (raybatch's loop decays every parameter), and its
warmup ramp starts one step earlier (``step / warmup`` rather than ``(step + 1) / warmup``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raybatch.errors import ExportError, Issue
from raybatch.space.rules import OptimizerFamily

if TYPE_CHECKING:
    from raybatch.space.config import TrialConfig

WRITTEN_AGAINST = "transformers 5.23"
_ADAM_KEYS = {"betas", "eps"}
_SGD_KEYS = {"momentum", "nesterov", "dampening"}


def _unmapped(keys: set[str], family: str) -> None:
    if keys:
        raise ExportError(
            [
                Issue(
                    "optimizer_kwargs",
                    f"{', '.join(sorted(keys))} of {family} have no TrainingArguments field"
                    f" ({WRITTEN_AGAINST}); build the optimizer with best.build_optimizer() and"
                    " pass Trainer(optimizers=(optimizer, scheduler))",
                )
            ]
        )


def _optimizer_args(c: TrialConfig) -> dict[str, Any]:
    kwargs = dict(c.optimizer_kwargs)
    family = c.optimizer
    if family is OptimizerFamily.ADAM and c.weight_decay != 0:
        raise ExportError(
            [
                Issue(
                    "optimizer",
                    "adam with weight decay is an L2 penalty, and every Adam TrainingArguments"
                    f" offers ({WRITTEN_AGAINST}) decouples weight decay; pass"
                    " Trainer(optimizers=(best.build_optimizer(model.parameters()),"
                    " best.build_scheduler(optimizer)))",
                )
            ]
        )
    if family in (OptimizerFamily.ADAMW, OptimizerFamily.ADAM):  # Adam without decay is AdamW
        _unmapped(set(kwargs) - _ADAM_KEYS, family.value)
        beta1, beta2 = kwargs.get("betas", (0.9, 0.999))  # torch's defaults
        return {
            "optim": "adamw_torch",
            "adam_beta1": float(beta1),
            "adam_beta2": float(beta2),
            "adam_epsilon": float(kwargs.get("eps", 1e-8)),
        }
    _unmapped(set(kwargs) - _SGD_KEYS, family.value)
    out: dict[str, Any] = {"optim": "sgd"}
    if kwargs:
        out["optim_args"] = ",".join(f"{k}={kwargs[k]}" for k in sorted(kwargs))
    return out


def training_args_kwargs(
    c: TrialConfig, amp: str | None, grad_clip_norm: float | None = None
) -> dict[str, Any]:
    """Keyword arguments for ``transformers.TrainingArguments`` (add ``output_dir``); ``amp``
    is the workload's autocast dtype (``bf16``, ``fp16`` or ``None``), ``grad_clip_norm`` the
    clipping the recipe was measured with (``None``: unclipped, ``max_grad_norm=0.0``)."""
    return {
        "per_device_train_batch_size": c.micro_batch_size,
        "gradient_accumulation_steps": c.accumulation_steps,
        "learning_rate": c.lr,
        "weight_decay": c.weight_decay,
        "warmup_steps": c.warmup_steps,
        "lr_scheduler_type": "constant_with_warmup",
        **_optimizer_args(c),
        "dataloader_drop_last": True,
        "bf16": amp == "bf16",
        "fp16": amp == "fp16",
        "max_grad_norm": float(grad_clip_norm or 0.0),
    }


def training_args(
    c: TrialConfig,
    amp: str | None,
    grad_clip_norm: float | None = None,
    cls: Any = None,
    **overrides: Any,
) -> Any:
    """A real ``transformers.TrainingArguments`` (``output_dir`` defaults to ``"out"``), or of
    ``cls``, a subclass of it (TRL's ``SFTConfig``, for one).

    Raises:
        ExportError: transformers is not installed (raybatch does not depend on it).
    """
    try:
        from transformers import TrainingArguments
    except ImportError:
        raise ExportError(
            [Issue("transformers", "not installed: pip install transformers")]
        ) from None

    kwargs = training_args_kwargs(c, amp, grad_clip_norm)
    return (cls or TrainingArguments)(**{"output_dir": "out", **kwargs, **overrides})


def snippet(c: TrialConfig, amp: str | None, grad_clip_norm: float | None = None) -> str:
    """A complete Python snippet building the ``TrainingArguments``."""
    kwargs = training_args_kwargs(c, amp, grad_clip_norm)
    body = "".join(f"    {k}={v!r},\n" for k, v in kwargs.items())
    return "\n".join(
        [
            f"# raybatch winner as TrainingArguments ({WRITTEN_AGAINST}).",
            f"# Launch on {c.world_size} process(es) (torchrun --nproc-per-node {c.world_size};"
            " several nodes: raybatch export --format torchrun --gpus-per-node G):"
            f" the effective batch {c.effective_batch_size} counts every process.",
            "# Differences the Trainer keeps: no weight decay on biases and norm weights; warmup"
            " ramps as step / warmup_steps.",
            "# Keep auto_find_batch_size off: it would shrink the micro batch, and the effective"
            " batch with it, behind the recipe's back.",
            "from transformers import TrainingArguments",
            "",
            "args = TrainingArguments(",
            '    output_dir="out",',
            body.rstrip("\n"),
            ")",
            "",
        ]
    )


__all__ = ["WRITTEN_AGAINST", "snippet", "training_args", "training_args_kwargs"]
