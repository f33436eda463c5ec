"""Every format the winner is written in, in one list.

``raybatch export --format`` (its choices and help) and
:meth:`raybatch.export.BestConfig.render` read :data:`FORMATS`: a format is one
:class:`Format` entry, with what it is for, whether ``--gpus-per-node`` shapes it, where it
says which recipe it carries, and how it is rendered. A new format is a new entry here (and its
module in :mod:`raybatch.formats`), nothing else.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import yaml

from raybatch.errors import Issue, OptionError
from raybatch.formats import deepspeed, hf, launch, lightning, ray_train

if TYPE_CHECKING:
    from raybatch.space.config import TrialConfig

Origin = Literal["comment", "inside", "none"]


class Winner(Protocol):
    """What a format reads of the winner (:class:`raybatch.export.BestConfig`, which the
    exports sit above: this list does not import it)."""

    @property
    def config(self) -> TrialConfig: ...
    @property
    def source(self) -> str | None: ...
    @property
    def amp_dtype(self) -> str | None: ...
    @property
    def grad_clip_norm(self) -> float | None: ...
    def to_dict(self) -> dict[str, Any]: ...
    def origin(self) -> dict[str, Any]: ...
    def carried(self) -> dict[str, Any]: ...
    def measured_on_gpu(self) -> bool | None: ...
    def hf_training_args_kwargs(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Format:
    """One way to write the winner.

    Attributes:
        name: What ``--format`` takes.
        what: One line for ``--help``.
        render: The text, from the winner and ``--gpus-per-node`` (``None``: one node).
        nodes: ``--gpus-per-node`` shapes it (multi-node launch lines, Lightning's Trainer);
            given for any other format it is refused, never dropped silently.
        origin: Where the text says which recipe it is and whether it was measured:
            ``comment`` lines (``#``) before it, ``inside`` it (the provenance, or a field:
            JSON has no comments), or ``none`` (``args``: one line for ``$(...)``).
        precision: It sets mixed precision, so a run that did not record the workload's
            autocast is said (in a comment, or on stderr where the format has none).
    """

    name: str
    what: str
    render: Callable[[Winner, int | None], str]
    nodes: bool = False
    origin: Origin = "comment"
    precision: bool = False


def _env(best: Winner, gpus_per_node: int | None) -> str:
    recipe = best.config.to_dict()
    values = {k: json.dumps(v) if isinstance(v, dict) else str(v) for k, v in recipe.items()}
    return "".join(f"RAYBATCH_{k.upper()}={shlex.quote(v)}\n" for k, v in values.items())


def _hf_json(best: Winner, gpus_per_node: int | None) -> str:
    fields = {**best.hf_training_args_kwargs(), "raybatch": best.origin()}
    return json.dumps(fields, indent=2) + "\n"


FORMATS: tuple[Format, ...] = (
    Format("yaml", "the recipe and its provenance (best_config.yaml)",
           lambda b, n: yaml.safe_dump(b.to_dict(), sort_keys=False), origin="inside"),
    Format("json", "the same, as JSON", lambda b, n: json.dumps(b.to_dict(), indent=2) + "\n",
           origin="inside"),
    Format("env", "RAYBATCH_* environment variables", _env),
    Format("args", "the recipe as command-line flags, one line for $(...)",
           lambda b, n: launch.script_args(b.config) + "\n", origin="none"),
    Format("hf", "transformers.TrainingArguments, a Python snippet",
           lambda b, n: hf.snippet(b.config, b.amp_dtype, b.grad_clip_norm), precision=True),
    Format("hf-json", "TrainingArguments fields as JSON", _hf_json, origin="inside",
           precision=True),
    Format("lightning", "a lightning.Trainer and configure_optimizers snippet",
           lambda b, n: lightning.snippet(b.config, b.carried(), b.source, n), nodes=True,
           precision=True),
    Format("deepspeed", "ds_config.json",
           lambda b, n: deepspeed.render(b.config, b.amp_dtype, b.grad_clip_norm, b.origin()),
           origin="inside", precision=True),
    Format("torchrun", "a torchrun launch line",
           lambda b, n: launch.torchrun(b.config, gpus_per_node=n), nodes=True),
    Format("accelerate", "an accelerate launch line",
           lambda b, n: launch.accelerate(b.config, b.amp_dtype, gpus_per_node=n), nodes=True,
           precision=True),
    Format("ray-train", "a ray.train TorchTrainer snippet",
           lambda b, n: ray_train.snippet(b.config, b.measured_on_gpu(), b.carried(), b.source),
           precision=True),
)  # fmt: skip
"""Every format, in the order ``--help`` lists them."""

_BY_NAME = {f.name: f for f in FORMATS}


def format_named(name: str, gpus_per_node: int | None = None) -> Format:
    """The format ``name``, checked with ``--gpus-per-node``.

    Raises:
        OptionError: An unknown name, or ``gpus_per_node`` for a format without nodes.
    """
    found = _BY_NAME.get(name)
    if found is None:
        message = f"must be one of {', '.join(_BY_NAME)}, got {name!r}"
        raise OptionError([Issue("--format", message)])
    if gpus_per_node is not None and not found.nodes:
        where = ", ".join(f.name for f in FORMATS if f.nodes)
        raise OptionError([Issue("--gpus-per-node", f"applies to {where}; not to {name!r}")])
    return found


def formats_help() -> str:
    """``--format``'s help: every name, with what it is for."""
    return "; ".join(f"{f.name}: {f.what}" for f in FORMATS) + "."


__all__ = ["FORMATS", "Format", "format_named", "formats_help"]
