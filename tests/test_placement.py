"""Where a trial runs: the device decision, the cluster's GPUs and budget, placement."""

from __future__ import annotations

import os

import pytest

from raybatch.cluster.budget import CUDA_CONTEXT_OVERHEAD_BYTES
from raybatch.cluster.hardware import ClusterView, NodeView, collect_readings
from raybatch.cluster.nvml import DeviceMemory
from raybatch.cluster.placement import (
    choose_device,
    cuda_index_of,
    placeable_workers,
    ray_leaves_visible_devices,
)
from raybatch.errors import TrialDeviceError

GIB = 2**30


@pytest.mark.parametrize(
    ("requested", "gpu_ids", "cuda", "expected"),
    [
        ("auto", ["3"], True, ("cuda", 0)),  # Ray's visible list starts at the assigned GPU
        ("auto", [], True, ("cpu", None)),  # a CPU trial on a GPU node sees GPUs: not its own
        ("auto", None, True, ("cuda", 0)),  # outside Ray, the process's own view
        ("auto", None, False, ("cpu", None)),
        ("cpu", ["0"], True, ("cpu", None)),
        ("cuda:1", [], True, ("cuda", 1)),
    ],
)
def test_the_device_comes_from_the_gpus_ray_assigned(
    requested: str, gpu_ids: list[str] | None, cuda: bool, expected: tuple[str, int | None]
) -> None:
    assert choose_device(requested, gpu_ids, cuda) == expected


def test_with_ray_leaving_cuda_visible_devices_alone_the_assigned_id_is_the_index() -> None:
    """Under RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES every GPU of the node is visible: the
    trial given GPU 3 must train on cuda:3, not on cuda:0 (another trial's GPU)."""
    assert choose_device("auto", ["3"], True, ray_sets_visible=False) == ("cuda", 3)
    assert choose_device("auto", ["3"], True) == ("cuda", 0)  # Ray's default: a view of one
    # Ray's ids are the node's CUDA_VISIBLE_DEVICES entries: "2" of "2,3" is cuda:0.
    assert cuda_index_of("2", "2,3") == 0 and cuda_index_of("GPU-b", "GPU-a,GPU-b") == 1
    assert cuda_index_of("3", None) == 3


@pytest.mark.parametrize(
    ("value", "on"),
    [("1", True), ("true", True), ("TRUE", True), ("yes", False), ("", False), (" 1", False)],
)
def test_ray_leaving_visible_devices_alone_is_read_as_ray_reads_it(
    monkeypatch: pytest.MonkeyPatch, value: str, on: bool
) -> None:
    monkeypatch.setenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", value)
    assert ray_leaves_visible_devices() is on
    from ray._common.utils import env_bool  # Ray's own reading, the reference

    assert env_bool("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", False) is on


def test_a_gpu_assigned_to_a_process_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(TrialDeviceError, match=r"Ray assigned GPU 2 to this trial.*--gpus-per"):
        choose_device("auto", ["2"], cuda_available=False)


def _gpu(name: str, total_gib: int, free_gib: int) -> DeviceMemory:
    return DeviceMemory(name, total_gib * GIB, free_gib * GIB, (total_gib - free_gib) * GIB, 0)


def test_gpus_of_different_sizes_budget_the_smallest_and_say_so() -> None:
    view = ClusterView(
        (
            NodeView("head", "10.0.0.1", 8, 0),
            NodeView("a", "10.0.0.2", 16, 2, (_gpu("H100", 80, 79), _gpu("H100", 80, 60))),
            NodeView("b", "10.0.0.3", 16, 1, (_gpu("A10G", 24, 23),)),
        )
    )
    assert (view.gpus, view.gpu_nodes, view.trial_device) == (3, 2, "cuda")
    budget = view.budget()
    assert budget is not None
    assert budget.bytes == int(0.9 * 23 * GIB) - CUDA_CONTEXT_OVERHEAD_BYTES
    assert "A10G" in budget.source and "10.0.0.3" in budget.source
    assert any("GPUs of different sizes" in w and "A10G" in w for w in view.warnings())
    assert view.budget("8GiB") is not None and view.budget("8GiB").source == "explicit"  # type: ignore[union-attr]


def test_a_cpu_cluster_has_no_budget_and_places_cpu_workers() -> None:
    view = ClusterView((NodeView("head", "h", 4, 0), NodeView("w", "w", 2.5, 0)))
    assert (view.trial_device, view.budget(), view.placeable(True)) == ("cpu", None, 0)
    assert view.placeable(False) == 6
    assert placeable_workers([{"Alive": False, "Resources": {"GPU": 8.0}}], True) == 0


def test_a_gpu_node_nvml_cannot_read_is_reported() -> None:
    view = ClusterView((NodeView("w", "10.0.0.9", 8, 4, None),))
    assert view.budget() is None
    assert any("NVML did not answer on GPU node(s) 10.0.0.9" in w for w in view.warnings())


@pytest.mark.usefixtures("ray_session")
def test_a_node_whose_nvml_reader_raises_is_said_not_to_answer_and_nothing_crashes() -> None:
    """One node's reader raising (a driver or library error there) or hanging must not end
    the search or ``raybatch check``: that node's NVML did not answer, with the reason."""
    import time

    import ray

    @ray.remote(num_cpus=0)
    def answers() -> list[DeviceMemory]:
        return [_gpu("H100", 80, 79)]

    @ray.remote(num_cpus=0)
    def raises() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    @ray.remote(num_cpus=0)
    def hangs() -> None:
        time.sleep(30)

    @ray.remote(num_cpus=0)
    def no_driver() -> None:
        return None

    pending = {"a": answers.remote(), "b": raises.remote(), "c": hangs.remote(),
               "d": no_driver.remote()}  # fmt: skip
    finished = [pending[k] for k in ("a", "b", "d")]
    ray.wait(finished, num_returns=3, timeout=120)  # worker start-up is not what is tested
    got = collect_readings(pending, timeout_s=1.0)
    assert got["a"] == ((_gpu("H100", 80, 79),), None)
    assert got["b"] == (None, "RuntimeError: NVML Shared Library Not Found")
    assert got["c"] == (None, "no answer in 1 s")
    assert got["d"] == (None, "no NVIDIA driver")
    view = ClusterView((NodeView("b", "10.0.0.7", 8, 2, None, got["b"][1]),))
    [warning] = view.warnings()
    assert "10.0.0.7 (RuntimeError: NVML Shared Library Not Found)" in warning


def test_a_cluster_of_mixed_gpu_models_is_refused_unless_one_is_chosen() -> None:
    """Times to target on an A100 and an H100 cannot be ranked against each other: the search
    refuses the mix, naming the models and the flag, or runs on the model chosen."""
    from raybatch.cluster.hardware import one_gpu_model
    from raybatch.errors import OptionError

    a100, h100 = (_gpu("NVIDIA A100", 80, 79),), (_gpu("NVIDIA H100", 80, 60),)
    view = ClusterView((
        NodeView("head", "10.0.0.1", 8, 0),
        NodeView("a", "10.0.0.2", 16, 2, a100, accelerator_types=("A100",)),
        NodeView("h", "10.0.0.3", 16, 4, h100, accelerator_types=("H100",)),
    ))  # fmt: skip
    assert view.gpu_models() == ["A100", "H100"]
    with pytest.raises(OptionError, match=r"mixes GPU models \(A100, H100\).*--gpu-model"):
        one_gpu_model(view, None, [])
    notes: list[str] = []
    pinned = one_gpu_model(view, "H100", notes)
    assert [n.node_id for n in pinned.nodes] == ["head", "h"] and pinned.gpus == 4
    assert notes == ["every GPU trial runs on H100 (4 GPUs of the cluster's 6)"]
    assert pinned.budget() is not None and pinned.budget().bytes < 60 * GIB  # type: ignore[union-attr]
    with pytest.raises(OptionError, match="its labelled models: A100, H100"):
        one_gpu_model(view, "V100", [])
    unlabelled = ClusterView((NodeView("n", "n", 8, 2, (_gpu("NVIDIA A100", 80, 79),)),))
    with pytest.raises(OptionError, match=r"is not a GPU model Ray labels.*--resources"):
        one_gpu_model(unlabelled, "NVIDIA A100", [])  # no resource to pin trials with
    one = ClusterView((NodeView("a", "a", 8, 2, (_gpu("NVIDIA A100", 80, 79),)),))
    assert one_gpu_model(one, None, []) is one  # one model (NVML's name): nothing to choose
    # A node Ray labelled and one only NVML names, of one model: one model, in Ray's words.
    sxm = (_gpu("NVIDIA A100-SXM4-80GB", 80, 79),)
    same = ClusterView((
        NodeView("a", "a", 8, 2, sxm, accelerator_types=("A100",)),
        NodeView("b", "b", 8, 2, sxm),
    ))  # fmt: skip
    assert same.gpu_models() == ["A100"]
    assert one_gpu_model(same, None, []) is same


def test_trials_pinned_to_a_model_ask_for_its_accelerator_type() -> None:
    from raybatch.cluster.placement import model_resource

    assert model_resource("A100") == {"accelerator_type:A100": 0.001}
    assert model_resource("accelerator_type:A100") == {"accelerator_type:A100": 0.001}
    assert model_resource(None) == {}
    nodes = [
        {"Alive": True, "Resources": {"GPU": 2.0, "accelerator_type:A100": 1.0}},
        {"Alive": True, "Resources": {"GPU": 4.0, "accelerator_type:H100": 1.0}},
    ]
    assert placeable_workers(nodes, True) == 6
    assert placeable_workers(nodes, True, "A100") == 2  # data-parallel workers: A100s only
    assert placeable_workers(nodes, False, "A100") == 0  # CPU workers are not pinned


def test_an_autoscaling_cluster_with_its_gpu_nodes_at_zero_is_still_a_gpu_cluster() -> None:
    """No GPU node alive yet, but the autoscaler may start 8 GPUs: trials default to GPUs
    (not silently to CPUs), go on with an explicit budget (said in the notes), and without one
    are refused with what to give, since no GPU's memory can be read before one exists."""
    from raybatch.cluster.hardware import gpu_request
    from raybatch.cluster.preflight import preflight
    from raybatch.errors import OptionError

    head = NodeView("head", "10.0.0.1", 8, 0)
    autoscaling = ClusterView((head,), autoscale_gpus=8)
    assert autoscaling.gpus_per_trial(None) == 1
    notes: list[str] = []
    assert gpu_request(autoscaling, 1.0, "16GiB", notes) == 1.0
    assert notes == ["no GPU node is alive yet: GPU trials wait for the autoscaler to start one"
                     " (up to 8 GPUs), with the memory budget given"]  # fmt: skip
    with pytest.raises(OptionError, match="memory_budget: no GPU node is alive yet"):
        gpu_request(autoscaling, None, None, [])
    fixed = ClusterView((head,))  # no autoscaler: GPUs asked of a CPU cluster are an error
    assert fixed.gpus_per_trial(None) == 0 and gpu_request(fixed, None, None, []) == 0
    # Several nodes, none with a GPU, no autoscaler that says otherwise (Ray's v1 publishes no
    # configuration, so GPU nodes at zero look like this): refused until the user says which.
    cpus = ClusterView((head, NodeView("worker", "10.0.0.2", 8, 0)))
    with pytest.raises(OptionError, match=r"gpus_per_trial: not given.*2-node cluster") as info:
        gpu_request(cpus, None, None, [])
    assert "--gpus-per-trial 0 for a CPU search" in str(info.value)
    assert "--gpus-per-trial 1 with --memory-budget" in str(info.value)
    assert gpu_request(cpus, 0, None, []) == 0  # a CPU search, said
    [warning] = preflight(cpus).warnings  # raybatch check says it before a search is started
    assert warning.startswith("a search would be refused: gpus_per_trial: not given")
    notes = []
    assert gpu_request(cpus, 1, "16GiB", notes) == 1  # GPU trials that wait for a v1 autoscaler
    assert len(notes) == 1 and "an autoscaler may start some" in notes[0] and "Ctrl-C" in notes[0]
    with pytest.raises(OptionError, match="memory_budget: no GPU node is alive yet"):
        gpu_request(cpus, 1, None, [])
    # A v2 autoscaler's configuration says what it may start: CPU nodes only, a CPU search.
    cpu_config = ClusterView((head, NodeView("worker", "10.0.0.2", 8, 0)), autoscale_cpus=32)
    assert gpu_request(cpu_config, None, None, []) == 0
    with pytest.raises(OptionError, match=r"gpus_per_trial: is 1\.0, but no node"):
        gpu_request(fixed, 1.0, "16GiB", [])


def test_an_autoscaler_s_gpus_count_for_a_pinned_model_only_where_its_node_types_are_that_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The autoscaler's config (Ray's own protobuf) declares 2 nodes of 8 A100s and 4 of one
    T4: a search pinned to A100 waits for 16 GPUs, not 20; node types that name no model cannot
    be told apart, so all of their GPUs count."""
    from ray._private.state import state
    from ray.core.generated import autoscaler_pb2

    import raybatch.cluster.hardware as hardware
    from raybatch.cluster import placement
    from raybatch.errors import OptionError

    def config(*groups: tuple[str | None, int, int]) -> autoscaler_pb2.ClusterConfig:
        out = autoscaler_pb2.ClusterConfig()
        for model, gpus, count in groups:
            group = out.node_group_configs.add(name=model or "gpu", max_count=count)
            group.resources["GPU"], group.resources["CPU"] = gpus, 8
            if model is not None:
                group.resources[f"accelerator_type:{model}"] = 1
        return out

    monkeypatch.setattr(state, "get_cluster_config", lambda: config(("A100", 8, 2), ("T4", 1, 4)))
    assert placement.autoscaling_max("GPU", "A100") == 16
    assert placement.autoscaling_max("GPU", "T4") == 4
    assert placement.autoscaling_max("GPU", "H100") == 0
    assert placement.autoscaling_max("CPU", "A100") == 16  # the CPUs of the A100 nodes
    assert placement.autoscaling_gpus_by_model() == (("A100", 16), ("T4", 4))
    head = NodeView("head", "10.0.0.1", 8, 0)
    view = ClusterView((head,), 20, 48, placement.autoscaling_gpus_by_model())
    assert view.of_model("A100").autoscale_gpus == 16  # was the autoscaler's 20 of any model
    notes: list[str] = []
    assert hardware.one_gpu_model(view, "T4", notes).autoscale_gpus == 4  # none alive yet
    with pytest.raises(OptionError, match=r"mixes GPU models \(A100, T4\)"):
        hardware.one_gpu_model(view, None, [])  # the models still to come are mixed too
    monkeypatch.setattr(state, "get_cluster_config", lambda: config((None, 4, 3)))
    assert placement.autoscaling_max("GPU", "A100") == 12  # no model named: every type counts
    assert placement.autoscaling_gpus_by_model() == ()
    assert ClusterView((head,), 12, 24).of_model("A100").autoscale_gpus == 12
    # A CPU-only node type without bound adds no GPUs to any model (read as Ray reads it).
    monkeypatch.setattr(state, "get_cluster_config", lambda: config(("A100", 8, 2), (None, 0, -1)))
    assert placement.autoscaling_max("GPU", "A100") == 16
    assert placement.autoscaling_max("GPU", "accelerator_type:A100") == 16
    assert view.of_model("accelerator_type:A100").autoscale_gpus == 16


def test_a_chosen_gpu_model_whose_nodes_are_at_zero_asks_for_the_budget() -> None:
    """A100 nodes up, the T4 nodes the user chose at zero under the autoscaler: no T4's memory
    can be read yet, so the search asks for --memory-budget (it said "NVML answered on none")."""
    from raybatch.cluster.gpu_budget import search_budget
    from raybatch.cluster.hardware import one_gpu_model
    from raybatch.errors import OptionError
    from raybatch.tuning.options import SearchOptions

    a100 = NodeView("a", "10.0.0.2", 16, 2, (_gpu("NVIDIA A100", 80, 79),), None, ("A100",))
    view = ClusterView((NodeView("head", "10.0.0.1", 8, 0), a100), 6, 24, (("A100", 2), ("T4", 4)))
    pinned = one_gpu_model(view, "T4", [])
    assert pinned.gpus == 0 and pinned.autoscale_gpus == 4
    with pytest.raises(OptionError, match=r"memory_budget: no T4 GPU node is alive yet.*up to 4"):
        search_budget(pinned, SearchOptions(gpu_model="T4"), True, [])
    notes: list[str] = []
    given = SearchOptions(gpu_model="T4", memory_budget="12GiB")
    assert search_budget(pinned, given, True, notes) == (12 * GIB, CUDA_CONTEXT_OVERHEAD_BYTES)
    assert "no GPU node is alive to measure it on" in notes[0]


# A zero-GPU Ray task under Ray's switch back to blanking CUDA_VISIBLE_DEVICES, on a node
# started on GPUs 2 and 3 (runtime_env sets both when the worker starts, as a node's raylet
# environment would); NVML is a stand-in for the driver, in the worker. The reader must budget
# GPUs 2 and 3, not read the blank as "every GPU" and keep GPUs 0 and 1; on a node started
# without the variable (every GPU Ray's), every GPU, not none.
_SWITCH = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}
_NODE_ON_GPUS_2_3 = {"env_vars": {**_SWITCH, "CUDA_VISIBLE_DEVICES": "2,3"}}


@pytest.mark.usefixtures("ray_session")
def test_the_nvml_reader_reads_the_node_s_gpus_when_ray_blanks_a_zero_gpu_task_s() -> None:
    import ray
    from ray import cloudpickle

    from . import fake_nvml

    cloudpickle.register_pickle_by_value(fake_nvml)  # the worker cannot import tests.*

    def read() -> tuple[str | None, list[str] | None]:
        import raybatch.cluster.nvml as nvml
        from raybatch.cluster.hardware import read_node_devices

        nvml.nvml = fake_nvml.FourGpus  # type: ignore[assignment]
        devices = read_node_devices()
        names = None if devices is None else [d.name for d in devices]
        return os.environ.get("CUDA_VISIBLE_DEVICES"), names

    on_2_3 = ray.remote(num_cpus=0, runtime_env=_NODE_ON_GPUS_2_3)(read)
    task_sees, reader_reads = ray.get(on_2_3.remote(), timeout=120)
    assert task_sees == ""  # Ray blanked it for this task: the switch is on
    assert reader_reads == ["GPU 2", "GPU 3"]
    if "CUDA_VISIBLE_DEVICES" not in os.environ:  # this session's node: started without it
        on_all = ray.remote(num_cpus=0, runtime_env={"env_vars": _SWITCH})(read)
        task_sees, reader_reads = ray.get(on_all.remote(), timeout=120)
        assert task_sees == ""
        assert reader_reads == ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]


def test_the_context_is_measured_on_the_gpu_ray_assigned_not_on_device_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` the task sees every GPU and Ray's
    GPU 3 is CUDA's device 3: the context is measured there, by the trials' own rule."""
    import torch

    from raybatch.cluster import gpu_budget as context

    measured_on: list[int] = []
    monkeypatch.setattr(context, "trial_device", lambda requested: torch.device("cuda", 3))
    monkeypatch.setattr(context, "measure_context_bytes", lambda i: measured_on.append(i) or 1)
    assert context._measure_on_gpu() == 1 and measured_on == [3]
    monkeypatch.setattr(context, "trial_device", lambda requested: torch.device("cpu"))
    assert context._measure_on_gpu() is None


def test_the_context_is_measured_after_every_kind_of_work_a_trial_may_load_kernels_for() -> None:
    """Lazy loading counts only the kernels called: the measuring step runs a convolution,
    fused attention, a half-precision matmul, a normalisation, a loss and the optimizer's
    update, forward and backward (run here on the CPU; the same ops on CUDA load each kind)."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.profiler import ProfilerActivity, profile

    from raybatch.cluster.context import typical_step

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        typical_step(torch.device("cpu"))
    ran = {e.key for e in prof.key_averages()}
    for kind in ("aten::convolution_backward", "aten::_scaled_dot_product", "aten::layer_norm",
                 "aten::nll_loss_backward", "Optimizer.step#AdamW.step"):  # fmt: skip
        assert any(name.startswith(kind) for name in ran), (kind, sorted(ran))

    made: set[torch.dtype] = set()

    class Outputs(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                made.add(out.dtype)
            return out

    with Outputs():
        typical_step(torch.device("cpu"))
    assert torch.bfloat16 in made  # the half-precision matmul and attention (cuBLASLt on CUDA)


def test_a_trial_numbers_gpus_as_nvml_does_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CUDA's default order (fastest first) may differ from NVML's and Ray's (PCI bus): the
    trial sets PCI order before CUDA starts, and keeps a user's own setting."""
    from raybatch.cluster.placement import trial_device

    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    trial_device("cpu")
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    trial_device("cpu")
    assert os.environ["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
