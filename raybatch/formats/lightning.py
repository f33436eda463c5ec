"""The recipe for Lightning (argument names of lightning 2.6): ``Trainer`` keyword arguments and
what ``configure_optimizers`` returns.

| recipe | Lightning |
| --- | --- |
| accumulation | ``Trainer(accumulate_grad_batches=...)`` |
| world size | ``Trainer(devices=...)``, with ``num_nodes`` on several nodes |
| the workload's autocast | ``Trainer(precision="bf16-mixed" / "16-mixed" / "32-true")`` |
| optimizer, LR, weight decay | ``configure_optimizers``: raybatch's own optimizer |
| warmup, then constant | a ``LambdaLR`` stepped per optimizer step (``interval="step"``) |
| micro batch | the ``DataLoader``'s ``batch_size`` (``best.dataloader_kwargs()``) |
| gradient clipping of the measured loop | ``Trainer(gradient_clip_val=...)`` |

``gradient_clip_val`` is the clipping the recipe was measured with (``None``: a search trains
with raybatch's default loop, unclipped). Lightning steps a ``"step"``-interval scheduler once
per optimizer step, after accumulation, as raybatch's loop does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from raybatch.formats.launch import nodes
from raybatch.formats.written import best_line
from raybatch.space.config import warmup_scheduler
from raybatch.workload import build_optimizer

if TYPE_CHECKING:
    from raybatch.space.config import TrialConfig

WRITTEN_AGAINST = "lightning 2.6"
_PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", None: "32-true"}


def trainer_kwargs(
    c: TrialConfig,
    amp: str | None,
    grad_clip_norm: float | None = None,
    gpus_per_node: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``lightning.Trainer`` (``gradient_clip_val``: the clipping the
    recipe was measured with; ``None``, no clipping, for a search's default loop; with
    ``gpus_per_node`` below the world size, ``devices`` per node and ``num_nodes``)."""

    count, per_node = nodes(c.world_size, gpus_per_node)
    placement: dict[str, Any] = {"devices": per_node}
    if count > 1:
        placement["num_nodes"] = count
    return {
        "accumulate_grad_batches": c.accumulation_steps,
        **placement,
        "precision": _PRECISION[amp],
        "gradient_clip_val": grad_clip_norm,
    }


def optimizers(c: TrialConfig, params: Iterable[Any]) -> dict[str, Any]:
    """What ``LightningModule.configure_optimizers`` should return for the recipe: its
    optimizer, and its warmup stepped once per optimizer step."""

    optimizer = build_optimizer(params, c)
    scheduler = warmup_scheduler(optimizer, c.warmup_steps)
    return {
        "optimizer": optimizer,
        "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
    }


def snippet(
    c: TrialConfig,
    carried: dict[str, Any],
    source: str | None = None,
    gpus_per_node: int | None = None,
) -> str:
    """A complete Python snippet: the ``Trainer``, ``configure_optimizers`` and the
    ``DataLoader``'s batch, all from one recipe — this one, written out (a retargeted recipe
    is not the ``best_config.yaml`` on disk, so the snippet does not reload that file).
    ``carried``: :meth:`raybatch.BestConfig.carried` (clipping, autocast, which recipe);
    ``source``: the file it came from."""

    amp, clip = carried.get("amp_dtype"), carried.get("grad_clip_norm")
    trainer = trainer_kwargs(c, amp, clip, gpus_per_node)
    kwargs = "".join(f"    {k}={v!r},\n" for k, v in trainer.items())
    return (
        f"# raybatch winner for Lightning ({WRITTEN_AGAINST}).\n"
        "import lightning as L\n"
        "import raybatch\n"
        "\n"
        f"{best_line(c, carried, source)}"
        "\n"
        "class Model(L.LightningModule):\n"
        "    ...  # your training_step\n"
        "    def configure_optimizers(self):\n"
        "        return best.lightning_optimizers(self.parameters())\n"
        "\n"
        "# DataLoader(..., **best.dataloader_kwargs())  # micro batch"
        f" {c.micro_batch_size}, drop_last\n"
        f"trainer = L.Trainer(\n{kwargs})\n"
    )


__all__ = ["WRITTEN_AGAINST", "optimizers", "snippet", "trainer_kwargs"]
