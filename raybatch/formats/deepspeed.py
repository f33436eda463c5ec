"""The recipe as a DeepSpeed config (``ds_config.json``; keys of deepspeed 0.19).

``train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size ==
train_batch_size`` holds by construction (DeepSpeed asserts it at start-up). The optimizer is
the recipe's: ``AdamW``, ``SGD``, or ``Adam`` with ``adam_w_mode: false`` (DeepSpeed's ``Adam``
means AdamW unless told; raybatch's ``adam`` is the L2 one). A ``raybatch`` block, which
DeepSpeed ignores, says where the recipe came from and whether it is the measured one.

What DeepSpeed would otherwise change behind the recipe's back is set instead:

- **clipping**: ``gradient_clipping`` is the recipe's (DeepSpeed clips at 1.0 unless told);
- **precision**: a ``torch_autocast`` block with fp32 weights, as the recipe was measured, and
  no ``lower_precision_safe_modules``, so gradients are all-reduced in fp32, as under DDP;
- **warmup**: ``WarmupLR`` runs two steps behind the recipe's ramp and takes at least two
  steps, so it starts at ``2 / W`` of the LR; the steps that still differ are listed by
  :func:`warmup_deviations` and named in the ``raybatch`` block. For the exact schedule, pass
  ``lr_scheduler=best.build_scheduler`` to ``deepspeed.initialize`` and drop the block.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from raybatch.space.config import warmup_factor
from raybatch.space.rules import OptimizerFamily

if TYPE_CHECKING:
    from raybatch.space.config import TrialConfig

WRITTEN_AGAINST = "deepspeed 0.19"
_AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}


def _optimizer(c: TrialConfig) -> dict[str, Any]:
    params: dict[str, Any] = {"lr": c.lr, "weight_decay": c.weight_decay}
    for key, value in c.optimizer_kwargs.items():
        params[key] = list(value) if isinstance(value, tuple | list) else value
    if c.optimizer is OptimizerFamily.ADAMW:
        return {"type": "AdamW", "params": params}
    if c.optimizer is OptimizerFamily.ADAM:
        return {"type": "Adam", "params": {**params, "adam_w_mode": False}}
    return {"type": "SGD", "params": params}


def warmup_params(c: TrialConfig) -> dict[str, Any] | None:
    """``WarmupLR``'s params matching the recipe's warmup from the second step (None: none
    needed, or none DeepSpeed accepts: the optimizer's own LR is the recipe's after step 0)."""
    steps = c.warmup_steps
    if steps <= 2:  # W = 2 would start at 2/W = the full LR: no ramp left to configure
        return None
    return {
        "warmup_min_lr": c.lr * 2 / steps,
        "warmup_max_lr": c.lr,
        "warmup_num_steps": steps - 2,
        "warmup_type": "linear",
    }


def deepspeed_lr_factors(c: TrialConfig, steps: int) -> list[float]:
    """The LR / recipe LR at each of the first ``steps`` optimizer steps under this config,
    by ``WarmupLR``'s formula of deepspeed 0.19 (its ``warmup_num_steps`` is at least 2)."""
    params = warmup_params(c)
    if params is None:
        return [1.0] * steps
    low, high = params["warmup_min_lr"], params["warmup_max_lr"]
    n = max(2, params["warmup_num_steps"])
    out = []
    for k in range(steps):
        iteration = k - 1  # -1 at the first step: the scheduler starts there, at its minimum
        gamma = 0.0 if iteration < 0 else min(iteration / n, 1.0)
        out.append((low + (high - low) * gamma) / c.lr)
    return out


def warmup_deviations(c: TrialConfig) -> list[int]:
    """Optimizer steps whose LR under DeepSpeed differs from the recipe's."""

    horizon = c.warmup_steps + 3
    ours = deepspeed_lr_factors(c, horizon)
    return [k for k in range(horizon) if abs(ours[k] - warmup_factor(k, c.warmup_steps)) > 1e-9]


def ds_config(
    c: TrialConfig,
    amp: str | None,
    grad_clip_norm: float | None = None,
    origin: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The DeepSpeed config dict for the recipe (``amp``: the workload's autocast dtype;
    ``grad_clip_norm``: the clipping it was measured with; ``origin``: the ``raybatch`` block's
    run and measured fields)."""
    config: dict[str, Any] = {
        "train_batch_size": c.effective_batch_size,
        "train_micro_batch_size_per_gpu": c.micro_batch_size,
        "gradient_accumulation_steps": c.accumulation_steps,
        "gradient_clipping": float(grad_clip_norm or 0.0),
        "optimizer": _optimizer(c),
    }
    params = warmup_params(c)
    if params is not None:
        config["scheduler"] = {"type": "WarmupLR", "params": params}
    if amp in _AUTOCAST:
        config["torch_autocast"] = {
            "enabled": True, "dtype": _AUTOCAST[amp], "lower_precision_safe_modules": [],
        }  # fmt: skip
    deviations = warmup_deviations(c)
    notes = []
    if deviations:
        factors = deepspeed_lr_factors(c, max(deviations) + 1)
        notes.append(
            f"optimizer step(s) {deviations} run at {[round(factors[k], 4) for k in deviations]}"
            " x the LR instead of the recipe's warmup; pass lr_scheduler=best.build_scheduler"
            " to deepspeed.initialize (and drop 'scheduler') for the exact schedule"
        )
    config["raybatch"] = {**(origin or {}), "notes": notes}
    return config


def render(
    c: TrialConfig,
    amp: str | None,
    grad_clip_norm: float | None = None,
    origin: dict[str, Any] | None = None,
) -> str:
    return json.dumps(ds_config(c, amp, grad_clip_norm, origin), indent=2) + "\n"


__all__ = [
    "WRITTEN_AGAINST", "deepspeed_lr_factors", "ds_config", "render", "warmup_deviations",
    "warmup_params",
]  # fmt: skip
