"""Each export, taken to its framework, trains with exactly the measured recipe: DeepSpeed's
``initialize``, the HF ``Trainer``, the launchers' own argument parsers, and the file a user
writes with ``-o`` saying whether it is the measured recipe."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import raybatch
from raybatch import BestConfig
from raybatch.formats.deepspeed import deepspeed_lr_factors, warmup_deviations
from raybatch.space.config import warmup_factor

from .conftest import run_cli
from .test_formats import Tiny, _rows

SGD = raybatch.load_space("digits_cnn_sgd")
ADAMW = raybatch.load_space("generic_adamw")
HERE = Path(__file__).parent


def _deepspeed_run(best: BestConfig, tmp_path: Path, steps: int) -> dict[str, Any]:
    (tmp_path / "ds_config.json").write_text(best.render("deepspeed"))
    done = subprocess.run(
        [sys.executable, str(HERE / "deepspeed_train.py"), str(tmp_path / "ds_config.json"),
         str(tmp_path / "out.json"), str(steps)],
        env={**os.environ, "DS_ACCELERATOR": "cpu"}, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads((tmp_path / "out.json").read_text())
    return result


@pytest.mark.parametrize(
    ("knobs", "warmup", "deviating"),
    [((64, 1), None, []), ((128, 4), None, [0]), ((64, 1), 2, [0]), ((64, 1), 3, [0, 2])],
)
def test_deepspeed_initialize_trains_the_exported_recipe(
    knobs: tuple[int, int], warmup: int | None, deviating: list[int], tmp_path: Path
) -> None:
    """Without warmup (which WarmupLR refuses at 0 steps), with 2, 3 and the rule's warmup
    steps: DeepSpeed's batch triple, no clipping, autocast with fp32 gradient reduction, and
    the LR of every optimizer step the recipe's except the steps the config's ``raybatch``
    notes name (the first; and step 2 at W = 3, where WarmupLR's minimum of 2 steps bites)."""
    config = SGD.derive(*knobs)
    if warmup is not None:
        config = dataclasses.replace(config, warmup_steps=warmup)
    best = BestConfig(config, {"space": SGD.name, "amp_dtype": "bf16"})
    c = best.config
    ran = _deepspeed_run(best, tmp_path, steps=c.warmup_steps + 3)
    assert (ran["micro_batch_size"], ran["accumulation_steps"], ran["train_batch_size"]) == (
        c.micro_batch_size, c.accumulation_steps, c.effective_batch_size,
    )  # fmt: skip
    assert ran["gradient_clipping"] == 0.0 and ran["torch_autocast"]
    assert ran["reduced_in_lower_precision"] == []
    recipe = [c.lr * warmup_factor(k, c.warmup_steps) for k in range(len(ran["lrs"]))]
    assert ran["lrs"] == pytest.approx([f * c.lr for f in deepspeed_lr_factors(c, len(recipe))])
    assert warmup_deviations(c) == deviating
    for k, (lr, want) in enumerate(zip(ran["lrs"], recipe, strict=True)):
        assert (lr == pytest.approx(want)) is (k not in deviating), k
    notes = json.loads(best.render("deepspeed"))["raybatch"]["notes"]
    assert bool(notes) == bool(deviating)


class _Counted(Tiny):
    """:class:`Tiny`, counting the samples its forward sees."""

    samples = 0

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        _Counted.samples += len(x)
        return super().forward(x, labels)


@pytest.mark.parametrize("clip", [None, 0.5])
def test_hf_trainer_clips_only_as_measured_and_steps_the_effective_batch(
    clip: float | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import Trainer

    best = BestConfig(ADAMW.derive(8, 2), {"space": ADAMW.name, "amp_dtype": None,
                                           "grad_clip_norm": clip})  # fmt: skip
    args = best.to_hf_training_args(output_dir=str(tmp_path), max_steps=3, report_to=[],
                                    use_cpu=True, save_strategy="no")  # fmt: skip
    assert args.max_grad_norm == (clip or 0.0)  # the Trainer's default would clip at 1.0
    clipped: list[float] = []
    # The Trainer clips through its Accelerator: that call's bound is what is checked, however
    # accelerate then clips (1.16 no longer calls torch.nn.utils.clip_grad_norm_ by that name).
    from accelerate import Accelerator

    original = Accelerator.clip_grad_norm_

    def spy(self: Any, parameters: Any, max_norm: float, *a: Any, **k: Any) -> torch.Tensor:
        clipped.append(max_norm)
        return original(self, parameters, max_norm, *a, **k)

    monkeypatch.setattr(Accelerator, "clip_grad_norm_", spy)
    _Counted.samples = 0
    trainer = Trainer(model=_Counted(), args=args, train_dataset=_rows(160))
    trainer.train()
    # Unclipped, the Trainer still measures the norm, with an infinite bound (clips nothing).
    assert clipped == [math.inf if clip is None else clip] * 3
    assert trainer.state.global_step == 3
    assert _Counted.samples == 3 * best.config.effective_batch_size  # 3 steps of 8 x 2


def _reparse(line: str) -> argparse.Namespace:
    """The script's side: every ``--key value`` the export wrote, read back."""
    parser = argparse.ArgumentParser()
    for key in BestConfig(ADAMW.derive(8, 2), {}).config.to_dict():
        parser.add_argument(f"--{key.replace('_', '-')}")
    return parser.parse_args(line)  # type: ignore[arg-type]


def test_launch_lines_parse_with_the_launchers_own_parsers() -> None:
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.run import get_args_parser

    best = BestConfig(SGD.derive(64, 2), {"space": SGD.name, "amp_dtype": "bf16"}).retarget(4)
    c = best.config
    [torchrun] = [x for x in best.render("torchrun").splitlines() if not x.startswith("#")]
    parsed = get_args_parser().parse_args(shlex.split(torchrun)[1:])
    assert (parsed.nproc_per_node, parsed.training_script) == ("4", "train.py")
    script = _reparse(parsed.training_script_args)
    assert int(script.micro_batch_size) * int(script.accumulation_steps) * 4 == (
        c.effective_batch_size
    )
    assert json.loads(script.optimizer_kwargs) == c.optimizer_kwargs  # momentum kept
    assert float(script.lr) == c.lr
    [line] = [x for x in best.render("accelerate").splitlines() if not x.startswith("#")]
    launched = launch_command_parser().parse_args(shlex.split(line)[2:])
    assert launched.multi_gpu and launched.num_processes == 4
    assert launched.mixed_precision == "bf16" and launched.training_script == "train.py"
    assert _reparse(launched.training_script_args).accumulation_steps == str(c.accumulation_steps)


def test_a_retargeted_lightning_snippet_uses_one_recipe_throughout() -> None:
    """16 x 4 on 1 GPU, moved to 8 (16 x 1 x 8, re-derived at 128): the DataLoader, the optimizer
    and the Trainer all get the retargeted recipe (a snippet reloading best_config.yaml would
    give the old accumulation and LR)."""
    best = BestConfig(ADAMW.derive(16, 4), {"space": ADAMW.name, "amp_dtype": None,
                                            "grad_clip_norm": 0.5})  # fmt: skip
    moved = best.retarget(8)
    snippet = moved.render("lightning")
    namespace: dict[str, Any] = {}
    runnable = snippet.replace("import lightning as L\n", "").replace(
        "class Model(L.LightningModule):", "class Model:"
    ).replace("trainer = L.Trainer(", "trainer = dict(")  # fmt: skip
    exec(compile(runnable, "<lightning snippet>", "exec"), namespace)
    batch = namespace["best"].dataloader_kwargs()["batch_size"]
    trainer = namespace["trainer"]
    assert batch * trainer["accumulate_grad_batches"] * trainer["devices"] == 128
    assert trainer["gradient_clip_val"] == namespace["best"].grad_clip_norm == 0.5
    assert moved.config.effective_batch_size == 128 and "NOT MEASURED" in snippet
    assert namespace["best"].config == moved.config
    optimizer = namespace["best"].lightning_optimizers(torch.nn.Linear(2, 2).parameters())
    assert optimizer["optimizer"].param_groups[0]["initial_lr"] == pytest.approx(moved.config.lr)


def test_a_retargeted_ray_train_snippet_uses_one_recipe_for_workers_and_loop() -> None:
    """16 x 4 on 1 GPU moved to 8 workers: the loop config the snippet passes is the
    retargeted recipe's, not best_config.yaml's (which would train at 16 x 4 x 8 = 512)."""
    measured_under = {"amp_dtype": "bf16", "grad_clip_norm": 0.5}
    best = BestConfig(ADAMW.derive(16, 4), {"space": ADAMW.name, **measured_under})
    moved = best.retarget(8)
    snippet = moved.render("ray-train")
    head = snippet.split("def train_loop")[0]
    runnable = "\n".join(line for line in head.splitlines() if not line.startswith("from ray"))
    namespace: dict[str, Any] = {}
    exec(compile(runnable, "<ray-train snippet>", "exec"), namespace)
    loop = namespace["best"].ray_train_loop_config()
    assert namespace["best"].config == moved.config
    assert loop["micro_batch_size"] * loop["accumulation_steps"] * 8 == 128
    assert loop["lr"] == pytest.approx(moved.config.lr)
    assert "num_workers=8" in snippet
    # the loop reproduces the clipping and autocast the recipe was measured under
    inside = BestConfig.from_loop_config(loop)
    assert (inside.grad_clip_norm, inside.amp_dtype) == (0.5, "bf16")
    # ... and stays marked NOT MEASURED, in the snippet's best and inside the loop
    assert not namespace["best"].measured and loop["raybatch"]["measured"] is False
    assert not inside.measured and inside.origin()["retargeted"].startswith("NOT MEASURED")
    # no device recorded: GPUs assumed, and said, in the snippet and the API
    assert "use_gpu=True assumed" in snippet
    assert "ScalingConfig(num_workers=8, use_gpu=True" in snippet
    with pytest.warns(UserWarning, match="use_gpu=True assumed"):
        assert moved.ray_train_scaling_config().use_gpu


def test_every_written_export_says_where_it_came_from_and_whether_it_was_measured(
    tmp_path: Path,
) -> None:
    """Every format of the registry but the record's own (yaml, json), written by the CLI's
    export command (its app, in this process: 18 exports) with and without a retarget."""
    from typer.testing import CliRunner

    from raybatch.cli.app import app
    from raybatch.formats.registry import FORMATS

    best = BestConfig(ADAMW.derive(64, 3), {"space": ADAMW.name, "amp_dtype": None,
                                            "trial_id": "t7"})  # fmt: skip
    run = tmp_path / "run"
    run.mkdir()
    (run / "best_config.yaml").write_text(best.render("yaml"))
    formats = [f.name for f in FORMATS if f.name not in ("yaml", "json")]
    assert len(formats) == 9
    for fmt in formats:
        for world, measured in ((1, True), (5, False)):  # 192 cannot be split over 5
            out = tmp_path / f"{fmt}-{world}.txt"
            proc = CliRunner().invoke(app, ["export", str(run), "--format", fmt, "--world-size",
                                            str(world), "-o", str(out)])  # fmt: skip
            if fmt == "args" and not measured:  # one line for $(...): no room for the marker
                assert proc.exit_code == 2 and not out.exists()
                assert "--output: an args file has no room for the NOT MEASURED" in proc.stderr
                continue
            assert proc.exit_code == 0, proc.output
            text = out.read_text()
            assert text.isascii(), fmt  # writable under any locale
            if fmt == "args":
                assert len(text.splitlines()) == 1 and text.startswith("--")
            elif fmt in ("deepspeed", "hf-json"):
                origin = json.loads(text)["raybatch"]
                assert origin["measured"] is measured and origin["trial_id"] == "t7"
                assert origin["from"].endswith("best_config.yaml")
                assert measured or origin["retargeted"].startswith("NOT MEASURED")
            else:
                assert "raybatch recipe from" in text and "trial t7" in text
                assert ("NOT MEASURED" in text) is not measured


def test_several_nodes_get_multi_node_launch_lines_and_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 processes on nodes of 8 GPUs: torchrun and accelerate as their parsers read the
    lines, Lightning's ``num_nodes`` (``devices=16`` fails on an 8-GPU node), and a clear
    error when the GPUs per node do not divide the world size."""
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.run import get_args_parser

    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MACHINE_RANK", "1")

    def shell(text: str) -> list[str]:  # what a node's shell passes on: variables expanded
        [line] = [x for x in text.splitlines() if not x.startswith("#")]
        return [os.path.expandvars(word) for word in shlex.split(line)]

    best = BestConfig(ADAMW.derive(16, 1, 16), {"space": ADAMW.name, "amp_dtype": None})
    parsed = get_args_parser().parse_args(shell(best.render("torchrun", 8))[1:])
    assert (parsed.nnodes, parsed.nproc_per_node, parsed.rdzv_backend) == ("2", "8", "c10d")
    assert parsed.rdzv_endpoint == "10.0.0.1:29500"
    launched = launch_command_parser().parse_args(shell(best.render("accelerate", 8))[2:])
    assert (launched.num_machines, launched.num_processes, launched.main_process_port) == (
        2, 16, 29500,
    )  # fmt: skip
    assert launched.machine_rank == 1 and launched.main_process_ip == "10.0.0.1"
    assert launched.multi_gpu
    kwargs = best.lightning_trainer_kwargs(gpus_per_node=8)
    assert (kwargs["devices"], kwargs["num_nodes"]) == (8, 2)
    assert "num_nodes" not in best.lightning_trainer_kwargs()  # one node: as before
    assert "num_nodes=2" in best.render("lightning", 8)
    (tmp_path / "best_config.yaml").write_text(best.render("yaml"))
    bad = run_cli("export", str(tmp_path), "--format", "torchrun", "--gpus-per-node", "6")
    assert bad.returncode == 2, bad.stderr
    assert "--gpus-per-node: must be a positive divisor of the world size 16, got 6" in bad.stderr
    ignored = run_cli("export", str(tmp_path), "--format", "deepspeed", "--gpus-per-node", "8")
    assert ignored.returncode == 2, ignored.stderr  # never dropped silently
    assert "--gpus-per-node: applies to lightning, torchrun, accelerate" in ignored.stderr


def _ray_train_loop(config: dict[str, Any]) -> None:
    """A Ray Train loop built from the export alone: the recipe's optimizer, warmup and
    accumulation on each worker's shard; reports each optimizer step's LR and samples."""
    import ray.train
    from ray.train.torch import prepare_data_loader, prepare_model

    best = BestConfig.from_loop_config(config)
    torch.manual_seed(0)
    model = prepare_model(Tiny())
    rows = _rows(4 * best.config.effective_batch_size)
    loader = prepare_data_loader(torch.utils.data.DataLoader(rows, **best.dataloader_kwargs()))
    optimizer = best.build_optimizer(model.parameters())
    scheduler = best.build_scheduler(optimizer)
    samples, lrs, steps_seen = 0, [], []
    for i, batch in enumerate(loader):
        (model(**batch)["loss"] / config["accumulation_steps"]).backward()
        samples += len(batch["x"])
        if (i + 1) % config["accumulation_steps"]:
            continue
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        steps_seen.append(samples)
        samples = 0
    rank = ray.train.get_context().get_world_rank()
    seen = {"lrs": lrs, "samples_per_step": steps_seen}
    (Path(config["out"]) / f"rank{rank}.json").write_text(json.dumps(seen))


@pytest.mark.slow
def test_a_torch_trainer_trains_the_exported_recipe_on_two_workers(
    ray_session: None, tmp_path: Path
) -> None:
    """The ScalingConfig the trials had (2 workers, 1 CPU each, no GPU here) and the loop config:
    each worker steps micro x accumulation samples per optimizer step (x 2 workers = the
    effective batch) at the recipe's LR schedule."""
    from ray.train.torch import TorchTrainer

    best = BestConfig(SGD.derive(32, 2, 2), {"space": SGD.name, "amp_dtype": None,
                                             "device": "CPU (test)"})  # fmt: skip
    scaling = best.ray_train_scaling_config()
    assert (scaling.num_workers, scaling.use_gpu) == (2, False)
    assert scaling.resources_per_worker == {"CPU": 1}
    loop = best.ray_train_loop_config()
    assert loop["raybatch"]["measured"] and BestConfig.from_loop_config(loop).config == best.config
    TorchTrainer(
        _ray_train_loop, train_loop_config={**loop, "out": str(tmp_path)}, scaling_config=scaling
    ).fit()
    c = best.config
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["samples_per_step"] == [c.micro_batch_size * c.accumulation_steps] * 4
        assert 2 * seen["samples_per_step"][0] == c.effective_batch_size
        assert seen["lrs"] == pytest.approx(
            [c.lr * warmup_factor(k, c.warmup_steps) for k in range(4)]
        )
    snippet = best.render("ray-train")
    compile(snippet, "<ray-train snippet>", "exec")
    assert "ScalingConfig(num_workers=2, use_gpu=False" in snippet


def test_hf_args_can_be_a_trainingarguments_subclass(tmp_path: Path) -> None:
    """TRL's ``SFTConfig`` and friends subclass ``TrainingArguments``: the same recipe in them."""
    from dataclasses import dataclass

    from transformers import TrainingArguments

    @dataclass
    class MyConfig(TrainingArguments):
        max_length: int = 128

    best = BestConfig(ADAMW.derive(8, 2), {"space": ADAMW.name, "amp_dtype": None})
    args = best.to_hf_training_args(cls=MyConfig, output_dir=str(tmp_path), max_length=64)
    assert isinstance(args, MyConfig) and args.max_length == 64
    assert (args.per_device_train_batch_size, args.max_grad_norm) == (8, 0.0)
