"""GPUs and clusters as users run them, on an emulated cluster: a head node without GPUs and two
worker nodes declaring two GPUs each (``ray.cluster_utils.Cluster``; Ray assigns GPU ids and
sets ``CUDA_VISIBLE_DEVICES`` exactly as on real GPU nodes, there is just no CUDA behind them).

The cluster lives in a helper process for the module (one process holds one Ray, and the test
session's local Ray is already up); every command reaches it through ``--address``, from a
working directory outside the repository, as a user's would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from raybatch.run.rundir import OPTUNA_DB, STUDY_NAME
from raybatch.tuning.study import SearchStudy

from .conftest import start_emulated_cluster

pytestmark = pytest.mark.slow

CLUSTER = textwrap.dedent(
    """
    import sys
    from ray.cluster_utils import Cluster
    from raybatch.cluster.connect import LOCAL_SYSTEM_CONFIG

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "num_gpus": 0, "include_dashboard": False,
                        "_system_config": LOCAL_SYSTEM_CONFIG},
    )
    for model in ("A100", "H100"):  # two GPU models, as Ray labels them
        cluster.add_node(num_cpus=2, num_gpus=2, resources={f"accelerator_type:{model}": 1})
    cluster.wait_for_nodes()
    print("ADDRESS " + cluster.address, flush=True)
    sys.stdin.read()  # until the tests close our stdin
    cluster.shutdown()
    """
)

DEVICES = textwrap.dedent(
    """
    import json, os, sys
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=sys.argv[1], log_to_driver=False)

    def decide():
        import torch
        # Only CUDA is faked (there is none behind the declared GPUs); Ray's assignment is real.
        torch.cuda.is_available = lambda: True
        from raybatch.cluster.placement import assigned_gpu_ids, assigned_gpu_share, trial_device
        return {"ids": assigned_gpu_ids(), "share": assigned_gpu_share(),
                "device": str(trial_device()), "node": ray.get_runtime_context().get_node_id()}

    gpu_nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]
    on_gpu_node = NodeAffinitySchedulingStrategy(gpu_nodes[0], soft=False)
    out = {
        "whole": ray.get(ray.remote(num_cpus=0.1, num_gpus=1)(decide).remote()),
        "half": ray.get(ray.remote(num_cpus=0.1, num_gpus=0.5)(decide).remote()),
        "none_on_a_gpu_node": ray.get(
            ray.remote(num_cpus=0.1, num_gpus=0)(decide).options(
                scheduling_strategy=on_gpu_node).remote()),
        "gpu_nodes": gpu_nodes,
    }
    print("OUT " + json.dumps(out))
    """
)


PACKED = textwrap.dedent(
    """
    import json, sys
    import ray, torch
    from ray import tune
    import raybatch
    from raybatch.examples.digits import DigitsWorkload
    from raybatch.memory.estimator import MemoryEstimator
    from raybatch.tuning.gates import Devices, search_gates
    from raybatch.tuning.plan import Plan
    from raybatch.tuning.searcher import RaybatchSearcher
    from raybatch.tuning.study import SearchStudy
    from raybatch.cluster.placement import assigned_gpu_share

    ray.init(address=sys.argv[1], log_to_driver=False)

    class PackedOOM(DigitsWorkload):
        \"\"\"Runs out of memory whenever it shares its GPU: a neighbour's growth, emulated
        (there is no CUDA behind the declared GPUs; Ray's packing and the retry are real).\"\"\"

        def build_model(self):
            share = assigned_gpu_share()
            if share is not None and share < 1:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (a neighbour grew)")
            return super().build_model()

    workload, space = PackedOOM(), raybatch.load_space("digits_cnn_sgd")
    budget = 4 * 2**30
    estimator = MemoryEstimator.for_space(workload, space)
    searcher = RaybatchSearcher(
        space, penalty=60.0, study=SearchStudy(f"sqlite:///{sys.argv[2]}/optuna.db", "packed"),
        plan=Plan(space, [{"micro_batch_size": 64, "accumulation_steps": 1,
                           "lr_multiplier": 1.0}]),
        gates=search_gates(estimator, budget, 0.0, True),
        devices=Devices(True, None, (estimator, budget)),
    )
    fn = raybatch.trainable(workload, space, target=0.5, max_time_s=5, device="cpu",
                            gpu_budget_bytes=budget)
    tuner = tune.Tuner(
        raybatch.with_resources(fn, "auto", 0.5, estimator=estimator),
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=2, max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=sys.argv[2], name="packed", verbose=0),
    )
    rows = [dict(r.metrics, config=r.config) for r in tuner.fit()]
    trials = searcher.study.trials
    print("OUT " + json.dumps({
        "rows": [{k: r.get(k) for k in ("status", "gpu_share", "reason")}
                 | {"alone": r["config"].get("alone", False)} for r in rows],
        "optuna": [(t.state.name, t.constraints) for t in trials],
    }))
    """
)


SUGGEST = textwrap.dedent(
    """
    import json, sys
    import ray
    import raybatch
    from raybatch.tuning.gates import Devices, search_gates
    from raybatch.tuning.plan import Plan
    from raybatch.tuning.searcher import RaybatchSearcher
    from raybatch.tuning.study import SearchStudy

    ray.init(address=sys.argv[1], log_to_driver=False)
    space = raybatch.SearchSpace.from_yaml(sys.argv[2])
    points = [{"micro_batch_size": 64, "world_size": w, "lr_multiplier": 1.0} for w in (8, 1)]
    searcher = RaybatchSearcher(space, penalty=60.0,
                                study=SearchStudy(f"sqlite:///{sys.argv[3]}/suggest.db", "s"),
                                plan=Plan(space, points), gates=search_gates(None, None, 0.0, True),
                                devices=Devices(True))
    config = searcher.suggest("t0")
    print("OUT " + json.dumps({
        "launched_world_size": config["world_size"],
        "reasons": {str(p.params["world_size"]): p.reason for p in searcher.prescreened},
    }))
    """
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, address = start_emulated_cluster(tmp_path_factory.mktemp("cluster") / "c.py", CLUSTER)
    yield address
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=120)


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory outside the repository."""
    return tmp_path


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raybatch", *args],
        capture_output=True, text=True, check=False, cwd=cwd, timeout=300,
    )  # fmt: skip


def _space(tmp_path: Path, world_sizes: str) -> Path:
    """The digits space, smaller batches, with data-parallel world sizes."""
    from raybatch.space.presets import resolve_space_path

    text = resolve_space_path("digits_cnn_sgd").read_text()
    for old, new in (
        ("world_size: [1]", f"world_size: {world_sizes}"),
        ("micro_batch_size: [16, 32, 64, 128, 256]", "micro_batch_size: [16, 32, 64]"),
        ("accumulation_steps: [1, 2, 4]", "accumulation_steps: [1, 2]"),
    ):
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def test_check_reports_the_gpus_of_the_worker_nodes_not_the_head(
    cluster: str, elsewhere: Path
) -> None:
    space = _space(elsewhere, "[1, 2, 4, 8]")
    proc = run_cli(
        "check", "raybatch.examples.digits:workload", "--space", str(space),
        "--address", cluster, "--memory-budget", "1GiB", "--json", cwd=elsewhere,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert (report["gpus"], report["gpu_nodes"], report["trial_device"]) == (4, 2, "cuda")
    assert report["budget_bytes"] == 2**30
    unplaceable = {r["world_size"]: r["placement"] for r in report["unplaceable"]}
    assert unplaceable == {8: "needs 8 GPUs, the cluster has 4"}
    assert all(r["trials_per_gpu"] >= 1 for r in report["recipes"] if r["world_size"] == 1)
    # The GPU nodes were asked through NVML, which has no driver to read here: said, not hidden.
    assert any("NVML did not answer on GPU node(s)" in w for w in report["warnings"])
    # As the search does, check measures the CUDA context on a GPU node (no CUDA behind these).
    assert (
        "CUDA context assumed 512.00 MiB: NVML or CUDA did not answer on the GPU node"
        in (report["warnings"])
    )

    without = run_cli("check", "--address", cluster, "--json", cwd=elsewhere)
    assert without.returncode == 0, without.stderr[-3000:]
    bare = json.loads(without.stdout)
    assert bare["budget_bytes"] is None
    assert any("a search needs --memory-budget" in w for w in bare["warnings"])


def test_each_trial_device_follows_the_gpus_ray_assigned_to_it(
    cluster: str, tmp_path: Path
) -> None:
    script = tmp_path / "devices.py"
    script.write_text(DEVICES)
    proc = subprocess.run(
        [sys.executable, str(script), cluster],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("OUT "))[4:])
    whole, half, none = out["whole"], out["half"], out["none_on_a_gpu_node"]
    assert (whole["device"], len(whole["ids"]), whole["share"]) == ("cuda:0", 1, 1.0)
    assert (half["device"], len(half["ids"]), half["share"]) == ("cuda:0", 1, 0.5)
    # A trial holding no GPU trains on the CPU, even on a GPU node where CUDA "is available".
    assert none["node"] in out["gpu_nodes"]
    assert (none["device"], none["ids"], none["share"]) == ("cpu", [], 0.0)


def test_a_search_through_the_address_requests_gpus_and_prescreens_unplaceable_recipes(
    cluster: str, elsewhere: Path
) -> None:
    """The driver here has no GPU; the search still plans GPU trials from the cluster, which
    mixes two GPU models: refused until one is chosen (their times cannot be ranked together).
    Pinned to A100s, Ray gives each trial a GPU there, and each trial then says plainly that
    this torch has no CUDA — every trial the same way, so the search stops early. World size 8
    never launches."""
    space = _space(elsewhere, "[1, 8]")
    run = elsewhere / "run"
    args = (
        "search", "raybatch.examples.digits:workload", "--space", str(space),
        "--target", "0.9", "--trials", "8", "--address", cluster, "--memory-budget", "1GiB",
        "--max-time-per-trial", "5", "--run-dir", "run", "--quiet", "--seed", "3",
    )  # fmt: skip
    mixed = run_cli(*args, cwd=elsewhere)
    assert mixed.returncode == 2, mixed.stderr[-3000:]
    assert "the cluster mixes GPU models (A100, H100)" in mixed.stderr
    assert "choose one with --gpu-model (e.g. --gpu-model A100)" in mixed.stderr
    assert not (run / "run.json").exists()  # refused before any trial: the same dir again
    proc = run_cli(*args, "--gpu-model", "A100", cwd=elsewhere)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "TrialDeviceError: Ray assigned GPU" in proc.stderr
    assert "torch.cuda is not available in its process" in proc.stderr
    study = SearchStudy(f"sqlite:///{run / OPTUNA_DB}", STUDY_NAME)
    assert not [t for t in study.study.trials if t.params.get("world_size") == 8
                and t.user_attrs.get("status") != "prescreened_out"]  # fmt: skip
    # Stopped early, it leaves no ghost: what it suggested or queued and never ran is closed.
    ghosts = [t.number for t in study.study.trials if t.state.name in ("RUNNING", "WAITING")]
    assert ghosts == [], ghosts
    # A trial that failed is told COMPLETE with the penalty (TPE must learn to avoid it; it
    # ignores FAIL trials), its status and reason beside it for optuna-dashboard.
    errored = [t for t in study.study.trials if t.user_attrs.get("status") == "error"]
    assert errored and all("TrialDeviceError" in t.user_attrs["reason"] for t in errored)
    # Whether TPE proposed world size 8 before the search stopped depends on timing; the same
    # searcher, on this cluster, given it first, pre-screens it with the count and launches
    # the next point.
    script = elsewhere / "suggest.py"
    script.write_text(SUGGEST)
    out = subprocess.run([sys.executable, str(script), cluster, str(space), str(elsewhere)],
                         capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    result = json.loads(out.stdout.split("OUT ", 1)[1])
    assert result["launched_world_size"] == 1
    assert result["reasons"] == {"8": "needs 8 GPUs, the cluster has 4"}


def test_a_trial_that_runs_out_of_memory_while_packed_is_retried_alone_once(
    cluster: str, tmp_path: Path
) -> None:
    """Through Ray Tune, the searcher and the resource request on the emulated cluster: the
    first trial is packed (1/8 of a GPU), runs out of memory, and is not taught infeasible;
    the same Optuna trial runs again holding a whole GPU, and there it trains."""
    script = tmp_path / "packed.py"
    script.write_text(PACKED)
    proc = subprocess.run(
        [sys.executable, str(script), cluster, str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("OUT "))[4:])
    packed, alone = sorted(out["rows"], key=lambda r: r["alone"])
    assert packed["status"] == "infeasible_memory" and packed["gpu_share"] < 1, packed
    assert alone["alone"] and alone["gpu_share"] == 1.0
    assert alone["status"] in ("reached", "censored"), alone["reason"]
    [(state, constraints)] = out["optuna"]  # one Optuna trial for both runs
    assert state == "COMPLETE" and constraints == {"memory": 0.0}


def test_a_ray_of_our_own_prestarts_no_idle_workers(tmp_path: Path) -> None:
    """The Ray a search starts for itself is told not to prestart idle workers for its driver:
    a search's trials never ran in them (two processes started and were ended unused)."""
    probe = textwrap.dedent(
        """
        import ray
        from ray._private.state import state
        from raybatch.cluster.connect import init_ray

        assert init_ray(None)
        print(state.get_system_config().get("prestart_worker_first_driver"), flush=True)
        ray.shutdown()
        """
    )
    script = tmp_path / "probe.py"
    script.write_text(probe)
    own = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, check=False)  # fmt: skip
    assert own.returncode == 0, own.stderr[-2000:]
    assert own.stdout.strip().splitlines()[-1] == "False"
