"""What the cluster has, as the search sees it: nodes, CPUs, GPUs, and each GPU's memory.

The search decides GPU or CPU trials, and the per-GPU memory budget, from the *cluster* —
never from the machine the driver runs on. A Ray cluster's head node usually has no GPU; a
search launched there that looked at ``torch.cuda.is_available()`` would run every trial on
CPUs, and one that read NVML there would find nothing to budget. So:

- GPUs are counted from each alive node's Ray resources (``ray.nodes()``);
- memory is read through NVML by a zero-CPU task pinned to each GPU node
  (``NodeAffinitySchedulingStrategy``), which sees that node's physical GPUs;
- with GPUs of different sizes the budget is the smallest one's (every trial may land on
  it), and the view says so.
"""

from __future__ import annotations

import math
import platform
from dataclasses import asdict, dataclass
from typing import Any

from raybatch.cluster.budget import (
    CUDA_CONTEXT_OVERHEAD_BYTES,
    DEFAULT_HEADROOM,
    MemoryBudget,
    budget_of,
)
from raybatch.cluster.nvml import DeviceMemory, read_devices, visible_devices
from raybatch.cluster.placement import (
    ACCELERATOR_TYPE,
    MAX_TRIALS_PER_GPU,
    accelerator_type_of,
    autoscaling_gpus_by_model,
    autoscaling_max,
    whole_units,
)
from raybatch.cluster.process_age import charged_to_task
from raybatch.errors import Issue, OptionError, first_line
from raybatch.memory.sizes import format_bytes, parse_size

NVML_TIMEOUT_S = 30.0
"""How long the NVML reading tasks may take together (a busy node answers in well under 1 s)."""


@dataclass(frozen=True)
class NodeView:
    """One alive node: its Ray resources and, for a GPU node, what NVML says of its GPUs.

    Attributes:
        devices: Every GPU on the node as NVML reports it; ``None`` when NVML did not answer
            there (no driver, or not read).
    """

    node_id: str
    address: str
    cpus: float
    gpus: float
    devices: tuple[DeviceMemory, ...] | None = None
    nvml_error: str | None = None
    """Why NVML did not answer there, when it was asked and did not."""
    accelerator_types: tuple[str, ...] = ()
    """Ray's ``accelerator_type:<model>`` resources of the node (Ray sets one per GPU model)."""

    def gpu_models(self) -> set[str]:
        """The node's GPU models: Ray's accelerator types, else NVML's names put into Ray's
        words (``NVIDIA A100-SXM4-80GB`` -> ``A100``), so that a node Ray labelled and one
        only NVML names are not taken for two models."""
        if self.gpus <= 0:
            return set()
        if self.accelerator_types:
            return set(self.accelerator_types)
        return {accelerator_type_of(d.name) for d in self.devices or ()}


def trials_in_flight(
    cluster: dict[str, float], gpus_per_trial: str | float, cpus_per_trial: float
) -> int:
    """How many trials the cluster can run at once: the search's ``max_concurrent_trials``.

    Why set it at all: with a custom searcher and no concurrency limit, Ray Tune keeps one
    trial pending at a time (``TUNE_MAX_PENDING_TRIALS_PG`` is 1 for searchers, 200 for its
    own random search), so trials start one after the other even when the cluster could start
    several — the reason Tune with a searcher is slower per trial than without. Limiting the
    trials in flight to what can actually run lets Tune start them together, without asking the
    sampler for suggestions far ahead of the results (which would make them less informed).

    CPU trials: the cluster's CPUs over ``cpus_per_trial``. GPU trials: also at most the GPUs
    over ``gpus_per_trial`` (``auto`` packs up to :data:`MAX_TRIALS_PER_GPU` per GPU).
    An autoscaling cluster's GPUs count at the autoscaler's maximum
    (:meth:`ClusterView.trials_at_once`): trials pending on GPU nodes not yet up are what
    makes the autoscaler start them, while one trial at a time would start one node.
    """
    limit = math.floor(cluster.get("CPU", 1.0) / cpus_per_trial) if cpus_per_trial > 0 else 1
    gpus = cluster.get("GPU", 0.0)
    if gpus_per_trial == "auto" and gpus > 0:
        limit = min(limit, math.floor(gpus) * MAX_TRIALS_PER_GPU)
    elif isinstance(gpus_per_trial, int | float) and gpus_per_trial > 0:
        limit = min(limit, math.floor(gpus / gpus_per_trial + 1e-9))
    return max(limit, 1)


@dataclass(frozen=True)
class ClusterView:
    """The cluster a search will run on."""

    nodes: tuple[NodeView, ...]
    autoscale_gpus: int = 0
    """GPUs the autoscaler may still bring up (its config's maximum; 0 without one)."""
    autoscale_cpus: int = 0
    """CPUs likewise (a head with no CPUs of its own and its workers at zero)."""
    autoscale_models: tuple[tuple[str, int], ...] = ()
    """The autoscaler's GPUs per model its node types declare (empty: none names one)."""

    @property
    def gpus(self) -> float:
        return sum(n.gpus for n in self.nodes)

    @property
    def cpus(self) -> float:
        return sum(n.cpus for n in self.nodes)

    @property
    def gpu_nodes(self) -> int:
        return sum(1 for n in self.nodes if n.gpus > 0)

    @property
    def trial_device(self) -> str:
        """``cuda`` when any node declares a GPU, else ``cpu``."""
        return "cuda" if self.gpus > 0 else "cpu"

    def trials_at_once(self, gpus_per_trial: str | float, cpus_per_trial: float) -> int:
        """:func:`trials_in_flight` on this cluster, its GPUs at the autoscaler's maximum."""
        room = {
            "CPU": max(self.cpus, float(self.autoscale_cpus)),
            "GPU": max(self.gpus, float(self.autoscale_gpus)),
        }
        return trials_in_flight(room, gpus_per_trial, cpus_per_trial)

    def placeable(self, use_gpu: bool) -> int:
        """Workers of one GPU (or one CPU) the cluster can hold at once."""
        return whole_units(n.gpus if use_gpu else n.cpus for n in self.nodes)

    def gpus_per_trial(self, requested: str | float | None) -> str | float:
        """What each trial asks for: the user's request, else one whole GPU on a cluster with
        GPUs (alive, or that its autoscaler may start), else 0 (CPU trials).

        A whole GPU by default: a trial packed beside others shares the GPU's compute with a
        number of neighbours that changes as they come and go, so its time to target is not
        comparable with a lone trial's. Packing (``"auto"``) is an opt-in for screening many
        small recipes at once; capping and the confirmation judge only times measured alone.
        """
        if requested is not None:
            return requested
        return 1 if self.gpus > 0 or self.autoscale_gpus > 0 else 0

    def gpu_models(self) -> list[str]:
        """Every GPU model of the cluster, alive or that its autoscaler may start (empty when
        neither Ray nor NVML names one)."""
        return sorted({m for n in self.nodes for m in n.gpu_models()} | self.models_to_come())

    def models_to_come(self) -> set[str]:
        """The GPU models of the autoscaler's node types that may bring up GPUs."""
        return {m for m, gpus in self.autoscale_models if gpus > 0}

    def of_model(self, model: str) -> ClusterView:
        """The cluster as trials pinned to ``model`` see it: its GPU nodes of that model (and
        the nodes without GPUs, which host the driver's side of data-parallel trials)."""
        model = model.removeprefix(ACCELERATOR_TYPE)  # Ray's resource name, or the model's
        kept = tuple(n for n in self.nodes if n.gpus <= 0 or model in n.gpu_models())
        # The autoscaler's GPUs of this model only, where its node types say which is which.
        by_model = dict(self.autoscale_models)
        gpus = by_model.get(model, 0) if by_model else self.autoscale_gpus
        return ClusterView(kept, gpus, self.autoscale_cpus, self.autoscale_models)

    def smallest_gpu(self) -> tuple[NodeView, DeviceMemory] | None:
        """The GPU with the least free memory among those NVML answered for."""
        found = [(n, d) for n in self.nodes if n.gpus > 0 for d in (n.devices or ())]
        return min(found, key=lambda nd: nd[1].free_bytes) if found else None

    def budget(
        self,
        memory_budget: str | int | None = None,
        headroom: float = DEFAULT_HEADROOM,
        context_bytes: int = CUDA_CONTEXT_OVERHEAD_BYTES,
    ) -> MemoryBudget | None:
        """One trial's budget on one GPU: the explicit one, else the smallest GPU's (NVML);
        ``None`` when there are no GPUs or NVML answered on none of the GPU nodes."""
        if memory_budget is not None:
            return MemoryBudget(parse_size(memory_budget), "explicit")
        smallest = self.smallest_gpu()
        if smallest is None:
            return None
        node, device = smallest
        where = f" (node {node.address}, the smallest free memory of the cluster's GPUs)"
        return budget_of(device, headroom, context_bytes, where if self._sizes() > 1 else "")

    def _sizes(self) -> int:
        return len({d.total_bytes for n in self.nodes for d in (n.devices or ())})

    def warnings(self) -> list[str]:
        """What a search on this cluster should be told before it starts."""
        out = []
        silent = [
            n.address + (f" ({n.nvml_error})" if n.nvml_error else "")
            for n in self.nodes
            if n.gpus > 0 and n.devices is None
        ]
        if silent:
            out.append(
                f"NVML did not answer on GPU node(s) {', '.join(silent)}: their memory is"
                " unknown; give --memory-budget, or install the NVIDIA driver there"
            )
        if self._sizes() > 1:
            smallest = self.smallest_gpu()
            assert smallest is not None
            node, device = smallest
            out.append(
                f"GPUs of different sizes: the budget is that of the smallest free memory"
                f" ({device.name}, {format_bytes(device.free_bytes)} free on {node.address});"
                " larger GPUs are under-used by packed trials"
            )
        for n in self.nodes:
            if n.devices is not None and n.gpus > len(n.devices):
                out.append(
                    f"node {n.address} declares {n.gpus:g} GPUs to Ray but NVML sees"
                    f" {len(n.devices)}"
                )
        return out

    def describe(self, cuda: bool) -> str:
        """The hardware trials run on, in one line (a winner's provenance)."""
        if not cuda:
            return f"CPU ({platform.machine()}), {self.cpus:g} CPUs on {len(self.nodes)} node(s)"
        models: dict[str, int] = {}
        for n in self.nodes:
            for d in n.devices or ():
                models[d.name] = models.get(d.name, 0) + 1
        if not models:
            return f"{self.gpus:g} GPUs on {self.gpu_nodes} node(s) (model unknown: no NVML)"
        kinds = ", ".join(f"{count} x {name}" for name, count in sorted(models.items()))
        return f"{kinds} on {self.gpu_nodes} node(s)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "gpu_nodes": self.gpu_nodes,
            "cpus": self.cpus,
            "trial_device": self.trial_device,
            "nodes": [
                {
                    **{k: v for k, v in asdict(n).items() if k != "devices"},
                    "devices": None if n.devices is None else [asdict(d) for d in n.devices],
                }
                for n in self.nodes
            ],
        }


def _alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive", False)]


def read_cluster(read_nvml: bool = True, timeout_s: float = NVML_TIMEOUT_S) -> ClusterView:
    """The view of the Ray cluster this process is connected to (``ray.init`` first).

    Args:
        read_nvml: Read each GPU node's memory through NVML (a zero-CPU task per GPU node).
        timeout_s: How long to wait for those readings; a node that does not answer in time
            is reported as one where NVML did not answer.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    records = _alive_nodes()
    pending = {}
    if read_nvml:
        reader = ray.remote(num_cpus=0)(charged_to_task(read_node_devices))
        for record in records:
            if float(record.get("Resources", {}).get("GPU", 0.0)) > 0:
                strategy = NodeAffinitySchedulingStrategy(record["NodeID"], soft=False)
                pending[record["NodeID"]] = reader.options(scheduling_strategy=strategy).remote()
    answers = collect_readings(pending, timeout_s)
    nodes = tuple(
        NodeView(
            node_id=r["NodeID"],
            address=str(r.get("NodeManagerAddress", "?")),
            cpus=float(r.get("Resources", {}).get("CPU", 0.0)),
            gpus=float(r.get("Resources", {}).get("GPU", 0.0)),
            devices=rays_devices(
                answers.get(r["NodeID"], (None, None))[0],
                float(r.get("Resources", {}).get("GPU", 0.0)),
            ),
            nvml_error=answers.get(r["NodeID"], (None, None))[1],
            accelerator_types=tuple(
                sorted(
                    k.split(":", 1)[1]
                    for k in r.get("Resources", {})
                    if k.startswith(ACCELERATOR_TYPE)
                )
            ),
        )
        for r in records
    )
    return ClusterView(
        nodes, autoscaling_max("GPU"), autoscaling_max("CPU"), autoscaling_gpus_by_model()
    )


def started_visible_devices() -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as this Ray worker's process was started with: the node's GPUs
    as its raylet sees them, not as Ray set the variable for the task now running.

    The NVML reader is a task that holds no GPU. Ray leaves the variable alone for such a task
    by default, but blanks it under ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1`` (Ray's switch back
    to its old behaviour); read as is, the reader would see no GPU, or (read as "unset") every
    physical one, and a node started on GPUs 2,3 (SLURM, a split node) would be budgeted from
    GPUs 0,1. Ray keeps the value it found when the worker started
    (``Worker.original_visible_accelerator_ids``, through which it maps a task's assigned GPU
    ids to CUDA's); that is read here, and this process's own variable where Ray keeps none
    (not a Ray worker, or a Ray that moved it). Its entries; ``None``: it was unset, every GPU.
    """
    try:
        from ray._private.worker import global_worker

        started = global_worker.original_visible_accelerator_ids["GPU"]
    except (ImportError, AttributeError, KeyError):
        return visible_devices()
    return None if started is None else [str(i) for i in started]


def read_node_devices() -> list[DeviceMemory] | None:
    """The GPUs of the node this runs on, as Ray manages them (:func:`started_visible_devices`),
    through NVML; ``None`` without a usable NVIDIA driver. The body of the per-node reader."""
    return read_devices(started_visible_devices())


def gpu_request(
    view: ClusterView,
    requested: str | float | None,
    memory_budget: str | int | None,
    notes: list[str],
) -> str | float:
    """What each trial asks for (:meth:`ClusterView.gpus_per_trial`), checked against the
    cluster: GPUs where none is alive yet go on only where an autoscaler may start some and
    the budget is given (no GPU's memory can be read before one exists).

    A cluster of several nodes none of which has a GPU, with no autoscaler that says it may
    start one, is never searched on CPUs by default: a GPU cluster whose GPU nodes are at zero
    looks exactly like that under Ray's v1 autoscaler, which publishes no configuration
    (``get_cluster_config`` answers only under v2). The user says which it is.

    Raises:
        OptionError: GPUs asked of a cluster that has none and cannot get any, or of an
            autoscaling one without ``--memory-budget``; or a multi-node cluster without GPUs
            and no ``--gpus-per-trial``.
    """

    gpus = view.gpus_per_trial(requested)
    # Several nodes and no autoscaler configuration at all (a v2 one says what it may start,
    # GPUs or CPUs only): GPU nodes at zero under v1 cannot be told from a CPU cluster.
    unknown = len(view.nodes) > 1 and view.autoscale_gpus <= 0 and view.autoscale_cpus <= 0
    if requested is None and gpus in (0, 0.0) and unknown:
        message = (
            f"not given, and no node of this {len(view.nodes)}-node cluster has a GPU, nor"
            " does an autoscaler say it may start one (GPU nodes at zero under Ray's v1"
            " autoscaler look the same): give --gpus-per-trial 0 for a CPU search, or"
            " --gpus-per-trial 1 with --memory-budget (and --gpu-model on mixed GPUs) for GPU"
            " trials that wait for the autoscaler"
        )
        raise OptionError([Issue("gpus_per_trial", message)])
    if gpus in (0, 0.0) or view.gpus > 0:
        return gpus
    if view.autoscale_gpus <= 0 and not unknown:  # one node, or a config without GPUs
        message = f"is {gpus!r}, but no node of the cluster has a GPU"
        raise OptionError([Issue("gpus_per_trial", message)])
    up_to = "an autoscaler may start some" if unknown else f"up to {view.autoscale_gpus}"
    if memory_budget is None:
        message = (
            f"no GPU node is alive yet ({up_to}), and no GPU's memory can be read before one"
            " exists: give --memory-budget, or --gpus-per-trial 0 for a CPU search"
        )
        raise OptionError([Issue("memory_budget", message)])
    wait = " (if none ever starts, the trials wait: stop the search with Ctrl-C)"
    notes.append(
        f"no GPU node is alive yet: GPU trials wait for the autoscaler to start one ({up_to}"
        f"{'' if unknown else ' GPUs'}), with the memory budget given{wait if unknown else ''}"
    )
    return gpus


def one_gpu_model(
    view: ClusterView,
    model: str | None,
    notes: list[str],
    pin: str = "--gpu-model (e.g. --gpu-model {})",
) -> ClusterView:
    """The cluster a GPU search runs on: one GPU model, since times to target from different
    models cannot be ranked, capped or confirmed against each other.

    ``pin`` is how the caller chooses one (the CLI's ``--gpu-model``; the trainable's
    ``gpu_model=``), shown with a model of the cluster.

    Raises:
        OptionError: The cluster mixes models and none was chosen, or the chosen one is not
            there; the message names the models and how to choose one (``pin``).
    """

    models = view.gpu_models()
    if model is None:
        if len(models) > 1:
            message = (
                f"the cluster mixes GPU models ({', '.join(models)}): times to target on"
                " different GPUs cannot be ranked against each other; choose one with"
                f" {pin.format(models[0])}"
            )
            raise OptionError([Issue("gpu_model", message)])
        return view
    name = model.removeprefix(ACCELERATOR_TYPE)
    labelled = sorted(
        {t for n in view.nodes if n.gpus > 0 for t in n.accelerator_types} | view.models_to_come()
    )
    if name not in labelled:  # trials are pinned through Ray's resource: it must exist
        found = ", ".join(labelled) or "none (no node has an accelerator_type resource)"
        message = (
            f"{name!r} is not a GPU model Ray labels on this cluster (accelerator_type:"
            f"{name}); its labelled models: {found}. Start the GPU nodes with"
            f" --resources '{{\"accelerator_type:{name}\": 1}}' to pin an unlabelled model"
        )
        raise OptionError([Issue("gpu_model", message)])
    pinned = view.of_model(name)
    notes.append(f"every GPU trial runs on {name} ({pinned.gpus:g} GPUs of the cluster's"
                 f" {view.gpus:g})")  # fmt: skip
    return pinned


def collect_readings(
    pending: dict[str, Any], timeout_s: float
) -> dict[str, tuple[tuple[DeviceMemory, ...] | None, str | None]]:
    """Each node's NVML reading, ``(devices, why not)``: a reader that raised (a driver or
    library error on one node) or did not answer in ``timeout_s`` is that node's "NVML did not
    answer", said with the reason, never an exception that ends the search or the check."""
    import ray

    out: dict[str, tuple[tuple[DeviceMemory, ...] | None, str | None]] = {}
    if not pending:
        return out
    ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=timeout_s)
    for node_id, ref in pending.items():
        if ref not in ready:
            ray.cancel(ref, force=True)  # a hung reader must not hold the node's worker
            out[node_id] = (None, f"no answer in {timeout_s:g} s")
            continue
        try:
            found = ray.get(ref)
        except Exception as exc:  # the reader's own error, as Ray wraps it
            cause = getattr(exc, "cause", None) or exc
            out[node_id] = (None, f"{type(cause).__name__}: {first_line(cause)}")
            continue
        out[node_id] = (None, "no NVIDIA driver") if found is None else (tuple(found), None)
    return out


def rays_devices(
    devices: tuple[DeviceMemory, ...] | None, gpus: float
) -> tuple[DeviceMemory, ...] | None:
    """The devices of a node that Ray manages: a node started with ``--num-gpus N`` below what
    CUDA sees gives Ray the first ``N`` (Ray numbers its GPU ids in CUDA's order), and only
    those count for the budget (a busy GPU outside Ray must not shrink it)."""
    if devices is None:
        return None
    # A fractional share (0.5 GPU to Ray) still lies on a whole device: round up.
    return devices[: math.ceil(gpus - 1e-9)] if 0 < gpus < len(devices) else devices


__all__ = [
    "ClusterView", "NodeView", "collect_readings", "gpu_request", "one_gpu_model", "rays_devices",
    "read_cluster", "read_node_devices", "started_visible_devices",
]  # fmt: skip
