"""Launch lines: ``torchrun`` and ``accelerate launch`` with the recipe's arguments.

``torchrun --nproc-per-node W train.py --micro-batch-size ... --lr ...`` (torch 2.x's
``torchrun`` flags); ``accelerate launch --num_processes W --gradient_accumulation_steps A
--mixed_precision bf16 train.py ...`` (accelerate 1.x's ``launch`` flags). The script reads the
recipe's values from its own arguments (``raybatch export --format args``'s names), or loads
``best_config.yaml`` with ``raybatch.load_best``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raybatch.space.config import TrialConfig

WRITTEN_AGAINST = "torch 2.x torchrun, accelerate 1.x"


def script_args(c: TrialConfig) -> str:
    """``--key value`` for every scalar of the recipe."""
    scalars = {k: v for k, v in c.to_dict().items() if not isinstance(v, dict)}
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in scalars.items())


def torchrun(c: TrialConfig, script: str = "train.py") -> str:
    return (
        f"# raybatch winner: {c.world_size} process(es), effective batch"
        f" {c.effective_batch_size}\n"
        f"torchrun --nproc-per-node {c.world_size} {script} {script_args(c)}\n"
    )


def accelerate(c: TrialConfig, amp: str | None, script: str = "train.py") -> str:
    precision = {"bf16": "bf16", "fp16": "fp16"}.get(amp or "", "no")
    return (
        f"# raybatch winner: {c.world_size} process(es), effective batch"
        f" {c.effective_batch_size}\n"
        f"accelerate launch --num_processes {c.world_size} --gradient_accumulation_steps"
        f" {c.accumulation_steps} --mixed_precision {precision} {script} {script_args(c)}\n"
    )


__all__ = ["WRITTEN_AGAINST", "accelerate", "script_args", "torchrun"]
