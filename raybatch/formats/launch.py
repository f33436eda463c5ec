"""Launch lines: ``torchrun`` and ``accelerate launch`` with the recipe's arguments.

``torchrun --nproc-per-node W train.py --micro-batch-size ... --lr ...`` (torch 2.x's
``torchrun`` flags); ``accelerate launch --multi_gpu --num_processes W --mixed_precision bf16
train.py ...`` (accelerate 1.x's ``launch`` flags). The script reads the recipe's values from
its own arguments (``raybatch export --format args``'s names: every scalar of the recipe, and
``--optimizer-kwargs`` as JSON), or loads ``best_config.yaml`` with ``raybatch.load_best``.

Every value is shell-quoted. ``accelerate launch --gradient_accumulation_steps`` is not used:
outside DeepSpeed, accelerate 1.x passes it to nothing, so the script must hand its own
``--accumulation-steps`` to ``Accelerator(gradient_accumulation_steps=...)`` (the line's
comment says so); ``--multi_gpu`` is given for more than one process, since without it an
existing default ``accelerate config`` can collapse the launch to a single process.
"""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raybatch.space.config import TrialConfig

WRITTEN_AGAINST = "torch 2.x torchrun, accelerate 1.x"


def script_args(c: TrialConfig) -> str:
    """``--key value`` for every scalar of the recipe and ``--optimizer-kwargs`` (JSON), each
    value shell-quoted."""
    parts = []
    for key, value in c.to_dict().items():
        text = json.dumps(value) if isinstance(value, dict) else str(value)
        parts.append(f"--{key.replace('_', '-')} {shlex.quote(text)}")
    return " ".join(parts)


def _head(c: TrialConfig) -> str:
    return (
        f"# raybatch winner: {c.world_size} process(es), micro batch {c.micro_batch_size} x"
        f" accumulation {c.accumulation_steps} x {c.world_size} = effective batch"
        f" {c.effective_batch_size}\n"
    )


def torchrun(c: TrialConfig, script: str = "train.py") -> str:
    return f"{_head(c)}torchrun --nproc-per-node {c.world_size} {script} {script_args(c)}\n"


def accelerate(c: TrialConfig, amp: str | None, script: str = "train.py") -> str:
    precision = {"bf16": "bf16", "fp16": "fp16"}.get(amp or "", "no")
    multi = "--multi_gpu " if c.world_size > 1 else ""
    return (
        f"{_head(c)}"
        "# accumulation: Accelerator(gradient_accumulation_steps=args.accumulation_steps) in"
        " the script (accelerate launch's own flag reaches only DeepSpeed)\n"
        f"accelerate launch {multi}--num_processes {c.world_size} --mixed_precision {precision}"
        f" {script} {script_args(c)}\n"
    )


__all__ = ["WRITTEN_AGAINST", "accelerate", "script_args", "torchrun"]
