"""A space file written from the user's own training code (``raybatch init-space``).

A space's reference is the recipe the user already trains with: its batch size, optimizer, LR
and weight decay. A LightningModule says them itself (``configure_optimizers()``, the
datamodule's ``train_dataloader()``); a Hugging Face model trains with ``TrainingArguments``,
whose defaults stand in where the workload carries none. :class:`FoundRecipe` is what the
workload says, each value with where it came from; :func:`space_yaml` writes the space around
it, with those sources as comments, so that the file says where each number came from and the
user can correct one before a search rather than after.

The rest follows the design's rules: the LR grows linearly with the batch for SGD and with its
square root for Adam-family optimizers (Malladi et al. 2022), weight decay with the square
root; micro batches from an eighth of the reference to sixteen times it (the pre-screen drops
what does not fit); accumulation up to 4; the LR multiplier searched from 0.25x to 8x of the
rule's (the rule is the centre, not a cage).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from raybatch.errors import Issue, OptionError, WorkloadError
from raybatch.space.rules import OptimizerFamily
from raybatch.space.search_space import SearchSpace

KWARGS = {
    OptimizerFamily.SGD: ("momentum", "nesterov", "dampening"),
    OptimizerFamily.ADAM: ("betas", "eps", "amsgrad"),
    OptimizerFamily.ADAMW: ("betas", "eps", "amsgrad"),
}
"""The optimizer's own arguments a space keeps (``optimizer_kwargs``), by family."""


@dataclass(frozen=True)
class FoundRecipe:
    """The recipe a workload's own code trains with, each value with where it came from.

    Attributes:
        batch_size: Per step, as its training loader batches.
        lr: The first parameter group's learning rate.
        weight_decay: The first decayed group's weight decay (0: none).
        optimizer: Its family.
        optimizer_kwargs: Its own arguments that a space keeps (momentum, betas...).
        sources: Field -> where its value came from (said in the file's comments).
        left_out: What the code does that a search does not (its LR scheduler, its hooks).
    """

    batch_size: int
    lr: float
    weight_decay: float
    optimizer: OptimizerFamily
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    left_out: tuple[str, ...] = ()


def family_of(optimizer: Any, who: str) -> tuple[OptimizerFamily, dict[str, Any]]:
    """A ``torch.optim`` optimizer's family and the arguments a space keeps.

    Raises:
        WorkloadError: An optimizer of another family (a space names SGD, Adam or AdamW).
    """
    import torch

    for kind, family in ((torch.optim.AdamW, OptimizerFamily.ADAMW),
                         (torch.optim.Adam, OptimizerFamily.ADAM),
                         (torch.optim.SGD, OptimizerFamily.SGD)):  # fmt: skip
        if isinstance(optimizer, kind):
            defaults = optimizer.defaults
            kept = {k: _plain(defaults[k]) for k in KWARGS[family] if k in defaults}
            return family, kept
    raise WorkloadError(
        f"{who} trains with {type(optimizer).__name__}; a space names sgd, adam or adamw:"
        " write its space by hand (`raybatch spaces` lists presets to start from)"
    )


class _OwnCode(Protocol):
    """What :func:`not_searched` reads of a :class:`raybatch.workload.Workload`."""

    def left_out(self) -> list[str]: ...

    def found_recipe(self) -> FoundRecipe | None: ...


def not_searched(workload: _OwnCode, space: SearchSpace) -> list[str]:
    """What the workload's own code does that the trials will not: its hooks and its LR
    scheduler (:meth:`~raybatch.workload.Workload.left_out`), and an optimizer other than the
    space's. The search trains every recipe with the space's (``reference.optimizer`` and
    ``optimizer_kwargs``), so a recipe it finds is that optimizer's: a Lightning module's
    ``configure_optimizers()`` is read for ``raybatch init-space``, not run. Said as the
    search starts."""
    said = list(workload.left_out())
    try:
        found = workload.found_recipe()  # None: a workload of raybatch's own (its space)
    except WorkloadError:  # its optimizer needs a Trainer, or is of no family a space names
        found = None
    if found is None:
        return said
    ref = space.reference
    where = found.sources.get("optimizer", "the workload's own code")
    if found.optimizer is not ref.optimizer:
        return [*said, f"{where}: the search trains with the space's reference.optimizer"
                f" ({ref.optimizer.value}) instead"]  # fmt: skip
    return said + [
        f"{where} sets {key}={_plain(value)}: the search trains with the space's"
        f" reference.optimizer_kwargs.{key}={_plain(ref.optimizer_kwargs[key])} instead"
        for key, value in found.optimizer_kwargs.items()
        if key in ref.optimizer_kwargs and _plain(ref.optimizer_kwargs[key]) != _plain(value)
    ]


def _plain(value: Any) -> Any:
    """A value as YAML writes it (a tuple of betas as a list)."""
    return list(value) if isinstance(value, tuple) else value


def micro_batches(reference: int) -> list[int]:
    """Powers of two from an eighth of the reference batch to sixteen times it."""
    low = max(1, 2 ** math.floor(math.log2(max(reference / 8, 1))))
    high = 2 ** math.ceil(math.log2(reference * 16))
    out, size = [], low
    while size <= high:
        out.append(size)
        size *= 2
    return out


def space_yaml(found: FoundRecipe, name: str, description: str) -> str:
    """The space file's text around ``found``, each found value's source in a comment."""
    said = found.sources
    linear = found.optimizer is OptimizerFamily.SGD
    rule = "linear" if linear else "sqrt"
    why = ("SGD: lr grows linearly with the batch (Goyal et al. 2017)" if linear
           else "Adam-family: lr grows with sqrt(batch) (Malladi et al. 2022)")  # fmt: skip
    lines = [
        f"# The batch recipes raybatch searches for {name}, written by `raybatch init-space`",
        "# from the training code itself: the reference is the recipe it trains with now; the",
        "# rules carry it to every other effective batch. Correct any value before searching.",
    ]
    lines += [f"# Not used by a search: {item}" for item in found.left_out]
    lines += [f"name: {json.dumps(name)}", f"description: {json.dumps(description)}",
              "reference:"]  # fmt: skip
    for key, value in (("batch_size", str(found.batch_size)), ("lr", yaml_float(found.lr)),
                       ("weight_decay", yaml_float(found.weight_decay)),
                       ("optimizer", found.optimizer.value)):  # fmt: skip
        source = said.get(key)
        lines.append(f"  {key}: {value}" + (f"  # {source}" if source else ""))
    if found.optimizer_kwargs:
        lines.append("  optimizer_kwargs:")
        lines += [f"    {k}: {_yaml_value(v)}" for k, v in found.optimizer_kwargs.items()]
    lines += [
        "rules:",
        f"  lr: {rule}  # {why}",
        "  weight_decay: sqrt",
        "search:",
        f"  micro_batch_size: {micro_batches(found.batch_size)}",
        "  accumulation_steps: [1, 2, 4]",
        "  world_size: [1]  # the adapters search on one device",
        "  lr_multiplier: {low: 0.25, high: 8.0}  # the rule is the centre, not a cage",
        "warmup:",
        "  samples_per_scale: 2048  # warm up over this many samples per unit of LR scale",
    ]
    return "\n".join(lines) + "\n"


def refuse_existing(path: Path) -> None:
    """A space is never written over a file.

    Raises:
        OptionError: ``path`` exists.
    """
    if path.exists():
        raise OptionError([Issue("(file)", "exists; choose another name (--out)")], str(path))


def write_space(found: FoundRecipe | None, name: str, path: Path) -> Path:
    """Write the space of a workload's own recipe (:meth:`raybatch.Workload.found_recipe`) at
    ``path``, never over a file, checked first by reading it as a search will.

    Raises:
        WorkloadError: ``found`` is ``None``: a workload of raybatch's own, whose recipe is its
            space already.
        OptionError: ``path`` exists.
    """
    if found is None:
        raise WorkloadError(
            f"{name} is a workload of raybatch's own: its recipe is its space; start from a"
            " preset (`raybatch spaces`) or `raybatch init-workload`"
        )
    refuse_existing(path)
    rule = "linear" if found.optimizer is OptimizerFamily.SGD else "sqrt"
    text = space_yaml(found, name, f"{name}: the recipe its own code trains with"
                      f" ({found.optimizer.value}), {rule} rules")  # fmt: skip
    SearchSpace.from_dict(yaml.safe_load(text), str(path))  # as a search will read it
    path.write_text(text)
    return path


def _yaml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    return yaml_float(value) if isinstance(value, float) else str(value)


def yaml_float(value: float) -> str:
    """A float as YAML reads it back as one: ``5e-05`` is a string to YAML 1.1 (PyYAML), whose
    exponent form needs a point (``5.0e-05``)."""
    text = f"{value:.6g}"
    if "e" in text and "." not in text.split("e")[0]:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    return text


__all__ = [
    "KWARGS",
    "FoundRecipe",
    "OptimizerFamily",
    "family_of",
    "micro_batches",
    "not_searched",
    "space_yaml",
    "write_space",
    "yaml_float",
]
