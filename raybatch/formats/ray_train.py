"""The recipe for Ray Train's ``TorchTrainer`` (Ray 2.x): a ``ScalingConfig`` and the loop config.

A Ray plugin's natural target: the trials that measured the recipe ran data-parallel through
the same ``TorchTrainer`` (:mod:`raybatch.trial.wrapper`), so the export asks for what they
had — ``num_workers`` = the world size, one CPU and (on GPUs) one whole GPU per worker — and
hands the loop the recipe:

| recipe | Ray Train |
| --- | --- |
| world size | ``ScalingConfig(num_workers=...)`` |
| GPU per worker | ``use_gpu``, ``resources_per_worker={"CPU": 1, "GPU": 1}`` |
| micro batch (per worker), accumulation | ``train_loop_config["micro_batch_size"]``, ``["accumulation_steps"]`` |
| LR, weight decay, warmup steps | ``train_loop_config["lr"]``, ``["weight_decay"]``, ``["warmup_steps"]`` |
| the whole recipe | ``train_loop_config["recipe"]``: ``raybatch.BestConfig.from_loop_config(config)`` in the loop |
| clipping, autocast as measured | ``train_loop_config["grad_clip_norm"]``, ``["amp_dtype"]`` where the run recorded them; ``best.grad_clip_norm``, ``best.amp_dtype`` in the loop |
"""  # noqa: E501

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from raybatch.formats.written import best_line

if TYPE_CHECKING:
    from raybatch.space.config import TrialConfig

WRITTEN_AGAINST = "ray 2.x (ray.train.ScalingConfig, ray.train.torch.TorchTrainer)"


def scaling_config_kwargs(c: TrialConfig, use_gpu: bool) -> dict[str, Any]:
    """``ray.train.ScalingConfig`` keyword arguments: the placement the trials had."""
    return {
        "num_workers": c.world_size,
        "use_gpu": use_gpu,
        "resources_per_worker": {"CPU": 1, **({"GPU": 1} if use_gpu else {})},
    }


def scaling_config(c: TrialConfig, use_gpu: bool | None) -> Any:
    """A real ``ray.train.ScalingConfig`` with the placement the trials had; ``use_gpu`` ``None``
    (the device was not recorded) means GPUs, with a warning."""
    from ray.train import ScalingConfig

    if use_gpu is None:
        warnings.warn(
            "this recipe does not record the device it was measured on: use_gpu=True"
            " assumed; pass use_gpu= to say", stacklevel=3,
        )  # fmt: skip
        use_gpu = True
    return ScalingConfig(**scaling_config_kwargs(c, use_gpu))


def loop_config(c: TrialConfig, origin: dict[str, Any]) -> dict[str, Any]:
    """``TorchTrainer(train_loop_config=...)``: the knobs a loop reads, and the whole recipe."""
    return {
        "micro_batch_size": c.micro_batch_size,
        "accumulation_steps": c.accumulation_steps,
        "lr": c.lr,
        "weight_decay": c.weight_decay,
        "warmup_steps": c.warmup_steps,
        "recipe": c.to_dict(),
        "raybatch": origin,
    }


def snippet(
    c: TrialConfig, use_gpu: bool | None, carried: dict[str, Any], source: str | None = None
) -> str:
    """A complete Python snippet: the ``TorchTrainer`` and the loop's use of the recipe — this
    one, written out, so the workers and the loop config come from one recipe (a retargeted
    recipe is not the ``best_config.yaml`` on disk). ``use_gpu``: where it was measured
    (``None``: not recorded, GPUs assumed and said); ``carried``:
    :meth:`raybatch.BestConfig.carried` (clipping, autocast, which recipe); ``source``: the file
    it came from."""

    assumed = use_gpu is None
    scaling = ", ".join(
        f"{k}={v!r}"
        for k, v in scaling_config_kwargs(c, True if assumed else bool(use_gpu)).items()
    )
    device_note = (
        "# the run did not record its device: use_gpu=True assumed; set it as you train\n"
        if assumed else ""
    )  # fmt: skip
    return (
        f"# raybatch winner for Ray Train ({WRITTEN_AGAINST}): {c.world_size} worker(s) x micro"
        f" batch {c.micro_batch_size} x accumulation {c.accumulation_steps} = effective batch"
        f" {c.effective_batch_size}.\n"
        f"{device_note}"
        "import raybatch\n"
        "from ray.train import ScalingConfig\n"
        "from ray.train.torch import TorchTrainer, prepare_data_loader, prepare_model\n"
        "\n"
        f"{best_line(c, carried, source)}"
        "\n"
        "def train_loop(config):\n"
        "    best = raybatch.BestConfig.from_loop_config(config)\n"
        "    model = prepare_model(build_model())\n"
        "    loader = prepare_data_loader(DataLoader(train_set, shuffle=True,"
        " **best.dataloader_kwargs()))\n"
        "    optimizer = best.build_optimizer(model.parameters())\n"
        "    scheduler = best.build_scheduler(optimizer)  # step once per optimizer step\n"
        "    ...  # step the optimizer every best.config.accumulation_steps micro batches,\n"
        "    ...  # clipped at best.grad_clip_norm (None: unclipped), under autocast of\n"
        "    ...  # best.amp_dtype (None: fp32), as the recipe was measured\n"
        "\n"
        "trainer = TorchTrainer(\n"
        "    train_loop,\n"
        "    train_loop_config=best.ray_train_loop_config(),\n"
        f"    scaling_config=ScalingConfig({scaling}),\n"
        ")\n"
        "trainer.fit()\n"
    )


__all__ = ["WRITTEN_AGAINST", "loop_config", "scaling_config_kwargs", "snippet"]
