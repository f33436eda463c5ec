"""The winner, exported for training code: ``best_config.yaml`` and ``raybatch.load_best``.

The file holds the derived recipe under ``config`` (the same keys as every trial's config,
see :mod:`raybatch.keys`) and where it came from under ``provenance`` (measured median time
to target and its spread, peak memory, device, versions, trial id, space and target). Training
code loads it with one call and builds the optimizer, the warmup schedule and the DataLoader
batch size from it, so no number is ever retyped:

    best = raybatch.load_best("runs/digits")          # a run directory or the file
    loader = DataLoader(train_set, **best.dataloader_kwargs())
    optimizer = best.build_optimizer(model.parameters())
    scheduler = best.build_scheduler(optimizer)
    accumulate = best.config.accumulation_steps
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from raybatch.errors import Issue, OptionError, RunDirError
from raybatch.space.config import TrialConfig, warmup_factor
from raybatch.workload import build_optimizer

if TYPE_CHECKING:
    import torch

BEST_YAML = "best_config.yaml"
BEST_JSON = "best_config.json"
FORMATS = ("yaml", "json", "env", "args")


@dataclass(frozen=True)
class BestConfig:
    """A searched recipe and its provenance, with helpers to use it."""

    config: TrialConfig
    provenance: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "provenance": self.provenance}

    def build_optimizer(self, params: Iterable[Any]) -> torch.optim.Optimizer:
        """The optimizer of the space's family with the recipe's lr and weight decay."""
        return build_optimizer(params, self.config)

    def build_scheduler(
        self, optimizer: torch.optim.Optimizer
    ) -> torch.optim.lr_scheduler.LambdaLR:
        """Linear warmup over the recipe's ``warmup_steps`` optimizer steps, then constant.

        Step it once per *optimizer* step (after each accumulation window), not per batch.
        """
        import torch

        steps = self.config.warmup_steps
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_factor(s, steps))

    def dataloader_kwargs(self) -> dict[str, Any]:
        """``DataLoader`` arguments: the per-device micro batch, and ``drop_last`` (seed 004)."""
        return {"batch_size": self.config.micro_batch_size, "drop_last": True}

    def render(self, fmt: str) -> str:
        """``yaml`` / ``json`` (recipe and provenance), ``env`` or ``args`` (recipe only)."""
        if fmt == "yaml":
            return yaml.safe_dump(self.to_dict(), sort_keys=False)
        if fmt == "json":
            return json.dumps(self.to_dict(), indent=2) + "\n"
        scalars = {k: v for k, v in self.config.to_dict().items() if not isinstance(v, dict)}
        if fmt == "env":
            return "".join(f"RAYBATCH_{k.upper()}={v}\n" for k, v in scalars.items())
        if fmt == "args":
            return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in scalars.items()) + "\n"
        raise OptionError([Issue("--format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")])


def write_best(run_dir: Path, best: BestConfig) -> None:
    (run_dir / BEST_YAML).write_text(best.render("yaml"))
    (run_dir / BEST_JSON).write_text(best.render("json"))


def load_best(path: str | Path) -> BestConfig:
    """Load ``best_config.yaml``/``.json`` from a file or a run directory.

    Raises:
        RunDirError: No best config there (the search has not finished), or it is malformed.
    """
    path = Path(path)
    if path.is_dir():
        path = path / BEST_YAML
    if not path.is_file():
        raise RunDirError(
            [Issue("best_config", "not found; has the search in this run directory finished?")],
            str(path),
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RunDirError([Issue("(yaml syntax)", str(exc))], str(path)) from None
    if not isinstance(data, dict) or "config" not in data:
        raise RunDirError([Issue("config", "missing: not a raybatch best config")], str(path))
    config = TrialConfig.from_dict(data["config"], source=str(path))
    return BestConfig(config, dict(data.get("provenance") or {}))
