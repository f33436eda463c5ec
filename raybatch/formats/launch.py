"""Launch lines: ``torchrun`` and ``accelerate launch`` with the recipe's arguments.

``torchrun --nproc-per-node W train.py --micro-batch-size ... --lr ...`` (torch 2.x's
``torchrun`` flags); ``accelerate launch --multi_gpu --num_processes W --mixed_precision bf16
train.py ...`` (accelerate 1.x's ``launch`` flags). The script reads the recipe's values from
its own arguments (``raybatch export --format args``'s names: every scalar of the recipe, and
``--optimizer-kwargs`` as JSON) with :func:`recipe_from_args`, or loads ``best_config.yaml``
with ``raybatch.load_best``.

On several nodes (``gpus_per_node`` below the world size): ``torchrun --nnodes N
--nproc-per-node G --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500``, and ``accelerate
launch --num_machines N --num_processes W --machine_rank $MACHINE_RANK --main_process_ip
$MASTER_ADDR --main_process_port 29500`` (accelerate counts processes over all machines), the
same line run on every node with its own ``MACHINE_RANK``.

Every value is shell-quoted. ``accelerate launch --gradient_accumulation_steps`` is not used:
outside DeepSpeed, accelerate 1.x passes it to nothing, so the script must hand its own
``--accumulation-steps`` to ``Accelerator(gradient_accumulation_steps=...)`` (the line's
comment says so); ``--multi_gpu`` is given for more than one process, since without it an
existing default ``accelerate config`` can collapse the launch to a single process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from collections.abc import Sequence

from raybatch.errors import ConfigError, ExportError, Issue
from raybatch.space.config import TrialConfig

WRITTEN_AGAINST = "torch 2.x torchrun, accelerate 1.x"
PORT = 29500


def nodes(world_size: int, gpus_per_node: int | None) -> tuple[int, int]:
    """``(nodes, processes per node)`` for ``world_size`` processes, ``gpus_per_node`` each.

    Raises:
        ExportError: ``gpus_per_node`` is not a positive integer dividing the world size.
    """
    if gpus_per_node is None or gpus_per_node >= world_size:
        return 1, world_size
    if gpus_per_node < 1 or world_size % gpus_per_node:
        message = f"must be a positive divisor of the world size {world_size}, got {gpus_per_node}"
        raise ExportError([Issue("--gpus-per-node", message)])
    return world_size // gpus_per_node, gpus_per_node


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


def _every_node(count: int) -> str:
    if count == 1:
        return ""
    return (
        f"# run on each of the {count} nodes: MASTER_ADDR is the first node's address,"
        f" MACHINE_RANK 0..{count - 1}\n"
    )


def torchrun(c: TrialConfig, script: str = "train.py", gpus_per_node: int | None = None) -> str:
    count, per_node = nodes(c.world_size, gpus_per_node)
    where = (
        f"--nnodes {count} --nproc-per-node {per_node} --rdzv-backend c10d"
        f' --rdzv-endpoint "$MASTER_ADDR:{PORT}" --rdzv-id raybatch'
        if count > 1 else f"--nproc-per-node {per_node}"
    )  # fmt: skip
    return f"{_head(c)}{_every_node(count)}torchrun {where} {script} {script_args(c)}\n"


def accelerate(
    c: TrialConfig, amp: str | None, script: str = "train.py", gpus_per_node: int | None = None
) -> str:
    count, _ = nodes(c.world_size, gpus_per_node)
    precision = {"bf16": "bf16", "fp16": "fp16"}.get(amp or "", "no")
    multi = "--multi_gpu " if c.world_size > 1 else ""
    machines = (
        f"--num_machines {count} --machine_rank \"$MACHINE_RANK\" --main_process_ip"
        f' "$MASTER_ADDR" --main_process_port {PORT} '
        if count > 1 else ""
    )  # fmt: skip
    return (
        f"{_head(c)}{_every_node(count)}"
        "# accumulation: Accelerator(gradient_accumulation_steps=args.accumulation_steps) in"
        " the script (accelerate launch's own flag reaches only DeepSpeed)\n"
        f"accelerate launch {multi}{machines}--num_processes {c.world_size}"
        f" --mixed_precision {precision} {script} {script_args(c)}\n"
    )


_TEXT_FIELDS = ("str", "ScalingRule", "OptimizerFamily")
"""Recipe fields whose value is the flag's text as written (the rest are JSON: numbers and
the optimizer's keyword arguments)."""


def recipe_from_args(argv: Sequence[str] | None = None) -> tuple[TrialConfig, list[str]]:
    """The recipe a launch line (``--format torchrun``/``accelerate``/``args``) passed to the
    training script, read back from its arguments; and the arguments that are not the
    recipe's, for the script's own parser.

    Args:
        argv: The script's arguments (default: ``sys.argv[1:]``).

    Raises:
        ConfigError: A recipe flag is missing, or its value is not of its kind, naming the flag.

    Example:
        >>> from raybatch.formats.launch import recipe_from_args
        >>> recipe, rest = recipe_from_args()          # in train.py, under torchrun
        >>> loader = DataLoader(train_set, batch_size=recipe.micro_batch_size, shuffle=True)
    """
    fields = dataclasses.fields(TrialConfig)
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for f in fields:
        parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name)
    known, rest = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    values: dict[str, object] = {}
    issues: list[Issue] = []
    for f in fields:
        text = getattr(known, f.name)
        if text is None:
            continue
        if str(f.type) in _TEXT_FIELDS:
            values[f.name] = text
            continue
        try:
            values[f.name] = json.loads(text)
        except json.JSONDecodeError:
            issues.append(Issue(f"--{f.name.replace('_', '-')}", f"not a value: {text!r}"))
    if issues:
        raise ConfigError(issues, "the script's arguments")
    try:
        return TrialConfig.from_dict(values, "the script's arguments"), rest
    except ConfigError as exc:  # name the flags, as the user wrote them, not the keys
        flags = [Issue(f"--{i.field.replace('_', '-')}", i.message) for i in exc.issues]
        raise ConfigError(flags, "the script's arguments") from exc


__all__ = [
    "PORT", "WRITTEN_AGAINST", "accelerate", "nodes", "recipe_from_args", "script_args",
    "torchrun",
]  # fmt: skip
