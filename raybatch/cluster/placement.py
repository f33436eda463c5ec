"""Where a trial runs: its device from what Ray assigned, its share of a packed GPU, and
whether a data-parallel recipe can be placed at all.

Three rules, each a defect when broken on a real cluster:

- **The device comes from Ray's assignment, never from what is visible.** Ray sets
  ``CUDA_VISIBLE_DEVICES`` for actors that hold GPUs, but (since Ray 2.4x) no longer blanks it
  for actors that hold none: a CPU trial placed on a GPU node still *sees* every GPU there.
  ``torch.cuda.is_available()`` is therefore no answer; ``ray.get_gpu_ids()`` is.
- **A packed trial may not take a neighbour's memory.** ``k`` trials share a GPU, each holding
  ``1/k`` of it in Ray's books; PyTorch's caching allocator knows nothing of that, so each
  packed trial caps its own allocator with ``torch.cuda.set_per_process_memory_fraction``:
  the trial that overruns its share is the one that fails, not whichever allocates next.
- **A recipe that cannot be placed never waits.** ``world_size`` workers each reserve a whole
  GPU (a CPU when the trials run on CPUs); more than the cluster has would leave the trial
  waiting for a placement group until the hang guard stops it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

from raybatch.cluster.budget import CUDA_CONTEXT_OVERHEAD_BYTES, DEFAULT_HEADROOM
from raybatch.cluster.nvml import visible_devices
from raybatch.errors import TrialDeviceError

GPUS_PER_TRIAL_ALLOWED = "'auto' or a number >= 0"


def gpus_per_trial_ok(value: Any) -> bool:
    """Whether ``value`` is a GPU request a trial can make: ``"auto"`` or a number >= 0."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return value == "auto" or (number and value >= 0)


def running_ray() -> Any:
    """The ``ray`` module when this process is part of a running Ray, else ``None``: a direct
    call outside Ray, or a machine without Ray at all (the offline GPU check runs trials with
    torch, NVML and this package only)."""
    try:
        import ray
    except ImportError:
        return None
    return ray if ray.is_initialized() else None


def assigned_gpu_ids() -> list[str] | None:
    """The GPU ids Ray assigned to this process; ``None`` outside Ray (a direct call)."""
    ray = running_ray()
    if ray is None:
        return None
    return [str(i) for i in ray.get_gpu_ids()]


def assigned_gpu_share() -> float | None:
    """The fraction of a GPU Ray assigned to this process (``0.25`` when packed four to a GPU);
    ``None`` outside Ray, ``0.0`` for a CPU trial."""
    ray = running_ray()
    if ray is None:
        return None
    try:
        return float(ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0))
    except AssertionError:  # Ray's answer in a driver process: nothing was assigned to it
        return None


MAX_TRIALS_PER_GPU = 8
"""Never pack more than this many trials onto one GPU, whatever the estimate says: beyond it
the trials fight over the SMs, and time-to-target measurements stop meaning anything."""


ACCELERATOR_TYPE = "accelerator_type:"
"""Prefix of the resource Ray puts on a GPU node for its GPU model (``accelerator_type:A100``);
a trial pinned to a model asks for a sliver of it (:func:`model_resource`)."""
MODEL_RESOURCE_SLIVER = 0.001
"""How much of a node's ``accelerator_type`` a pinned trial or worker asks: any positive
amount places it on a node of that model, and a thousand fit beside each other."""


def accelerator_type_of(nvml_name: str) -> str:
    """Ray's accelerator type for an NVML device name, as Ray labels a node with it
    (``NVIDIA A100-SXM4-80GB`` -> ``A100``, ``NVIDIA GeForce RTX 4090`` -> ``GeForce-RTX-4090``).

    Ray's own mapping (``NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type``): it has
    no public one, and a label of our own would disagree with the ``accelerator_type:``
    resources Ray puts on other nodes. Imported here, not at the top: a trial runs without Ray
    (``bench/gpu_offline.sh``). Where Ray cannot be asked, the NVML name is kept.
    """
    try:
        from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

        label = NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(nvml_name)
    except Exception:  # Ray absent, or its private helper moved: keep NVML's name
        return nvml_name
    return str(label) if label else nvml_name


def model_resource(model: str | None) -> dict[str, float]:
    """The resource that pins a GPU trial (or data-parallel worker) to GPUs of ``model``."""
    if not model:
        return {}
    name = model.removeprefix(ACCELERATOR_TYPE)
    return {f"{ACCELERATOR_TYPE}{name}": MODEL_RESOURCE_SLIVER}


def autoscaling_max(kind: str, gpu_model: str | None = None) -> int:
    """How many ``kind`` (``"GPU"``, ``"CPU"``) the cluster's autoscaler may bring up in all
    (its node types x their max counts); 0 without an autoscaler. An autoscaling cluster whose
    GPU workers are at zero has no GPU node alive yet, and still is a GPU cluster. Ray has no
    public call for this: the one its own libraries use is read, and any failure means 0.

    With ``gpu_model``, only the node types that declare that model
    (``accelerator_type:<model>``) count: trials pinned to an A100 do not wait for the T4s the
    autoscaler may start. Node types that name no model at all cannot be told apart; then
    every one counts, as before a model was chosen.
    """
    groups = _node_groups() if gpu_model is not None else None
    named = any(k.startswith(ACCELERATOR_TYPE) for r, _ in groups or () for k in r)
    if gpu_model is not None and groups is not None and named:  # at most the whole cluster's
        return min(_model_max(kind, gpu_model, groups), autoscaling_max(kind))
    try:
        from ray._private.state import state

        maxes = state.get_max_resources_from_cluster_config()
    except Exception:  # no autoscaler, an older or newer Ray: nothing known
        return 0
    if not maxes:
        return 0
    return int(min(float(maxes.get(kind, 0) or 0), 1e6))


def autoscaling_gpus_by_model() -> tuple[tuple[str, int], ...]:
    """The GPUs the autoscaler may bring up, per model its node types declare
    (``accelerator_type:<model>``); empty without an autoscaler or where no node type names
    its model."""
    groups = _node_groups() or []
    named = {k for resources, _ in groups for k in resources if k.startswith(ACCELERATOR_TYPE)}
    models = sorted(k.removeprefix(ACCELERATOR_TYPE) for k in named)
    return tuple((m, _model_max("GPU", m, groups)) for m in models)


def _node_groups() -> list[tuple[dict[str, float], int]] | None:
    """The autoscaler's node types as (resources, max count); ``None`` without one."""
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
        if config is None:
            return None
        return [(dict(g.resources), int(g.max_count)) for g in config.node_group_configs]
    except Exception:  # no autoscaler, an older or newer Ray: nothing known
        return None


def _model_max(kind: str, gpu_model: str, groups: list[tuple[dict[str, float], int]]) -> int:
    """:func:`autoscaling_max` of ``kind`` over the node types that declare ``gpu_model``, read
    as Ray reads its config (a type of none of it, or none to start, adds nothing; -1 is
    unbounded)."""
    wanted = f"{ACCELERATOR_TYPE}{gpu_model.removeprefix(ACCELERATOR_TYPE)}"
    total = 0.0
    for resources, max_count in groups:
        amount = float(resources.get(kind, 0) or 0)
        if wanted not in resources or max_count == 0 or amount == 0:
            continue
        if max_count == -1 or amount == -1:
            return int(1e6)
        total += max_count * amount
    return int(min(total, 1e6))


NOSET_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
"""Set on a node, Ray leaves ``CUDA_VISIBLE_DEVICES`` alone: an assigned GPU id is then the
CUDA index itself, not device 0 of a restricted view."""


def choose_device(
    requested: str, gpu_ids: list[str] | None, cuda_available: bool, ray_sets_visible: bool = True
) -> tuple[str, int | None]:
    """``("cuda", index)`` or ``("cpu", None)`` for a trial: the decision, without torch.

    Args:
        requested: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (the trial's setting).
        gpu_ids: What Ray assigned (:func:`assigned_gpu_ids`); ``None`` outside Ray.
        cuda_available: ``torch.cuda.is_available()`` in this process.
        ray_sets_visible: Whether Ray restricted ``CUDA_VISIBLE_DEVICES`` to the assigned
            GPUs (its default; not under :data:`NOSET_VISIBLE_DEVICES`).

    Raises:
        TrialDeviceError: Ray assigned GPUs but this process has no CUDA, or ``cuda`` was
            requested where there is none.
    """
    if requested == "cpu":
        return "cpu", None
    if requested.startswith("cuda"):
        if not cuda_available:
            raise TrialDeviceError(f"device {requested!r} requested, but CUDA is not available")
        _, _, index = requested.partition(":")
        return "cuda", int(index) if index else 0
    if gpu_ids is None:  # called outside Ray: the process's own view is all there is
        return ("cuda", 0) if cuda_available else ("cpu", None)
    if not gpu_ids:
        return "cpu", None
    if not cuda_available:
        raise TrialDeviceError(
            f"Ray assigned GPU {', '.join(gpu_ids)} to this trial, but torch.cuda is not"
            " available in its process (a CPU-only torch, or no NVIDIA driver on this node);"
            " install a CUDA build of torch on the GPU nodes, or run with --gpus-per-trial 0"
        )
    if not ray_sets_visible:  # the process sees the node's GPUs: find the assigned one
        return "cuda", cuda_index_of(gpu_ids[0], os.environ.get("CUDA_VISIBLE_DEVICES"))
    # Ray restricts CUDA_VISIBLE_DEVICES to the assigned GPUs: the first is CUDA device 0.
    return "cuda", 0


def cuda_index_of(gpu_id: str, visible: str | None) -> int:
    """The CUDA index of the GPU Ray calls ``gpu_id`` when Ray leaves ``CUDA_VISIBLE_DEVICES``
    alone: Ray's ids are the node's ``CUDA_VISIBLE_DEVICES`` entries, so the index is the id's
    place among them (``2`` of ``2,3`` is ``cuda:0``), or the id itself when none are set."""
    entries = visible_devices(visible or "") or []
    if gpu_id in entries:
        return entries.index(gpu_id)
    return int(gpu_id) if gpu_id.isdigit() else 0


def ray_leaves_visible_devices() -> bool:
    """Whether :data:`NOSET_VISIBLE_DEVICES` is on, parsed exactly as Ray parses it
    (``ray._common.utils.env_bool``: ``1`` or ``true`` in any case, nothing stripped; any other
    value, an empty one included, is off)."""
    return os.environ.get(NOSET_VISIBLE_DEVICES, "").lower() in ("1", "true")


def trial_device(requested: str = "auto") -> Any:
    """The ``torch.device`` a trial trains on (see :func:`choose_device`).

    CUDA numbers GPUs fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; NVML, and Ray's
    GPU ids where Ray counts GPUs itself, number them by PCI bus. So that CUDA's device
    ``i`` is the GPU whose NVML reading the trial's budget and monitor use, the PCI order is
    set here, before CUDA starts in this process (a user's own setting is kept).
    """
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    import torch

    sets_visible = not ray_leaves_visible_devices()
    kind, index = choose_device(
        requested, assigned_gpu_ids(), torch.cuda.is_available(), sets_visible
    )
    return torch.device(kind, index) if index is not None else torch.device(kind)


def packed_memory_fraction(
    share: float,
    budget_bytes: int,
    total_bytes: int,
    context_bytes: int = CUDA_CONTEXT_OVERHEAD_BYTES,
) -> float | None:
    """The allocator cap (fraction of the GPU's total memory) of a trial holding ``share``.

    ``budget_bytes`` is what one trial alone may use (headroom x free memory, less one CUDA
    context: :func:`raybatch.cluster.budget.resolve_budget`). Packed, the GPU's usable memory
    ``budget + context`` is split in ``1/share`` slots, and each slot pays for its own
    process's context outside the allocator: the cap is ``share x (budget + context) -
    context``. ``k`` trials then never hold more than ``budget + context`` between them,
    contexts included. ``None`` for a trial that holds a whole GPU (or none): it is not capped.
    """
    if share <= 0 or share >= 1:
        return None
    cap = share * (budget_bytes + context_bytes) - context_bytes
    return max(cap, 0.0) / total_bytes


def packed_budget_bytes(
    budget_bytes: int | None, total_bytes: int, context_bytes: int = CUDA_CONTEXT_OVERHEAD_BYTES
) -> int:
    """What one trial alone may use on a packed GPU: the search's budget, or, where the trial
    carries none (a Tune plugin search whose trainable was given no ``memory_budget``), the
    GPU's own: ``DEFAULT_HEADROOM x total - one context``. From the total, not the free memory
    NVML reads now: the neighbours already hold part of it, and the split
    (:func:`packed_memory_fraction`) pays for them. Either way no packed trial runs uncapped."""
    if budget_bytes is not None:
        return budget_bytes
    return max(int(DEFAULT_HEADROOM * total_bytes) - context_bytes, 0)


def limit_packed_memory(
    device: Any,
    budget_bytes: int | None,
    context_bytes: int = CUDA_CONTEXT_OVERHEAD_BYTES,
    share: float | None = None,
) -> float | None:
    """Cap this trial's allocator to its share of a packed GPU; the fraction set, or None.
    ``budget_bytes``: one trial's budget alone (:func:`packed_budget_bytes` where ``None``);
    ``context_bytes``: one process's CUDA context (measured by the search); ``share``: the
    trial's share of the GPU, Ray's assignment (:func:`assigned_gpu_share`) where ``None``."""
    import torch

    share = assigned_gpu_share() if share is None else share
    if device.type != "cuda" or share is None:
        return None
    total = int(torch.cuda.get_device_properties(device).total_memory)
    budget = packed_budget_bytes(budget_bytes, total, context_bytes)
    fraction = packed_memory_fraction(share, budget, total, context_bytes)
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def whole_units(amounts: Iterable[float]) -> int:
    """How many one-unit workers the per-node ``amounts`` hold: a worker never spans nodes."""
    return sum(math.floor(float(a) + 1e-9) for a in amounts)


def placeable_workers(
    nodes: list[dict[str, Any]], use_gpu: bool, gpu_model: str | None = None
) -> int:
    """How many one-GPU (or one-CPU) workers the alive ``nodes`` can hold at once.

    ``nodes`` is ``ray.nodes()``; a worker reserves a whole GPU (``use_gpu``) or one CPU, as
    the data-parallel trials do (:mod:`raybatch.trial.wrapper`); GPU workers pinned to
    ``gpu_model`` count only the GPUs of nodes of that model.
    """
    kind = "GPU" if use_gpu else "CPU"
    pin = next(iter(model_resource(gpu_model)), None) if use_gpu else None
    return whole_units(
        n.get("Resources", {}).get(kind, 0.0)
        for n in nodes
        if n.get("Alive") and (pin is None or pin in n.get("Resources", {}))
    )


def unplaceable_reason(world_size: int, use_gpu: bool, room: int) -> str | None:
    """Why ``world_size`` workers do not fit ``room`` placeable ones, or ``None``."""
    if world_size <= 1 or world_size <= room:
        return None
    kind = "GPUs" if use_gpu else "CPUs"
    return f"needs {world_size} {kind}, the cluster has {room}"


def placement_problem(world_size: int, use_gpu: bool, gpu_model: str | None = None) -> str | None:
    """Why ``world_size`` workers (on GPUs of ``gpu_model``, if pinned) cannot be placed on
    the cluster now, or ``None``."""
    import ray

    if world_size <= 1 or not ray.is_initialized():
        return None
    return unplaceable_reason(world_size, use_gpu, worker_room(ray, use_gpu, gpu_model))


def worker_room(ray: Any, use_gpu: bool, gpu_model: str | None = None) -> int:
    """One-GPU (or one-CPU) workers the cluster can hold: those of its alive nodes (of
    ``gpu_model``, if pinned), or what its autoscaler may bring up, whichever is more."""
    room = placeable_workers(ray.nodes(), use_gpu, gpu_model)
    still_to_come = autoscaling_max("GPU", gpu_model) if use_gpu else autoscaling_max("CPU")
    return max(room, still_to_come)


__all__ = [
    "ACCELERATOR_TYPE",
    "GPUS_PER_TRIAL_ALLOWED",
    "MAX_TRIALS_PER_GPU",
    "MODEL_RESOURCE_SLIVER",
    "NOSET_VISIBLE_DEVICES",
    "accelerator_type_of",
    "assigned_gpu_ids",
    "assigned_gpu_share",
    "autoscaling_gpus_by_model",
    "autoscaling_max",
    "choose_device",
    "cuda_index_of",
    "gpus_per_trial_ok",
    "limit_packed_memory",
    "model_resource",
    "packed_budget_bytes",
    "packed_memory_fraction",
    "placeable_workers",
    "placement_problem",
    "ray_leaves_visible_devices",
    "running_ray",
    "trial_device",
    "unplaceable_reason",
    "whole_units",
    "worker_room",
]
