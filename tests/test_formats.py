"""The winner in the trainers' own terms, round-tripped through the real libraries (CPU), and
moved to other GPU counts."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import raybatch
from raybatch import BestConfig, SearchSpace
from raybatch.errors import ExportError
from raybatch.formats.retarget import retarget

from .conftest import run_cli

ADAMW = raybatch.load_space("generic_adamw")
SGD = raybatch.load_space("digits_cnn_sgd")


def _best(space: SearchSpace, *knobs: int, amp: str | None = None) -> BestConfig:
    provenance = {"space": space.name, "amp_dtype": amp, "device": "CPU (test)"}
    return BestConfig(space.derive(*knobs), provenance)


class Tiny(nn.Module):
    """A model the HF Trainer drives: keyword inputs in, ``{"loss": ...}`` out; with a bias
    and a LayerNorm, which the Trainer exempts from weight decay."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.norm = nn.LayerNorm(2)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.cross_entropy(self.norm(self.linear(x)), labels)}


def _rows(n: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return [{"x": x[i], "labels": (x[i, 0] > 0).long()} for i in range(n)]


def _decay_group(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return max(optimizer.param_groups, key=lambda g: g["weight_decay"])


def test_hf_training_args_train_with_the_recipes_lr_and_weight_decay(tmp_path: Path) -> None:
    from transformers import Trainer

    best = _best(ADAMW, 16, 2)
    args = best.to_hf_training_args(
        output_dir=str(tmp_path), max_steps=3, report_to=[], use_cpu=True, save_strategy="no"
    )
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (16, 2)
    assert (args.warmup_steps, args.lr_scheduler_type.value) == (
        best.config.warmup_steps,
        "constant_with_warmup",
    )
    trainer = Trainer(model=Tiny(), args=args, train_dataset=_rows(160))
    trainer.train()
    assert trainer.state.global_step == 3
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's wrap
    assert isinstance(optimizer, torch.optim.AdamW)
    group = _decay_group(optimizer)
    assert group["initial_lr"] == pytest.approx(best.config.lr)
    assert group["weight_decay"] == pytest.approx(best.config.weight_decay)
    assert group["betas"] == tuple(best.config.optimizer_kwargs["betas"])
    assert group["eps"] == best.config.optimizer_kwargs["eps"]


def test_hf_sgd_keeps_its_momentum_and_the_json_form_builds_the_same_args(
    tmp_path: Path,
) -> None:
    from transformers import HfArgumentParser, Trainer, TrainingArguments

    best = _best(SGD, 64, 1)
    (tmp_path / "args.json").write_text(best.render("hf-json"))
    parser = HfArgumentParser(TrainingArguments)  # docs/exports.md's way to read the file
    [parsed] = parser.parse_json_file(tmp_path / "args.json", allow_extra_keys=True)
    assert parsed.learning_rate == pytest.approx(best.config.lr) and parsed.max_grad_norm == 0.0
    kwargs = json.loads(best.render("hf-json"))
    assert kwargs.pop("raybatch")["measured"] is True  # where it came from, not an argument
    assert kwargs["optim"] == "sgd" and kwargs["optim_args"] == "momentum=0.9"
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, **kwargs)
    trainer = Trainer(model=Tiny(), args=args, train_dataset=_rows(8))
    optimizer = trainer.create_optimizer()
    assert isinstance(optimizer, torch.optim.SGD)
    group = _decay_group(optimizer)
    assert (group["lr"], group["momentum"]) == (pytest.approx(best.config.lr), 0.9)
    assert group["weight_decay"] == pytest.approx(best.config.weight_decay)
    snippet = best.render("hf")
    assert "from transformers import TrainingArguments" in snippet and "optim='sgd'" in snippet
    compile(snippet, "<hf snippet>", "exec")  # a complete, valid Python snippet


def test_an_optimizer_the_trainer_does_not_offer_is_an_error_not_a_silent_swap() -> None:
    data = ADAMW.model_dump()
    data["reference"]["optimizer"] = "adam"
    data["reference"]["optimizer_kwargs"] = {}
    adam = SearchSpace.from_dict(data)
    with pytest.raises(ExportError, match="adam with weight decay is an L2 penalty"):
        _best(adam, 16).hf_training_args_kwargs()
    data["reference"]["optimizer"] = "adamw"
    data["reference"]["optimizer_kwargs"] = {"amsgrad": True}
    with pytest.raises(ExportError, match="amsgrad of adamw have no TrainingArguments field"):
        _best(SearchSpace.from_dict(data), 16).hf_training_args_kwargs()


def test_lightning_trainer_runs_the_recipe_with_the_exported_optimizers() -> None:
    import lightning as L

    best = _best(ADAMW, 8, 2, amp="bf16")
    assert best.lightning_trainer_kwargs() == {
        "accumulate_grad_batches": 2,
        "devices": 1,
        "precision": "bf16-mixed",
        "gradient_clip_val": None,  # a search's loop does not clip
    }
    clipped = BestConfig(best.config, replace(best.provenance, grad_clip_norm=1.0))
    assert clipped.lightning_trainer_kwargs()["gradient_clip_val"] == 1.0

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = Tiny()

        def training_step(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
            return self.model(**batch)["loss"]

        def configure_optimizers(self) -> dict[str, Any]:
            return best.lightning_optimizers(self.parameters())

    # bf16 autocast is slow on CPU: the precision mapping is asserted above, the run is fp32.
    trainer = L.Trainer(
        **{**best.lightning_trainer_kwargs(), "precision": "32-true"},
        accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(_rows(64), **best.dataloader_kwargs())
    trainer.fit(Module(), loader)
    assert trainer.global_step == 3  # optimizer steps: 6 micro batches
    [optimizer] = trainer.optimizers
    assert optimizer.param_groups[0]["initial_lr"] == pytest.approx(best.config.lr)
    assert optimizer.param_groups[0]["weight_decay"] == pytest.approx(best.config.weight_decay)
    assert trainer.lr_scheduler_configs[0].interval == "step"
    compile(best.render("lightning"), "<lightning snippet>", "exec")


class _World:
    """DeepSpeed's view of an N-process launch: its config reads the data-parallel size here."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size

    def get_data_parallel_rank(self) -> int:
        return 0


@pytest.mark.parametrize("world", [1, 4])
def test_deepspeed_config_passes_deepspeeds_own_validation(
    world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeepSpeed's ``DeepSpeedConfig`` checks micro x accumulation x world == train batch and
    parses the optimizer and scheduler blocks. Its rank is read from deepspeed.comm, which only
    a launched job initialises: that one call is stood in for, the validation is DeepSpeed's."""
    import deepspeed.comm
    from deepspeed.runtime.config import DeepSpeedConfig

    monkeypatch.setattr(deepspeed.comm, "get_rank", lambda *a, **k: 0)
    best = _best(ADAMW, 64, 4, amp="bf16").retarget(world)  # 1415 warmup steps
    config = best.deepspeed_config()
    parsed = DeepSpeedConfig(config, mpu=_World(world))
    assert parsed.train_batch_size == best.config.effective_batch_size == 256
    assert (parsed.train_micro_batch_size_per_gpu, parsed.gradient_accumulation_steps) == (
        best.config.micro_batch_size,
        best.config.accumulation_steps,
    )
    assert (parsed.optimizer_name, parsed.scheduler_name) == ("adamw", "WarmupLR")
    assert parsed.optimizer_params["lr"] == pytest.approx(best.config.lr)
    assert parsed.scheduler_params["warmup_num_steps"] == best.config.warmup_steps - 2
    assert parsed.gradient_clipping == 0.0  # DeepSpeed's default would be 1.0
    # Measured under autocast with fp32 weights: DeepSpeed's autocast, not its bf16 weights.
    assert parsed.torch_autocast_enabled and not parsed.bfloat16_config.enabled
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        DeepSpeedConfig({**config, "train_batch_size": 65}, mpu=_World(world))


def test_retargeting_keeps_the_measured_effective_batch_when_it_can() -> None:
    measured = ADAMW.derive(16, 4)  # effective 64 on 1 GPU
    on_two = retarget(measured, 2)
    assert on_two.measured
    assert (on_two.config.micro_batch_size, on_two.config.accumulation_steps) == (16, 2)
    assert (on_two.config.lr, on_two.config.weight_decay, on_two.config.warmup_steps) == (
        measured.lr, measured.weight_decay, measured.warmup_steps,
    )  # fmt: skip
    on_eight = retarget(measured, 8)  # 16 x 8 > 64: the micro batch falls to 8
    assert on_eight.config.micro_batch_size == 8
    assert on_eight.config.effective_batch_size == 64 and on_eight.config.lr == measured.lr
    # The optimizer's recipe is the measured one, the per-device batch is not (BatchNorm).
    assert not on_eight.measured and "BatchNorm" in on_eight.note
    # With the space known, only its own micro batches (16..256 here): 8 is not one of them.
    in_space = retarget(measured, 8, ADAMW)
    assert not in_space.measured and in_space.config.micro_batch_size == 16
    assert in_space.note.startswith("NOT MEASURED: the effective batch 64")
    # A recipe measured at a micro batch off the space's list keeps it when it can.
    off_list = ADAMW.derive(24, 4)
    assert 24 not in ADAMW.search.micro_batch_size
    kept = retarget(off_list, 2, ADAMW)
    assert kept.measured and (kept.config.micro_batch_size, kept.config.accumulation_steps) == (
        24, 2,
    )  # fmt: skip


def test_a_world_size_that_cannot_keep_the_batch_is_re_derived_and_marked_not_measured() -> None:
    measured = ADAMW.derive(64, 3)  # effective 192: 5 GPUs cannot split it
    moved = retarget(measured, 5, ADAMW)
    assert not moved.measured and moved.note.startswith("NOT MEASURED")
    # The nearest of the space's micro batches: 32 x 1 x 5 = 160 (16 x 2 x 5 ties, the larger
    # micro batch wins; 64 x 1 x 5 = 320 is further); the rules' LR and weight decay at 160.
    assert moved.config == ADAMW.derive(32, 1, 5)
    assert moved.config.lr != measured.lr
    with pytest.raises(ExportError, match="re-deriving the recipe needs its space"):
        retarget(measured, 5)
    best = BestConfig(measured, {"space": ADAMW.name}).retarget(5)  # the preset it names
    moved = best.provenance.retargeted
    assert moved is not None and moved.measured is False
    assert (
        moved.measured_recipe is not None and moved.measured_recipe["effective_batch_size"] == 192
    )


def test_export_cli_retargets_and_prints_launch_lines(tmp_path: Path) -> None:
    best = _best(ADAMW, 16, 4, amp="bf16")
    (tmp_path / "best_config.yaml").write_text(best.render("yaml"))
    torchrun = run_cli("export", str(tmp_path), "--format", "torchrun", "--world-size", "2")
    assert torchrun.returncode == 0, torchrun.stderr
    assert "torchrun --nproc-per-node 2 train.py --space generic_adamw" in torchrun.stdout
    assert "--micro-batch-size 16 --accumulation-steps 2 --world-size 2" in torchrun.stdout
    assert "LR, weight decay and warmup are the measured ones" in torchrun.stderr
    accelerate = run_cli("export", str(tmp_path), "--format", "accelerate")
    assert "accelerate launch --num_processes 1 --mixed_precision bf16 train.py" in (
        accelerate.stdout
    )
    assert "Accelerator(gradient_accumulation_steps=args.accumulation_steps)" in accelerate.stdout
    bad = run_cli("export", str(tmp_path), "--format", "keras")
    assert bad.returncode == 2 and "--format: must be one of" in bad.stderr
    nowhere = run_cli("export", str(tmp_path), "--world-size", "0")
    assert nowhere.returncode == 2
    assert "command line: --world-size: must be an integer >= 1, got 0" in nowhere.stderr


def test_a_run_that_did_not_record_its_autocast_says_so_instead_of_guessing(
    tmp_path: Path,
) -> None:
    old = BestConfig(ADAMW.derive(16, 4), {"space": ADAMW.name})  # before amp_dtype was kept
    assert not old.amp_recorded and old.hf_training_args_kwargs()["bf16"] is False
    for fmt in ("hf", "lightning", "accelerate", "ray-train"):
        assert "\n# this run did not record the workload's autocast" in old.render(fmt)
    assert "# this run did not record" not in _best(ADAMW, 16, 4).render("hf")
    (tmp_path / "best_config.yaml").write_text(old.render("yaml"))
    proc = run_cli("export", str(tmp_path), "--format", "deepspeed")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["train_batch_size"] == 64  # still plain JSON
    assert "did not record the workload's autocast" in proc.stderr


def test_a_custom_space_named_like_a_preset_is_not_mistaken_for_it() -> None:
    data = ADAMW.model_dump()
    data["reference"]["lr"] = 0.01  # the user's own space, under the preset's name
    custom = SearchSpace.from_dict(data)
    best = BestConfig(custom.derive(64, 3), {"space": custom.name})
    with pytest.raises(ExportError, match="re-deriving the recipe needs its space"):
        best.retarget(5)
    assert best.retarget(5, custom).config == custom.derive(32, 1, 5)


def test_a_training_script_reads_the_launch_lines_recipe_back(tmp_path: Path) -> None:
    """The script a launch line runs, as a user writes it in a folder of their own: the recipe
    from ``--format args`` read back whole (momentum in ``--optimizer-kwargs`` too), the
    script's own flags left for its own parser; the torchrun line's arguments the same."""
    best = _best(SGD, 32, 2)
    script = tmp_path / "train.py"
    script.write_text(
        "import json\n"
        "from raybatch.formats.launch import recipe_from_args\n"
        "recipe, rest = recipe_from_args()\n"
        "print(json.dumps({'recipe': recipe.to_dict(), 'rest': rest}))\n"
    )
    argv = shlex.split(best.render("args"))
    done = subprocess.run([sys.executable, str(script), *argv, "--epochs", "3"], cwd=tmp_path,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    read = json.loads(done.stdout)
    assert read == {"recipe": best.config.to_dict(), "rest": ["--epochs", "3"]}
    assert read["recipe"]["optimizer_kwargs"]["momentum"] == 0.9
    from raybatch.formats.launch import recipe_from_args

    line = next(t for t in best.render("torchrun").splitlines() if t.startswith("torchrun"))
    words = shlex.split(line)
    assert recipe_from_args(words[words.index("train.py") + 1 :])[0] == best.config


def test_a_launch_line_value_of_the_wrong_kind_names_its_flag() -> None:
    from raybatch.errors import ConfigError
    from raybatch.formats.launch import recipe_from_args

    argv = shlex.split(_best(SGD, 32, 2).render("args"))
    at = argv.index("--micro-batch-size")
    argv[at + 1] = "big"
    with pytest.raises(ConfigError, match="--micro-batch-size: not a value: 'big'"):
        recipe_from_args(argv)
    with pytest.raises(ConfigError, match="--micro-batch-size: missing"):
        recipe_from_args(argv[:at] + argv[at + 2 :])
    argv[at + 1] = "2.5"
    with pytest.raises(ConfigError, match="--micro-batch-size: must be an integer"):
        recipe_from_args(argv)


def test_every_format_of_the_registry_renders_and_is_offered_by_the_cli() -> None:
    """One list of formats: ``--help`` names each, each renders the winner, the ones with
    nodes take ``--gpus-per-node`` and the rest refuse it, and each says which recipe it
    carries where its kind of file can."""
    from typer.testing import CliRunner

    from raybatch.cli.app import app
    from raybatch.errors import OptionError
    from raybatch.formats.registry import FORMATS

    best = _best(ADAMW, 16, 4, amp="bf16")
    help_text = " ".join(CliRunner().invoke(app, ["export", "--help"]).output.split())
    for fmt in FORMATS:
        assert fmt.name in help_text
        text = best.render(fmt.name)
        if fmt.origin == "comment":
            assert text.startswith("# raybatch recipe from"), fmt.name
        elif fmt.origin == "none":
            assert "#" not in text, fmt.name
        if fmt.nodes:
            assert best.render(fmt.name, gpus_per_node=2)
        else:
            with pytest.raises(
                OptionError, match=f"--gpus-per-node: applies to .*not to '{fmt.name}'"
            ):
                best.render(fmt.name, gpus_per_node=2)
