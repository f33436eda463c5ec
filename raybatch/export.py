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

Frameworks read it directly (:mod:`raybatch.formats`): ``best.to_hf_training_args()``,
``best.lightning_trainer_kwargs()`` and ``best.lightning_optimizers(params)``,
``best.deepspeed_config()``, ``render("torchrun")``/``render("accelerate")``; and
``best.retarget(world_size=8)`` moves the recipe to another GPU count, saying whether it is
still the measured one.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from raybatch import keys
from raybatch.errors import (
    ConfigError,
    Issue,
    OptionError,
    RunDirError,
)
from raybatch.formats import deepspeed, hf, lightning, ray_train
from raybatch.formats.registry import format_named
from raybatch.formats.retarget import preset_deriving, retarget
from raybatch.formats.written import origin_comment
from raybatch.provenance import Provenance, RetargetVerdict
from raybatch.space.config import TrialConfig, warmup_scheduler
from raybatch.version import FORMAT_KEY, RUN_FORMAT, SAME_SINCE, check_format
from raybatch.workload import build_optimizer

if TYPE_CHECKING:
    import torch

    from raybatch.space.search_space import SearchSpace

AMP_NOT_RECORDED = (
    "this run did not record the workload's autocast: mixed precision is left off here;"
    " set bf16/fp16 if you train with autocast"
)
BEST_YAML = "best_config.yaml"
BEST_JSON = "best_config.json"


@dataclass(frozen=True)
class BestConfig:
    """A searched recipe and its provenance, with helpers to train with it.

    Attributes:
        config: The recipe (batch sizes, lr, weight decay, warmup, optimizer).
        provenance: How it was measured (time to target, device, versions, trial); a mapping
            is read by :meth:`Provenance.from_dict`, unknown fields refused.
        source: The file it was loaded from (``None``: in memory); every export names it and
            whether the recipe is the measured one, so a file found later says what it is.

    Example::

        import raybatch
        from torch.utils.data import DataLoader

        best = raybatch.load_best("runs/digits")  # a run directory or its best_config.yaml
        loader = DataLoader(train_set, **best.dataloader_kwargs())
        optimizer = best.build_optimizer(model.parameters())
        scheduler = best.build_scheduler(optimizer)  # warmup, stepped per optimizer step
        accumulate = best.config.accumulation_steps  # micro batches per optimizer step
    """

    config: TrialConfig
    provenance: Provenance = field(default_factory=Provenance)
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.provenance, Mapping):
            read = Provenance.from_dict(self.provenance, self.source or "<python>")
            object.__setattr__(self, "provenance", read)

    def to_dict(self) -> dict[str, Any]:
        return {
            FORMAT_KEY: RUN_FORMAT,
            "config": self.config.to_dict(),
            "provenance": self.provenance.to_dict(),
        }

    @property
    def grad_clip_norm(self) -> float | None:
        """The gradient clipping the recipe was measured with (``None``: unclipped)."""
        value = self.provenance.grad_clip_norm
        return float(value) if value is not None else None

    @property
    def amp_recorded(self) -> bool:
        """Whether the run recorded the workload's autocast (runs before it did, did not)."""
        return self.provenance.amp_recorded

    @property
    def amp_dtype(self) -> str | None:
        """The workload's autocast dtype as the run recorded it (``None``: fp32, or a run made
        before raybatch recorded it)."""
        value = self.provenance.amp_dtype
        return str(value) if value else None

    @property
    def measured(self) -> bool:
        """Whether this is the recipe the search measured (a retarget may have re-derived it)."""
        return self.provenance.measured

    def origin(self) -> dict[str, Any]:
        """Where the recipe came from and whether it was measured, as every export records it."""
        out: dict[str, Any] = {
            "from": self.source or "(in memory)",
            "trial_id": self.provenance.trial_id,
            "measured": self.measured,
        }
        note = self.provenance.retargeted.note if self.provenance.retargeted else None
        if note:
            out["retargeted"] = note
        return out

    def build_optimizer(self, params: Iterable[Any]) -> torch.optim.Optimizer:
        """The optimizer of the space's family with the recipe's lr and weight decay."""
        return build_optimizer(params, self.config)

    def build_scheduler(
        self, optimizer: torch.optim.Optimizer
    ) -> torch.optim.lr_scheduler.LambdaLR:
        """Linear warmup over the recipe's ``warmup_steps`` optimizer steps, then constant.

        Step it once per *optimizer* step (after each accumulation window), not per batch.
        """
        scheduler: torch.optim.lr_scheduler.LambdaLR = warmup_scheduler(
            optimizer, self.config.warmup_steps
        )
        return scheduler

    def dataloader_kwargs(self) -> dict[str, Any]:
        """``DataLoader`` arguments: the per-device micro batch, and ``drop_last`` (seed 004)."""
        return {"batch_size": self.config.micro_batch_size, "drop_last": True}

    # ------------------------------------------------------------------ frameworks

    def hf_training_args_kwargs(self) -> dict[str, Any]:
        """``transformers.TrainingArguments`` keyword arguments (:mod:`raybatch.formats.hf`).

        Raises:
            ExportError: The optimizer has no ``TrainingArguments`` equivalent.
        """

        return hf.training_args_kwargs(self.config, self.amp_dtype, self.grad_clip_norm)

    def to_hf_training_args(self, cls: Any = None, **overrides: Any) -> Any:
        """A real ``transformers.TrainingArguments`` for the recipe (``overrides`` win), or of
        ``cls``, a subclass such as TRL's ``SFTConfig``."""

        return hf.training_args(self.config, self.amp_dtype, self.grad_clip_norm, cls, **overrides)

    def lightning_trainer_kwargs(self, gpus_per_node: int | None = None) -> dict[str, Any]:
        """``lightning.Trainer`` keyword arguments (:mod:`raybatch.formats.lightning`); with
        ``gpus_per_node`` below the world size, ``devices`` per node and ``num_nodes``."""

        return lightning.trainer_kwargs(
            self.config, self.amp_dtype, self.grad_clip_norm, gpus_per_node
        )

    def lightning_optimizers(self, params: Iterable[Any]) -> dict[str, Any]:
        """What ``LightningModule.configure_optimizers`` should return for the recipe."""

        return lightning.optimizers(self.config, params)

    def deepspeed_config(self) -> dict[str, Any]:
        """A DeepSpeed config dict (:mod:`raybatch.formats.deepspeed`)."""

        return deepspeed.ds_config(self.config, self.amp_dtype, self.grad_clip_norm, self.origin())

    def measured_under(self) -> dict[str, Any]:
        """The provenance that changes training: ``grad_clip_norm`` (``None``: unclipped, as a
        search's trials train) and, where recorded, ``amp_dtype``, as their properties read
        them (what a Ray Train loop is handed)."""
        out: dict[str, Any] = {"grad_clip_norm": self.grad_clip_norm}  # None: unclipped
        if self.amp_recorded:
            out["amp_dtype"] = self.amp_dtype
        return out

    def carried(self) -> dict[str, Any]:
        """The provenance a snippet's written-out ``best`` keeps: :meth:`measured_under`, and
        the trial, the device and a retarget's verdict (so ``best.measured`` stays true to it)."""
        p = self.provenance
        kept: dict[str, Any] = {"trial_id": p.trial_id, "device": p.device}
        if p.retargeted is not None:
            kept["retargeted"] = p.retargeted.to_dict()
        return {**{k: v for k, v in kept.items() if v is not None}, **self.measured_under()}

    def measured_on_gpu(self) -> bool | None:
        """Whether the recipe was measured on a GPU (the provenance's ``device``; ``None``: not
        recorded, as in a ``BestConfig`` built in memory)."""
        device = self.provenance.device
        return None if device is None else not str(device).startswith("CPU")

    def ray_train_scaling_config(self, use_gpu: bool | None = None) -> Any:
        """A real ``ray.train.ScalingConfig`` with the placement the trials had
        (:mod:`raybatch.formats.ray_train`); ``use_gpu`` defaults to where it was measured,
        GPUs (with a warning) when that was not recorded."""
        gpu = self.measured_on_gpu() if use_gpu is None else use_gpu
        return ray_train.scaling_config(self.config, gpu)

    def ray_train_loop_config(self) -> dict[str, Any]:
        """``TorchTrainer(train_loop_config=...)``: the recipe's knobs and the whole recipe;
        :meth:`from_loop_config` turns it back into a ``BestConfig`` inside the loop."""

        return {**ray_train.loop_config(self.config, self.origin()), **self.measured_under()}

    @classmethod
    def from_loop_config(cls, config: dict[str, Any]) -> BestConfig:
        """The recipe a Ray Train loop was handed by :meth:`ray_train_loop_config`, with the
        clipping and autocast it was measured under."""
        origin = config.get("raybatch") or {}
        under: dict[str, Any] = {
            k: config[k] for k in ("grad_clip_norm", "amp_dtype") if k in config
        }
        provenance = Provenance.from_dict({**under, "trial_id": origin.get("trial_id") or None})
        if origin.get("measured") is False:  # a retargeted recipe stays marked NOT MEASURED
            verdict = RetargetVerdict(note=origin.get("retargeted"))
            provenance = replace(provenance, retargeted=verdict)
        return cls(TrialConfig.from_dict(config["recipe"]), provenance, origin.get("from"))

    def retarget(self, world_size: int, space: SearchSpace | None = None) -> BestConfig:
        """The recipe on ``world_size`` GPUs (:mod:`raybatch.formats.retarget`); its
        provenance's ``retargeted`` says whether it is still the measured recipe.

        Args:
            world_size: GPUs to train on.
            space: The space to re-derive LR and weight decay from when the effective batch
                must change; default: the preset the provenance names, if it is one.

        Raises:
            ExportError: The world size is invalid, or the recipe must be re-derived and no
                space is known.
        """

        space = space or preset_deriving(self.config, self.provenance.space)
        moved = retarget(self.config, world_size, space)
        if moved.config == self.config:
            return self
        c = self.config
        measured = {
            "micro_batch_size": c.micro_batch_size,
            "accumulation_steps": c.accumulation_steps,
            "world_size": c.world_size,
            "effective_batch_size": c.effective_batch_size,
        }
        retargeted = RetargetVerdict(world_size, moved.measured, moved.note, measured)
        provenance = replace(self.provenance, retargeted=retargeted)
        return BestConfig(moved.config, provenance, self.source)

    def render(self, fmt: str, gpus_per_node: int | None = None) -> str:
        """``yaml`` / ``json`` (recipe and provenance), ``env`` or ``args`` (recipe only), or a
        framework's: ``hf`` (a Python snippet), ``hf-json``, ``lightning`` (a snippet),
        ``deepspeed`` (``ds_config.json``), ``torchrun``, ``accelerate`` (launch lines),
        ``ray-train`` (a ``TorchTrainer`` snippet).
        ``gpus_per_node`` below the world size makes the launch lines and Lightning's
        ``Trainer`` multi-node.

        Raises:
            OptionError: An unknown format, or ``gpus_per_node`` for a format without nodes.
            ExportError: The recipe cannot be written in that format as measured.
        """

        written = format_named(fmt, gpus_per_node)
        text = written.render(self, gpus_per_node)
        if written.origin != "comment":  # the provenance or a field carries it, or no room
            return text
        if written.precision and not self.amp_recorded:
            text = f"# {AMP_NOT_RECORDED}\n{text}"
        return origin_comment(self.origin()) + text

    def write(self, path: str | Path, fmt: str = "yaml", gpus_per_node: int | None = None) -> str:
        """Write :meth:`render` to ``path`` and return the text.

        Raises:
            OptionError: ``args`` for a recipe that is not the measured one: its one line goes
                into ``$(...)``, so it has no room for the NOT MEASURED marker every written
                file carries (print it, with the note on stderr, or write ``env``/``yaml``).
        """
        if fmt == "args" and not self.measured:
            message = (
                "an args file has no room for the NOT MEASURED marker of this retargeted"
                " recipe: print it (the note goes to stderr) or write --format env or yaml"
            )
            raise OptionError([Issue("--output", message)])
        text = self.render(fmt, gpus_per_node)
        Path(path).write_text(text, encoding="utf-8")
        return text


def write_best(run_dir: Path, best: BestConfig) -> None:
    (run_dir / BEST_YAML).write_text(best.render("yaml"))
    (run_dir / BEST_JSON).write_text(best.render("json"))


TUNE_EXPERIMENT_WHY = (
    "this is a Ray Tune experiment directory (raybatch's parts in your own tune.Tuner), which"
    " records no search: no plan, no race, no target. Read its winner with"
    ' results.get_best_result(metric="objective", mode="min"); `raybatch report` and `export`'
    " read the run directory of `raybatch search`"
)


def is_tune_experiment(path: Path) -> bool:
    """Whether ``path`` holds a Ray Tune experiment (its tuner or its state files)."""
    return (path / "tuner.pkl").is_file() or any(path.glob("experiment_state-*.json"))


def load_best(path: str | Path) -> BestConfig:
    """Load ``best_config.yaml``/``.json`` from a file or a run directory.

    Raises:
        RunDirError: No best config there (the search has not finished), or it is malformed.
    """
    path = Path(path)
    if path.is_dir():
        path = path / BEST_YAML
    if not path.is_file():
        if is_tune_experiment(path.parent):
            raise RunDirError([Issue("best_config", f"not found: {TUNE_EXPERIMENT_WHY}")],
                              str(path.parent))  # fmt: skip
        finished = (path.parent / "trials.csv").is_file()  # the run's record: it has finished
        why = (
            "not found: the search in this run directory finished without a winner (no recipe"
            " reached the target; see report.html)"
            if finished
            else "not found: the search in this run directory has not finished (continue it"
            " with `raybatch resume`)"
        )
        raise RunDirError([Issue("best_config", why)], str(path))
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise RunDirError([Issue("(yaml syntax)", _damaged(exc))], str(path)) from None
    if not isinstance(data, dict) or "config" not in data:
        raise RunDirError([Issue("config", "missing: not a raybatch best config")], str(path))
    check_format(data.get(FORMAT_KEY), str(path), SAME_SINCE)
    if not isinstance(data.get("provenance") or {}, dict):
        raise RunDirError([Issue("provenance", _damaged("not a mapping"))], str(path))
    config = TrialConfig.from_dict(data["config"], source=str(path))
    try:
        provenance = Provenance.from_dict(data.get("provenance") or {}, str(path))
    except ConfigError as exc:
        raise RunDirError(exc.issues, str(path)) from None
    edited = _edited(config, path.parent)
    if edited:
        raise RunDirError(edited, str(path))
    return BestConfig(config, provenance, str(path))


EDITED = (
    "edited by hand: not the recipe the search measured; to train another recipe, derive it"
    " (raybatch space SPACE --batch ...), and to export the measured one, choose it again from"
    " trials.csv (raybatch.analyze_run)"
)


def _edited(config: TrialConfig, run_dir: Path) -> list[Issue]:
    """What in a run's best config no run measured: a value the run's space does not derive
    for its knobs, or knobs no run in ``trials.csv`` reached the target with. Empty outside a
    run directory (no ``space.yaml`` beside it: nothing to check against)."""
    # The run's space (pydantic) is read only where a run directory is exported.
    from raybatch.space.search_space import SearchSpace

    space_file = run_dir / "space.yaml"
    if not space_file.is_file():
        return []
    given = config.to_dict()
    knobs = tuple(given[k] for k in keys.RAW_KNOBS)
    try:
        derived = SearchSpace.from_yaml(space_file).derive(*knobs).to_dict()
    except (ConfigError, OSError) as exc:
        return [Issue("config", f"the run's space derives no recipe from these knobs ({exc})")]
    issues = []
    for key, want in derived.items():
        got = given.get(key)
        same = got == want or (isinstance(got, float | int) and isinstance(want, float | int)
                               and math.isclose(got, want, rel_tol=1e-6))  # fmt: skip
        if not same:
            issues.append(Issue(f"config.{key}", f"{got!r}, where the run's space derives"
                                f" {want!r} for its knobs: {EDITED}"))  # fmt: skip
    trials = run_dir / "trials.csv"
    if issues or not trials.is_file():
        return issues
    with trials.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not any(r.get(keys.STATUS) == "reached" and _same_knobs(r, knobs) for r in rows):
        why = f"no run in trials.csv reached the target with these knobs: {EDITED}"
        return [Issue("config", why)]
    return []


def _same_knobs(row: Mapping[str, str], knobs: tuple[Any, ...]) -> bool:
    """Whether a ``trials.csv`` row (text cells) ran these raw knobs (``keys.RAW_KNOBS``)."""
    try:
        return all(abs(float(row[n]) - float(k)) <= 1e-9 * max(1.0, abs(float(k)))
                   for n, k in zip(keys.RAW_KNOBS, knobs, strict=True))  # fmt: skip
    except (KeyError, TypeError, ValueError):
        return False


def _damaged(why: object) -> str:
    first = str(why).strip().splitlines()[0] if str(why).strip() else "unreadable"
    return (
        f"damaged ({first}); the run's trials.csv still holds every trial: the winner can be"
        " chosen again from it (raybatch.analyze_run)"
    )
