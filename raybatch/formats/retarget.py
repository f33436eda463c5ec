"""A measured recipe moved to another number of GPUs, saying whether it is still the measured one.

Searches often run on fewer GPUs than training does. What carries over is the *effective*
batch: the LR, the weight decay and the warmup were derived from it (and measured with it).
So, in order of preference:

1. same micro batch, fewer (or more) accumulation steps, same effective batch — the optimizer
   sees exactly the measured recipe; only the hardware differs;
2. the largest smaller micro batch with the same effective batch, when accumulation alone
   cannot absorb the new world size (the micro batch falls, so memory does too) — the same
   optimizer recipe, but **not the measured one**, and marked so: the per-GPU throughput was
   not measured, and a model with BatchNorm normalises over the smaller per-device batch
   (unless it uses SyncBatchNorm), which changes what it learns;
3. otherwise the nearest effective batch the world size allows (micro batch no larger than
   measured), with the LR, weight decay and warmup re-derived by the space's rules — **not
   measured**, and marked so.

With the space known, micro batches come from the space's own ``micro_batch_size`` list (the
ones the search could have measured), not any integer that divides, and the measured micro
batch itself, on the list or not (a hand-written config, a space edited since).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from raybatch.errors import ExportError, Issue, PresetNotFoundError, RaybatchError
from raybatch.space.config import TrialConfig
from raybatch.space.presets import load_space

if TYPE_CHECKING:
    from raybatch.space.search_space import SearchSpace


@dataclass(frozen=True)
class Retargeted:
    """The recipe on the new world size.

    Attributes:
        config: The recipe to train with.
        measured: Whether the optimizer sees the measured recipe (same effective batch, LR,
            weight decay and warmup); ``False`` when they were re-derived by the rules.
        note: One sentence for a person: what changed and why.
    """

    config: TrialConfig
    measured: bool
    note: str


def _same_effective(config: TrialConfig, micro: int, accumulation: int, world: int) -> TrialConfig:
    return replace(
        config, micro_batch_size=micro, accumulation_steps=accumulation, world_size=world
    )


def _micros(micro: int, space: SearchSpace | None) -> list[int]:
    """Micro batches to try, largest first, none above the measured one (it is known to fit):
    the measured one and the space's own below it, or every integer without a space. The
    measured one always leads: a recipe measured off the space's list (a hand-written config,
    a space edited since) keeps it whenever accumulation alone can absorb the new world size."""
    if space is None:
        return list(range(micro, 0, -1))
    return sorted({micro, *(m for m in space.search.micro_batch_size if m <= micro)}, reverse=True)


def _nearest(effective: int, micros: list[int], world_size: int, limit: int | None
             ) -> tuple[int, int]:  # fmt: skip
    """``(micro, accumulation)`` on ``world_size`` GPUs whose effective batch is nearest the
    measured one, the largest micro batch on ties."""
    best: tuple[int, int, int] | None = None  # (distance, -micro, accumulation)
    for m in micros:
        accumulation = max(1, round(effective / (m * world_size)))
        if limit is not None:
            accumulation = min(accumulation, limit)
        candidate = (abs(m * accumulation * world_size - effective), -m, accumulation)
        best = candidate if best is None else min(best, candidate)
    assert best is not None
    return -best[1], best[2]


def retarget(config: TrialConfig, world_size: int, space: SearchSpace | None = None) -> Retargeted:
    """``config`` on ``world_size`` GPUs (see the module's order of preference).

    Args:
        config: The measured recipe.
        world_size: GPUs (data-parallel workers) to train on.
        space: The space the recipe came from, to re-derive LR, weight decay and warmup when
            the effective batch must change (and to respect its limits).

    Raises:
        ExportError: ``world_size`` is not a positive integer, or the effective batch must
            change and no space is known to re-derive the recipe from.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ExportError([Issue("--world-size", f"must be an integer >= 1, got {world_size!r}")])
    m, w, effective = config.micro_batch_size, config.world_size, config.effective_batch_size
    was = f"{m} x {config.accumulation_steps} x {w} GPU(s)"
    if world_size == w:
        return Retargeted(config, True, f"already on {w} GPU(s): the measured recipe")
    limit = space.limits.max_accumulation_steps if space is not None else None
    micros = _micros(m, space)
    for micro in micros:  # the largest micro batch that keeps the effective batch
        if effective % (micro * world_size):
            continue
        accumulation = effective // (micro * world_size)
        if limit is not None and accumulation > limit:
            break  # smaller micro batches need even more accumulation
        moved = _same_effective(config, micro, accumulation, world_size)
        if micro == m:
            note = (
                f"measured as {was}; on {world_size} GPU(s): micro batch {m} x {accumulation}"
                f" accumulation keeps the effective batch {effective}, so LR, weight decay and"
                " warmup are the measured ones (the hardware is not)"
            )
            return Retargeted(moved, True, note)
        note = (
            f"NOT MEASURED (micro batch): measured as {was}; on {world_size} GPU(s) the micro"
            f" batch falls to {micro} (x {accumulation} accumulation) to keep the effective"
            f" batch {effective}: LR, weight decay and warmup are the measured ones, but the"
            " smaller micro batch's throughput was not measured, and BatchNorm (without"
            f" SyncBatchNorm) normalises over {micro} samples per device instead of {m}"
        )
        return Retargeted(moved, False, note)
    if space is None:
        raise ExportError(
            [
                Issue(
                    "--world-size",
                    f"the effective batch {effective} cannot be split over {world_size} GPUs"
                    f" with micro batch {m}; re-deriving the recipe needs its space (not found)",
                )
            ]
        )
    micro, accumulation = _nearest(effective, micros, world_size, limit)
    try:
        derived = space.derive(
            micro, accumulation, world_size, config.lr_multiplier, config.weight_decay_multiplier
        )
    except RaybatchError as exc:
        raise ExportError(
            [Issue("--world-size", f"the nearest recipe on {world_size} GPUs is refused: {exc}")]
        ) from None
    return Retargeted(
        derived,
        False,
        f"NOT MEASURED: the effective batch {effective} ({was}) cannot be kept on"
        f" {world_size} GPU(s) with micro batch {m}; nearest: {micro} x {accumulation} x"
        f" {world_size} = {derived.effective_batch_size}, LR {derived.lr:.6g} and weight decay"
        f" {derived.weight_decay:.6g} re-derived by the space's rules ({derived.lr_rule.value},"
        f" {derived.weight_decay_rule.value}); search on {world_size} GPUs to measure it",
    )


def preset_deriving(config: TrialConfig, name: str | None) -> SearchSpace | None:
    """The preset space ``name`` where it derives exactly ``config`` (``None`` otherwise): a
    custom space may share a preset's name, and re-deriving from another space's rules would
    retarget a recipe the search never measured."""
    if not name:
        return None
    try:
        space = load_space(str(name))
    except PresetNotFoundError:  # a space of the user's own (a broken preset file is said)
        return None
    try:
        again = space.derive(config.micro_batch_size, config.accumulation_steps,
                             config.world_size, config.lr_multiplier,
                             config.weight_decay_multiplier)  # fmt: skip
    except RaybatchError:  # its limits refuse the recipe: not the space it was measured in
        return None
    return space if again == config else None


__all__ = ["Retargeted", "preset_deriving", "retarget"]
