"""The recipe as a DeepSpeed config (``ds_config.json``; keys of deepspeed 0.19).

``train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size ==
train_batch_size`` holds by construction (DeepSpeed asserts it at start-up). The optimizer block
is the recipe's: ``AdamW``; ``Adam`` with ``adam_w_mode: false`` (DeepSpeed's ``Adam`` means
AdamW unless told otherwise — raybatch's ``adam`` is the L2 one); ``SGD`` (DeepSpeed builds any
``torch.optim`` class it does not implement itself). The scheduler is ``WarmupLR``, linear from
0 to the recipe's LR over its warmup steps, then constant — the recipe's schedule.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from raybatch.space.rules import OptimizerFamily

if TYPE_CHECKING:
    from raybatch.space.config import TrialConfig

WRITTEN_AGAINST = "deepspeed 0.19"


def _optimizer(c: TrialConfig) -> dict[str, Any]:
    params: dict[str, Any] = {"lr": c.lr, "weight_decay": c.weight_decay}
    for key, value in c.optimizer_kwargs.items():
        params[key] = list(value) if isinstance(value, tuple | list) else value
    if c.optimizer is OptimizerFamily.ADAMW:
        return {"type": "AdamW", "params": params}
    if c.optimizer is OptimizerFamily.ADAM:
        return {"type": "Adam", "params": {**params, "adam_w_mode": False}}
    return {"type": "SGD", "params": params}


def ds_config(c: TrialConfig, amp: str | None) -> dict[str, Any]:
    """The DeepSpeed config dict for the recipe (``amp``: the workload's autocast dtype)."""
    config: dict[str, Any] = {
        "train_batch_size": c.effective_batch_size,
        "train_micro_batch_size_per_gpu": c.micro_batch_size,
        "gradient_accumulation_steps": c.accumulation_steps,
        "optimizer": _optimizer(c),
        "scheduler": {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": c.lr,
                "warmup_num_steps": c.warmup_steps,
                "warmup_type": "linear",
            },
        },
    }
    if amp == "bf16":
        config["bf16"] = {"enabled": True}
    elif amp == "fp16":
        config["fp16"] = {"enabled": True}
    return config


def render(c: TrialConfig, amp: str | None) -> str:
    return json.dumps(ds_config(c, amp), indent=2) + "\n"


__all__ = ["WRITTEN_AGAINST", "ds_config", "render"]
