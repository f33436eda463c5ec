"""Per-trial resources: fractions from the estimate, on a real multi-node Ray cluster."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import raybatch
from raybatch.cluster.placement import (
    MAX_TRIALS_PER_GPU,
    packed_budget_bytes,
    packed_memory_fraction,
)
from raybatch.cluster.resources import DRIVER_CPUS, gpu_fraction, trial_resources
from raybatch.errors import OptionError
from raybatch.examples.digits import DigitsWorkload
from raybatch.memory.estimator import MemoryEstimator


@given(
    predicted=st.integers(min_value=1, max_value=10**11),
    budget=st.integers(min_value=1, max_value=10**11),
    context=st.integers(min_value=0, max_value=2**31),
)
def test_packed_trials_with_their_own_contexts_never_exceed_the_gpu(
    predicted: int, budget: int, context: int
) -> None:
    """k trials on one GPU: k CUDA contexts and k allocator caps fit what one trial alone may
    use plus its context, and each cap holds the trial's prediction (to Ray's 1e-4 rounding)."""
    fraction = gpu_fraction(predicted, budget, context_bytes=context)
    assert 0 < fraction <= 1
    packed = int(1 / fraction + 1e-9)  # how many such trials Ray puts on one GPU
    assert packed <= MAX_TRIALS_PER_GPU
    usable = budget + context
    if packed == 1:
        assert packed_memory_fraction(fraction, budget, usable, context) is None
        return
    assert packed * (predicted + context) <= usable
    total = usable * 10 // 9  # a GPU whose free memory x 0.9 headroom gave this budget
    cap = packed_memory_fraction(fraction, budget, total, context)
    assert cap is not None
    assert packed * (cap * total + context) <= usable + 1
    assert cap * total >= predicted - 1e-4 * usable


def test_a_packed_trial_without_a_budget_is_capped_at_its_share_of_the_gpu() -> None:
    """The Tune plugin path's trainable may carry no budget: its packed trials are capped all
    the same, from the GPU's total (its neighbours hold part of what is free), so that k of
    them and their contexts stay within the headroom of the whole GPU."""
    gib = 2**30
    total, context = 80 * gib, 800 * 2**20
    assert packed_budget_bytes(12 * gib, total, context) == 12 * gib  # the search's, kept
    budget = packed_budget_bytes(None, total, context)
    assert budget == int(0.9 * total) - context
    for packed in (2, 3, 4):
        cap = packed_memory_fraction(1 / packed, budget, total, context)
        assert cap is not None
        assert packed * (cap * total + context) <= 0.9 * total + 1


def test_three_trials_that_each_need_a_quarter_share_one_gpu() -> None:
    # Without contexts, shares follow the prediction alone...
    assert gpu_fraction(26, 100, context_bytes=0) == pytest.approx(1 / 3, abs=1e-4)
    assert gpu_fraction(25, 100, context_bytes=0) == 0.25
    # ...with them, every trial pays its own: 4 x (25 + 10) > 100 + 10, but 3 x 35 is not.
    assert gpu_fraction(25, 100, context_bytes=10) == pytest.approx(1 / 3, abs=1e-4)


def test_fixed_gpus_and_data_parallel_drivers() -> None:
    space = raybatch.load_space("deit_vit_adamw")
    resources = trial_resources(DigitsWorkload(), space, gpus_per_trial=0.5, cpus_per_trial=2)
    assert resources({"micro_batch_size": 64}) == {"cpu": 2, "gpu": 0.5}
    assert resources({"micro_batch_size": 64, "world_size": 4}) == {"cpu": DRIVER_CPUS, "gpu": 0}


def test_resources_read_the_recipe_a_config_carries_and_derive_only_bare_knobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The searcher's configs carry the recipe it derived: Tune's per-trial resource request
    reads it instead of deriving it again; a hand-written config of knobs is derived."""
    from raybatch.space.search_space import SearchSpace

    space = raybatch.load_space("deit_vit_adamw")
    carried = space.derive(64, world_size=4).to_dict()
    resources = trial_resources(DigitsWorkload(), space, gpus_per_trial=0.5, cpus_per_trial=2)
    derive = SearchSpace.derive
    calls: list[int] = []

    def counted(self: SearchSpace, *args: object, **kw: object) -> object:
        calls.append(1)
        return derive(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(SearchSpace, "derive", counted)
    assert resources(carried) == {"cpu": DRIVER_CPUS, "gpu": 0} and calls == []
    assert resources({"micro_batch_size": 64, "world_size": 4})["gpu"] == 0 and calls == [1]


def test_bad_gpus_per_trial_is_refused() -> None:
    with pytest.raises(OptionError, match="gpus_per_trial: must be 'auto' or a number"):
        trial_resources(DigitsWorkload(), raybatch.load_space("digits_cnn_sgd"), "many")


CLUSTER_SCRIPT = textwrap.dedent(
    """
    import json, time
    import ray
    from ray import tune
    from ray.cluster_utils import Cluster
    import raybatch
    from raybatch.examples.digits import DigitsWorkload
    from raybatch.memory.estimator import MemoryEstimator
    from raybatch.cluster.budget import CUDA_CONTEXT_OVERHEAD_BYTES as CONTEXT
    from raybatch.cluster.connect import LOCAL_SYSTEM_CONFIG
    from raybatch.cluster.resources import gpu_fraction, trial_resources

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "num_gpus": 1, "_system_config": LOCAL_SYSTEM_CONFIG})
    cluster.add_node(num_cpus=2, num_gpus=1)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    space = raybatch.load_space("digits_cnn_sgd")
    workload = DigitsWorkload()
    estimator = MemoryEstimator(workload, space.reference_config(), anchors=(16, 256))
    small, large = (estimator.predict(space.derive(b)) for b in (16, 256))
    # A budget where two micro-16 trials fit side by side, contexts included, but two of 256
    # do not: halfway between 2 x (small + context) and 2 x (large + context).
    budget = 2 * (small + CONTEXT) + (large - small) - CONTEXT

    def probe_trial(config):
        start = time.time()
        time.sleep(1.5)
        ctx = ray.get_runtime_context()
        tune.report({
            "gpu": ctx.get_assigned_resources().get("GPU", 0.0),
            "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
            "node": ctx.get_node_id(),
            "start": start,
            "end": time.time(),
        })

    resources = trial_resources(workload, space, "auto", cpus_per_trial=0.25, memory_budget=budget)
    tuner = tune.Tuner(
        tune.with_resources(probe_trial, resources),
        param_space={"micro_batch_size": tune.grid_search([16, 16, 16, 256, 256, 64])},
        tune_config=tune.TuneConfig(max_concurrent_trials=6),
        run_config=tune.RunConfig(storage_path=STORAGE, verbose=0),
    )
    results = tuner.fit()
    rows = []
    for r in results:
        recipe = space.derive_from(r.config)
        predicted = estimator.predict(recipe)
        rows.append(dict(r.metrics, micro=recipe.micro_batch_size, predicted=predicted,
                         expected=gpu_fraction(predicted, budget)))
    print("ROWS " + json.dumps({"budget": budget, "context": CONTEXT, "rows": rows}))
    ray.shutdown()
    cluster.shutdown()
    """
)


@pytest.mark.slow
def test_trials_on_a_multi_node_cluster_get_the_estimated_fraction_and_never_overpack(
    tmp_path: Path,
) -> None:
    """Real Ray, two nodes that declare one GPU each (Ray assigns ids without real GPUs).

    Runs in its own interpreter: one process can hold only one Ray cluster, and the test
    session's local Ray is already up.
    """
    script = tmp_path / "cluster.py"
    script.write_text(f"STORAGE = {str(tmp_path / 'results')!r}\n" + CLUSTER_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("ROWS "))
    data = json.loads(line[5:])
    budget, context, rows = data["budget"], data["context"], data["rows"]
    assert len(rows) == 6
    for row in rows:
        assert row["gpu"] == pytest.approx(row["expected"])
        assert len(row["gpu_ids"]) == 1
    assert {row["micro"]: row["expected"] for row in rows}[16] == 0.5
    assert {row["micro"]: row["expected"] for row in rows}[256] == 1.0
    # At no moment do trials sharing a GPU need more than its memory, each with its context.
    for row in rows:
        moment = (row["start"] + row["end"]) / 2
        sharing = [
            r for r in rows
            if (r["node"], r["gpu_ids"]) == (row["node"], row["gpu_ids"])
            and r["start"] <= moment <= r["end"]
        ]  # fmt: skip
        assert sum(r["predicted"] + context for r in sharing) <= budget + context
    assert len({r["node"] for r in rows}) == 2  # trials spread over both nodes


def test_trials_in_flight_is_what_the_cluster_can_run_at_once() -> None:
    """Tune keeps one trial pending at a time for a searcher without a concurrency limit, so
    the search sets the limit to what can run: CPUs per trial, and GPUs per trial."""
    from raybatch.cluster.hardware import trials_in_flight

    assert trials_in_flight({"CPU": 8.0}, 0, 1.0) == 8
    assert trials_in_flight({"CPU": 8.0}, 0, 3.0) == 2
    assert trials_in_flight({"CPU": 1.0}, 0, 4.0) == 1  # never 0: one trial always may run
    assert trials_in_flight({"CPU": 64.0, "GPU": 4.0}, 1, 1.0) == 4
    assert trials_in_flight({"CPU": 64.0, "GPU": 4.0}, 0.5, 1.0) == 8
    assert trials_in_flight({"CPU": 64.0, "GPU": 2.0}, "auto", 1.0) == 2 * MAX_TRIALS_PER_GPU
    assert trials_in_flight({"CPU": 6.0, "GPU": 2.0}, "auto", 1.0) == 6
    # An autoscaling cluster with its GPU nodes at zero: the trials wait on the GPUs the
    # autoscaler may start (which makes it start them), not one at a time.
    from raybatch.cluster.hardware import ClusterView, NodeView

    scaling = ClusterView((NodeView("head", "10.0.0.1", 16, 0),), autoscale_gpus=4)
    assert scaling.trials_at_once(1, 1.0) == 4
    assert scaling.trials_at_once("auto", 1.0) == 16
    # ... also where the head holds no CPU and the CPUs come with the GPU nodes.
    bare = ClusterView((NodeView("head", "10.0.0.1", 0, 0),), autoscale_gpus=4, autoscale_cpus=32)
    assert bare.trials_at_once(1, 1.0) == 4


@pytest.mark.usefixtures("ray_session")
def test_auto_resources_budget_from_the_clusters_gpus_not_the_drivers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CPU-only head has no NVML: connected to Ray, "auto" asks the GPU nodes (the smallest
    GPU of the cluster), so the public helper works from a laptop driving a GPU cluster."""
    import raybatch.cluster.budget as budget_module
    import raybatch.cluster.hardware as hardware
    from raybatch.cluster.nvml import DeviceMemory

    gib = 2**30
    gpu = DeviceMemory("A100", 40 * gib, 38 * gib, 2 * gib, 0)
    small = DeviceMemory("T4", 16 * gib, 1 * gib, 15 * gib, 0)  # another model, nearly full
    view = hardware.ClusterView((
        hardware.NodeView("w", "10.0.0.2", 8, 1, (gpu,), accelerator_types=("A100",)),
        hardware.NodeView("t", "10.0.0.3", 8, 1, (small,), accelerator_types=("T4",)),
    ))  # fmt: skip
    monkeypatch.setattr("raybatch.cluster.resources.read_cluster", lambda: view)  # its import
    monkeypatch.setattr(budget_module, "read_device_memory", lambda index: None)  # the head
    space = raybatch.load_space("digits_cnn_sgd")
    predicted = MemoryEstimator.for_space(DigitsWorkload(), space).predict(space.derive(64))
    resources = trial_resources(DigitsWorkload(), space, "auto", gpu_model="A100")
    share = resources(space.derive(64).to_dict())["gpu"]
    expected = gpu_fraction(predicted, view.of_model("A100").budget().bytes)  # type: ignore[union-attr]
    assert 0 < share == expected
    # Two models and none pinned: refused, as the CLI refuses it, saying how to pin one.
    with pytest.raises(OptionError, match=r"mixes GPU models \(A100, T4\).*gpu_model='A100'"):
        trial_resources(DigitsWorkload(), space, "auto")
    # A larger CUDA context: the budget leaves room for it and each share pays it.
    context = 6 * gib
    resources = trial_resources(
        DigitsWorkload(), space, "auto", gpu_model="A100", context_bytes=context
    )
    budget = view.of_model("A100").budget(context_bytes=context).bytes  # type: ignore[union-attr]
    share = resources(space.derive(64).to_dict())["gpu"]
    default = gpu_fraction(predicted, view.of_model("A100").budget().bytes)  # type: ignore[union-attr]
    assert share == gpu_fraction(predicted, budget, context_bytes=context) > default
    # Pinned to the A100s, the T4's little free memory does not shrink the budget.
    assert view.of_model("A100").budget().bytes > view.budget().bytes  # type: ignore[union-attr]


def test_gpu_trials_pinned_to_a_model_ask_for_it_and_data_parallel_drivers_do_not() -> None:
    space = raybatch.load_space("digits_cnn_sgd")
    resources = trial_resources(DigitsWorkload(), space, 0.5, gpu_model="A100")
    assert resources(space.derive(64).to_dict()) == {
        "cpu": 1.0, "gpu": 0.5, "accelerator_type:A100": 0.001,
    }  # fmt: skip
    assert resources({**space.derive(64).to_dict(), "alone": True})["gpu"] == 1.0
    assert "accelerator_type:A100" in resources({**space.derive(64).to_dict(), "alone": True})
    driver = resources(space.derive(32, 1, 2).to_dict())  # its workers are pinned instead
    assert driver == {"cpu": DRIVER_CPUS, "gpu": 0.0}
    cpu = trial_resources(DigitsWorkload(), space, 0, gpu_model="A100")
    assert cpu(space.derive(64).to_dict()) == {"cpu": 1.0, "gpu": 0.0}


@pytest.mark.usefixtures("ray_session")
def test_the_cuda_context_is_measured_on_a_gpu_or_said_to_be_assumed() -> None:
    """No GPU alive, or none free in time: the assumed context, and the notes say why; the
    search neither fails nor waits for this figure."""
    from raybatch.cluster.budget import CUDA_CONTEXT_OVERHEAD_BYTES
    from raybatch.cluster.gpu_budget import cluster_context_bytes
    from raybatch.cluster.hardware import ClusterView, NodeView

    notes: list[str] = []
    cpus = ClusterView((NodeView("head", "10.0.0.1", 3, 0),))
    assert cluster_context_bytes(cpus, None, notes) == CUDA_CONTEXT_OVERHEAD_BYTES
    assert notes == ["CUDA context assumed 512.00 MiB: no GPU node is alive to measure it on"]
    # A GPU the view counts but Ray cannot place a task on (this session has none).
    gpus = ClusterView((NodeView("w", "10.0.0.2", 3, 1),))
    assert cluster_context_bytes(gpus, None, notes, timeout_s=1) == CUDA_CONTEXT_OVERHEAD_BYTES
    assert notes[-1].endswith("no GPU free to measure it on within 1 s")


def test_a_larger_cuda_context_packs_fewer_trials_and_caps_them_lower() -> None:
    """The measured context reaches the packing: each packed process pays its own."""
    gib = 2**30
    small, large = 256 * 2**20, 2 * gib
    assert gpu_fraction(gib, 20 * gib, context_bytes=small) < gpu_fraction(
        gib, 20 * gib, context_bytes=large
    )
    assert packed_memory_fraction(0.25, 20 * gib, 40 * gib, small) > packed_memory_fraction(  # type: ignore[operator]
        0.25, 20 * gib, 40 * gib, large
    )
    fn = raybatch.trainable(
        DigitsWorkload(), "digits_cnn_sgd", 0.97, gpu_budget_bytes=gib, cuda_context_bytes=large
    )
    assert raybatch.RaybatchSearcher.for_trainable(fn).devices.context_bytes == large


def test_the_search_plan_hands_the_measured_cuda_context_to_every_receiver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The context measured at a GPU search's start reaches the budget, the searcher's packing,
    the trainable's allocator caps and the resources' shares: none of them keeps 512 MiB."""
    import raybatch.cluster.hardware as hardware
    import raybatch.run.driver as driver
    from raybatch.cluster.nvml import DeviceMemory
    from raybatch.trial.settings import parts_of
    from raybatch.tuning.options import SearchOptions

    gib = 2**30
    measured = 3 * gib  # far from the 512 MiB assumed where nothing can be measured
    gpu = DeviceMemory("A100", 40 * gib, 38 * gib, 2 * gib, 0)
    view = hardware.ClusterView(
        (hardware.NodeView("w", "10.0.0.2", 8, 1, (gpu,), accelerator_types=("A100",)),)
    )
    monkeypatch.setattr(driver, "read_cluster", lambda: view)
    monkeypatch.setattr("raybatch.cluster.gpu_budget.cluster_context_bytes", lambda *a: measured)
    # The real steps at the top of the range would wait for a GPU this Ray does not have.
    monkeypatch.setattr("raybatch.cluster.gpu_budget.cluster_boundary", lambda *a, **k: None)
    received: dict[str, int] = {}
    import raybatch.trial.with_resources as resources_module

    def resources(fn, *args, **kw):  # type: ignore[no-untyped-def]
        received["trainable"] = parts_of(fn).settings.cuda_context_bytes
        return with_resources(fn, *args, **kw)  # the real one, reading the trainable's parts

    def shares(*args, **kw):  # type: ignore[no-untyped-def]
        received["resources"] = args[7]  # the context each packed share pays
        return trial_resources(*args, **kw)

    with_resources, trial_resources = driver.with_resources, resources_module.trial_resources
    monkeypatch.setattr(driver, "with_resources", resources)
    monkeypatch.setattr(resources_module, "trial_resources", shares)
    space = raybatch.load_space("digits_cnn_sgd")
    options = SearchOptions(prior=False)
    plan = driver._plan(tmp_path, DigitsWorkload(), space, raybatch.Target(0.9), options)
    assert plan.cuda and plan.searcher.devices.context_bytes == measured
    assert received == {"trainable": measured, "resources": measured}
    assert plan.budget == view.budget(context_bytes=measured).bytes  # type: ignore[union-attr]


@pytest.mark.usefixtures("ray_session")
def test_the_plugin_path_reads_the_cluster_as_the_search_does_and_its_trials_carry_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``with_resources(fn, "auto")`` of a trainable with no budget, on a Ray cluster with
    GPUs: one model (mixed ones refused unless pinned), its CUDA context measured, its budget
    read; the trainable carries both from then on, so every packed trial caps its allocator
    with the figures its share was computed from, and a searcher built from it pre-screens
    with them. A fixed share is said to turn capping off; a bad one is refused by name."""
    import raybatch
    import raybatch.cluster.hardware as hardware
    from raybatch.cluster.nvml import DeviceMemory
    from raybatch.examples.digits import workload
    from raybatch.trial.settings import parts_of

    gib = 2**30
    a100 = DeviceMemory("A100", 40 * gib, 38 * gib, 2 * gib, 0)
    t4 = DeviceMemory("T4", 16 * gib, 14 * gib, 2 * gib, 0)
    view = hardware.ClusterView((
        hardware.NodeView("w", "10.0.0.2", 8, 1, (a100,), accelerator_types=("A100",)),
        hardware.NodeView("t", "10.0.0.3", 8, 1, (t4,), accelerator_types=("T4",)),
    ))  # fmt: skip
    measured = 700 * 2**20

    def context(view: Any, model: str | None, notes: list[str]) -> int:
        notes.append(f"CUDA context measured on {model}: 700 MiB per trial")
        return measured

    monkeypatch.setattr("raybatch.trial.with_resources.read_cluster", lambda: view)
    monkeypatch.setattr("raybatch.trial.with_resources.cluster_context_bytes", context)
    mixed = raybatch.trainable(workload, "digits_cnn_sgd", target=0.9, max_time_s=5)
    with pytest.raises(OptionError, match=r"gpu_model='A100'"):
        raybatch.with_resources(mixed, "auto")
    fn = raybatch.trainable(workload, "digits_cnn_sgd", target=0.9, max_time_s=5,
                            gpu_model="A100")  # fmt: skip
    with caplog.at_level(logging.INFO, logger="raybatch.trial.with_resources"):
        resourced = raybatch.with_resources(fn, "auto")
    # What every trial runs with, and what a searcher built from fn pre-screens with.
    settings = parts_of(resourced).settings
    assert parts_of(fn).settings == settings
    searcher = raybatch.RaybatchSearcher.for_trainable(fn)
    budget = view.of_model("A100").budget(context_bytes=measured)
    assert budget is not None and settings.gpu_budget_bytes == budget.bytes
    assert settings.cuda_context_bytes == measured
    assert "CUDA context measured on A100" in caplog.text
    space = raybatch.load_space("digits_cnn_sgd")
    predicted = MemoryEstimator.for_space(workload, space).predict(space.derive(64))
    asked = resourced._resources(space.derive(64).to_dict())
    assert asked["gpu"] == gpu_fraction(predicted, budget.bytes, context_bytes=measured)
    fits = [g for g in searcher.gates if getattr(g, "budget_bytes", None) is not None]
    assert [g.budget_bytes for g in fits] == [budget.bytes]  # type: ignore[attr-defined]
    assert searcher.devices.context_bytes == measured
    with caplog.at_level(logging.WARNING, logger="raybatch.trial.with_resources"):
        raybatch.with_resources(fn, 0.5)
    assert "gpus_per_trial=0.5: every trial shares its GPU" in caplog.text
    with pytest.raises(OptionError, match="gpus_per_trial"):
        raybatch.with_resources(fn, "half")


def test_with_resources_reads_a_trainables_settings_and_refuses_a_plain_function() -> None:
    """Nothing is given twice: the budget and the context a trial's share is computed with are
    the trainable's own; a function raybatch did not make is pointed to trial_resources."""
    import raybatch
    from raybatch.examples.digits import workload

    def plain(config: dict[str, Any]) -> None: ...

    with pytest.raises(TypeError, match="trial_resources"):
        raybatch.with_resources(plain)
    fn = raybatch.trainable(workload, "digits_cnn_sgd", target=0.9, max_time_s=5,
                            gpu_budget_bytes=2**30, cuda_context_bytes=2**28)  # fmt: skip
    resourced = raybatch.with_resources(fn, "auto", 0.5)
    space = raybatch.load_space("digits_cnn_sgd")
    config = space.derive(64, 1, 1).to_dict()
    asked = resourced._resources(config)  # Tune's resource function, as Tune calls it
    given = trial_resources(workload, space, "auto", 0.5, 2**30, None, None, 2**28)(config)
    other = trial_resources(workload, space, "auto", 0.5, 2**31, None, None, 2**28)(config)
    assert asked == given != other and asked["cpu"] == 0.5
