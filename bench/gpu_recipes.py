"""The recipes the GPU checks train with, stored so that reading them needs no pydantic.

A search space is a pydantic model (:mod:`raybatch.space.search_space`), and the lent GPU
machine has no pydantic. So the recipes the checks use are derived on a machine with the
package's dependencies, from the shipped presets, and stored in ``bench/gpu_recipes.json``
(``python bench/gpu_recipes.py`` rewrites it); the checks read them back with
:meth:`raybatch.TrialConfig.from_dict`, a plain dataclass. ``tests/test_gpu_check.py`` fails
when the file no longer holds what the presets derive.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raybatch import keys
from raybatch.space.config import TrialConfig

FILE = Path(__file__).with_name("gpu_recipes.json")
USED: dict[str, tuple[int | None, ...]] = {
    "digits_cnn_sgd": (16, 32, 64, 128, 256, 512),
    "generic_adamw": (None,),
    "resnet50_imagenet_sgd": (None, 128),
}
"""The presets and micro batches the GPU checks train with (``None``: the reference recipe)."""


def _key(micro_batch_size: int | None) -> str:
    return "reference" if micro_batch_size is None else str(micro_batch_size)


def derive_all() -> dict[str, dict[str, dict[str, Any]]]:
    """Every recipe of :data:`USED`, derived by the shipped presets (this needs pydantic)."""
    import raybatch

    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, sizes in USED.items():
        space = raybatch.load_space(name)
        out[name] = {
            _key(b): (space.reference_config() if b is None else space.derive(b)).to_dict()
            for b in sizes
        }
    return out


def recipe(space: str, micro_batch_size: int | None = None) -> TrialConfig:
    """The stored recipe of preset ``space`` at ``micro_batch_size`` (None: its reference)."""
    stored = json.loads(FILE.read_text())
    try:
        data = stored[space][_key(micro_batch_size)]
    except KeyError:
        raise KeyError(
            f"{space} at micro batch {micro_batch_size} is not in {FILE.name}: add it to USED"
            " and run python bench/gpu_recipes.py"
        ) from None
    return TrialConfig.from_dict(data, str(FILE))


def at_micro_batch(config: TrialConfig, micro_batch_size: int) -> TrialConfig:
    """``config`` with another micro batch, for measuring memory only.

    A step's memory depends on the micro batch, the accumulation, the world size and the
    optimizer (what :meth:`raybatch.memory.estimator.MemoryEstimator.model_for` reads), not on
    the LR, weight decay or warmup the rules would re-derive; the tests check that the estimate
    of this recipe equals that of the preset's own derivation.
    """
    effective = micro_batch_size * config.accumulation_steps * config.world_size
    return dataclasses.replace(
        config, micro_batch_size=micro_batch_size, effective_batch_size=effective
    )


@dataclasses.dataclass(frozen=True)
class StoredSpace:
    """The stored recipes of one preset, standing in for its space where a trial reads its
    recipe (``run_trial`` calls ``space.recipe_of(config)``); only stored micro batches, with
    every other knob at its default, are known."""

    name: str

    def recipe_of(self, config: Mapping[str, Any]) -> TrialConfig:
        knobs = {k: v for k, v in config.items() if k in keys.RAW_KNOBS}
        defaults = {keys.ACCUMULATION_STEPS: 1, keys.WORLD_SIZE: 1, keys.LR_MULTIPLIER: 1.0,
                    keys.WEIGHT_DECAY_MULTIPLIER: 1.0}  # fmt: skip
        other = {k: v for k, v in knobs.items() if k != keys.MICRO_BATCH_SIZE}
        if any(defaults.get(k) != v for k, v in other.items()):
            raise KeyError(f"only the micro batch is stored, got {knobs}")
        return recipe(self.name, int(config[keys.MICRO_BATCH_SIZE]))


if __name__ == "__main__":
    FILE.write_text(json.dumps(derive_all(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {FILE}", file=sys.stderr)
