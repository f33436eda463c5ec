"""The GPU check's offline start, its targets, its results folder and its record of the code.

What needs a GPU runs on one (``make gpu-check``); these prove, on any machine, that the
scripts start on the lent GPU machine (torch and NVML, no Ray, Optuna or pydantic), that a
missed target fails the check, and that a result says which code it measured.
"""

from __future__ import annotations

import importlib
import io
import json
import math
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
GPU_SCRIPTS = (
    "gpu_trial_timing",
    "gpu_check",
    "gpu_memory_accuracy",
    "gpu_memory_history",
    "gpu_recipe_times",
)
HIDDEN = ("ray", "optuna", "pydantic")

HIDE = """
import importlib.abc, sys

class _Absent(importlib.abc.MetaPathFinder):
    # What the lent GPU machine lacks: importing it fails, as it would there.
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {hidden!r}:
            raise ImportError(f"No module named {{name!r}} (not on the GPU machine)")

sys.meta_path.insert(0, _Absent())
"""


def _load(name: str) -> ModuleType:
    """A bench module, imported as the scripts import their siblings (``bench/`` on the path)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


@pytest.fixture
def offline(tmp_path: Path) -> dict[str, str]:
    """The environment of the lent GPU machine, as far as a CPU machine can stand for it: Ray,
    Optuna and pydantic cannot be imported (a ``sitecustomize`` on ``PYTHONPATH``), CUDA is
    hidden (no visible device), and results go to a folder of the test's own."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE.format(hidden=HIDDEN))
    return {
        **os.environ,
        "PYTHONPATH": f"{hide}{os.pathsep}{REPO}",
        "CUDA_VISIBLE_DEVICES": "",
        "RAYBATCH_RESULTS_DIR": str(tmp_path / "results"),
    }


def _python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def test_the_hiding_hides_ray_optuna_pydantic_and_cuda(
    offline: dict[str, str], tmp_path: Path
) -> None:
    """The control: under the fixture, what the GPU machine lacks cannot be imported here."""
    done = _python(
        """
        import importlib, torch
        for name in ("ray", "optuna", "pydantic"):
            try:
                importlib.import_module(name)
            except ImportError:
                print("hidden", name)
        print("cuda", torch.cuda.is_available())
        """,
        offline,
        tmp_path,
    )
    assert done.stdout.split("\n")[:4] == [*(f"hidden {n}" for n in HIDDEN), "cuda False"]


@pytest.mark.parametrize("script", GPU_SCRIPTS)
def test_each_gpu_script_starts_offline_and_says_there_is_no_cuda(
    script: str, offline: dict[str, str], tmp_path: Path
) -> None:
    done = subprocess.run([sys.executable, str(BENCH / f"{script}.py")], env=offline,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"{script}: no CUDA device here; run this on a GPU machine."
    assert not (tmp_path / "results").exists()  # nothing written without a GPU


def test_the_gpu_checks_whole_import_path_and_a_trial_run_offline(
    offline: dict[str, str], tmp_path: Path
) -> None:
    """Beyond each script's top: every module its checks import inside functions, every
    stored recipe, and a real trial through ``run_trial`` (the probe-then-trial check's path)
    with the stored recipes standing in for the space, on the CPU."""
    done = _python(
        """
        import sys
        sys.path.insert(0, "BENCH")
        import gpu_check, gpu_memory_accuracy, gpu_memory_history, gpu_trial_timing
        import gpu_recipe_times
        from gpu_recipes import USED, StoredSpace, recipe
        import raybatch
        from raybatch.examples.digits import DigitsWorkload
        from raybatch.cluster.context import measure_context_bytes
        from raybatch.trial.gpu_monitor import UtilizationMonitor
        from raybatch.trial.settings import TrialSettings
        from raybatch.trial.wrapper import run_trial
        from raybatch.trial.loop import LoopOptions, optimizer_step, LoopParts
        from raybatch.trial.ema import WeightAverage
        from raybatch.memory.probe import steady_step, is_out_of_memory
        from raybatch.cluster.nvml import nvml
        from raybatch.cluster.placement import limit_packed_memory

        print("recipes", sum(recipe(n, b).micro_batch_size > 0 for n, s in USED.items() for b in s))
        rows = gpu_memory_accuracy.predictions({"mlp": [2, 4]}, dtypes=(None,))
        print("predicted", all(r["predicted_bytes"] > 0 for r in rows))
        settings = TrialSettings(raybatch.Target(0.5), max_time_s=20, eval_every_samples=512)
        reporter = run_trial(DigitsWorkload(), StoredSpace("digits_cnn_sgd"), settings,
                             {"micro_batch_size": 64}, lambda r: None)
        print("trial", reporter.status.value)
        loaded = {m.split(".")[0] for m in sys.modules}
        print("loaded", sorted(loaded & {"ray", "optuna", "pydantic"}))
        """.replace("BENCH", str(BENCH)),
        offline,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    recipes = sum(len(sizes) for sizes in _load("gpu_recipes").USED.values())
    assert done.stdout.splitlines() == [f"recipes {recipes}", "predicted True", "trial reached",
                                        "loaded []"]  # fmt: skip


def test_make_gpu_check_stops_at_once_without_cuda(offline: dict[str, str]) -> None:
    env = {**offline, "PYTHON": sys.executable, "PIP_INDEX_URL": "http://0.0.0.0:9/none"}
    done = subprocess.run(["bash", str(BENCH / "gpu_offline.sh")], env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2
    assert "gpu-check: no CUDA device here" in done.stderr
    assert not Path(offline["RAYBATCH_RESULTS_DIR"]).exists()


# ---------------------------------------------------------------- targets


def test_a_target_is_met_only_by_a_measured_value_on_its_side() -> None:
    t = _load("gpu_targets")
    assert t.at_most("e", 0.01, 0.02).met and not t.at_most("e", 0.03, 0.02).met
    assert t.at_least("n", 3, 3).met and not t.at_least("n", 2, 3).met
    assert t.within("r", 1.0, 0.98, 1.02).met and not t.within("r", 0.9, 0.98, 1.02).met
    assert t.holds("h", True).met and not t.holds("h", False).met and not t.holds("h", 1).met
    for unmeasured in (None, math.nan, math.inf, True):  # a bool is no measurement of a size
        assert not t.at_most("e", unmeasured, 1e9).met
        assert not t.at_least("e", unmeasured, -1e9).met


def test_a_missed_target_fails_the_check_and_says_which(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = _load("gpu_targets")
    monkeypatch.setenv("RAYBATCH_RESULTS_DIR", str(tmp_path))
    met = [t.at_most("clock_error", 0.001, 0.02), t.holds("no_oom", True)]
    assert t.exit_status(met) == 0
    assert t.exit_status([]) == t.MISSED  # a check that states no target checks nothing
    goals = [*met, t.at_most("clock_error_unsynchronised", 0.3, 0.02)]
    at = {"commit": "abc", "clean": None, "date": "d"}
    assert t.finish("gpu_x", {"benchmark": "gpu_x"}, goals, at) == t.MISSED == 3
    out = capsys.readouterr().out
    assert "gpu_x: MISSED clock_error_unsynchronised: 0.3 (target <= 0.02)" in out
    assert "gpu_x: 1 target(s) missed" in out
    record = json.loads((tmp_path / "gpu_x.json").read_text())
    assert record["targets"]["clock_error_unsynchronised"] == {
        "target": "<= 0.02", "measured": 0.3, "met": False,
    }  # fmt: skip
    assert record["targets"]["no_oom"]["met"] is True and record["measured_at"] == at


def test_gpu_offline_sh_goes_on_past_a_failed_check_and_fails_at_the_end(tmp_path: Path) -> None:
    """The runner, with the three scripts replaced by stand-ins: one misses a target, one
    crashes, one passes, each still runs, and the run fails naming the two."""
    copy = tmp_path / "repo"
    (copy / "bench").mkdir(parents=True)
    (copy / "bench" / "gpu_offline.sh").write_text((BENCH / "gpu_offline.sh").read_text())
    stand_ins = {"gpu_trial_timing": "sys.exit(3)", "gpu_check": "raise RuntimeError('boom')",
                 "gpu_memory_accuracy": "pass", "gpu_memory_history": "pass",
                 "gpu_recipe_times": "pass"}  # fmt: skip
    for name, body in stand_ins.items():
        (copy / "bench" / f"{name}.py").write_text(f"import sys\nprint('ran {name}')\n{body}\n")
    fake_torch = tmp_path / "fake" / "torch"
    fake_torch.mkdir(parents=True)
    (fake_torch / "__init__.py").write_text(
        "class cuda:\n    @staticmethod\n    def is_available():\n        return True\n"
    )
    results = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(tmp_path / "fake"),
           "RAYBATCH_RESULTS_DIR": str(results)}  # fmt: skip
    done = subprocess.run(["bash", str(copy / "bench" / "gpu_offline.sh")], env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    for name in stand_ins:
        assert f"ran {name}" in done.stdout
    assert "gpu-check: FAILED: gpu_trial_timing (a target missed)" in done.stdout
    assert "gpu-check: FAILED: gpu_check (crashed, exit status 1)" in done.stdout
    assert "gpu_memory_accuracy (" not in done.stdout
    assert "gpu_memory_history (" not in done.stdout
    assert "gpu_recipe_times (" not in done.stdout
    assert "ran gpu_check" in (results / "gpu-check.log").read_text()


# ---------------------------------------------------------------- the results and their code


def test_results_go_to_the_folder_the_environment_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    provenance = _load("provenance")
    monkeypatch.delenv("RAYBATCH_RESULTS_DIR", raising=False)
    assert provenance.results_dir() == REPO / "bench" / "results"
    monkeypatch.setenv("RAYBATCH_RESULTS_DIR", str(tmp_path / "out"))
    assert provenance.results_dir() == tmp_path / "out"


def test_a_result_records_the_commit_from_git_with_the_source_hash() -> None:
    provenance = _load("provenance")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    at = provenance.measured_tree()
    assert at["commit"] == head and at["commit_from"] == "git"
    assert at["source_sha256"] == provenance.source_sha256()


def test_a_copy_without_git_records_the_given_commit_and_a_hash_that_matches_it(
    tmp_path: Path,
) -> None:
    """The lent machine's case: the tree of HEAD copied without its git directory says the
    commit it was given, and its source hash is the one git computes for HEAD."""
    provenance = _load("provenance")
    copy = tmp_path / "copy"
    copy.mkdir()
    tar = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=REPO,
                         capture_output=True, check=True).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(copy, filter="data")
    (copy / "bench" / "results" / "gpu_check.json").write_text("{}")  # results are not code
    (copy / "bench" / "__pycache__").mkdir(exist_ok=True)
    (copy / "bench" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    env = {**os.environ, "RAYBATCH_COMMIT": "0123abc", "GIT_CEILING_DIRECTORIES": str(tmp_path)}

    def measured_tree() -> dict[str, object]:
        """What the copy's own provenance records, in a fresh interpreter inside it."""
        done = subprocess.run(
            [sys.executable, "-c",
             "import json, provenance; print(json.dumps(provenance.measured_tree()))"],
            cwd=copy / "bench", env=env, capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        return dict(json.loads(done.stdout))

    at = measured_tree()
    assert (at["commit"], at["commit_from"], at["clean"]) == ("0123abc", "RAYBATCH_COMMIT", None)
    assert at["source_sha256"] == provenance.commit_source_sha256("HEAD")
    (copy / "raybatch" / "keys.py").write_text("# edited\n")  # other code: another hash
    assert provenance.source_sha256(copy) != at["source_sha256"]
    # A copy that carries a git directory of another commit (as a lent machine's may): the
    # commit its sender names wins, and git's own HEAD is kept beside it.
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "older"]):
        subprocess.run([*git, *args], cwd=copy, check=True, capture_output=True, timeout=60)
    told = measured_tree()
    assert (told["commit"], told["commit_from"]) == ("0123abc", "RAYBATCH_COMMIT")
    assert told["git_head"] and told["git_head"] != "0123abc"


# ---------------------------------------------------------------- the stored recipes


def test_the_stored_recipes_are_what_the_presets_derive() -> None:
    recipes = _load("gpu_recipes")
    stored = json.loads(recipes.FILE.read_text())
    assert stored == json.loads(json.dumps(recipes.derive_all())), (
        "run python bench/gpu_recipes.py and commit bench/gpu_recipes.json"
    )


def test_a_recipe_at_another_micro_batch_has_the_memory_the_preset_derives() -> None:
    """``at_micro_batch`` keeps the reference's LR: the memory estimate must not notice."""
    import raybatch
    from raybatch.memory.estimator import MemoryEstimator

    recipes = _load("gpu_recipes")
    models = _load("models")
    space = raybatch.load_space("generic_adamw")
    reference = recipes.recipe("generic_adamw")
    estimator = MemoryEstimator(models.MLP(), reference, anchors=(1, 64))
    for b in (1, 7, 300, 5000):
        moved, derived = recipes.at_micro_batch(reference, b), space.derive(b)
        assert estimator.predict(moved) == estimator.predict(derived)
        assert (moved.micro_batch_size, moved.effective_batch_size) == (b, b)
        assert (moved.optimizer, moved.optimizer_kwargs) == (
            derived.optimizer, dict(derived.optimizer_kwargs),
        )  # fmt: skip


def test_the_stored_space_gives_only_stored_recipes() -> None:
    import raybatch

    recipes = _load("gpu_recipes")
    stored = recipes.StoredSpace("digits_cnn_sgd")
    assert stored.recipe_of({"micro_batch_size": 64, "seed": 3}) == raybatch.load_space(
        "digits_cnn_sgd"
    ).derive(64)
    with pytest.raises(KeyError, match="only the micro batch"):
        stored.recipe_of({"micro_batch_size": 64, "accumulation_steps": 2})
    with pytest.raises(KeyError, match=r"run python bench/gpu_recipes\.py"):
        stored.recipe_of({"micro_batch_size": 65})


def test_a_known_miss_is_said_and_recorded_but_only_a_new_miss_turns_the_check_red(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target missed as known (the memory ratios, waiting on issue 49's trace work) is
    printed and recorded with why, and leaves the exit status green; any other miss beside it
    turns it red; a known miss met again says to drop it."""
    t = _load("gpu_targets")
    monkeypatch.setenv("RAYBATCH_RESULTS_DIR", str(tmp_path))
    check = "gpu_memory_accuracy"
    ratio = t.at_least("min_predicted_over_allocated", 0.74, 0.95)
    at = {"commit": "abc", "clean": None, "date": "d"}
    assert t.finish(check, {"benchmark": check}, [ratio, t.holds("no_oom", True)], at) == 0
    out = capsys.readouterr().out
    assert f"{check}: KNOWN  min_predicted_over_allocated: 0.74 (target >= 0.95) -- known" in out
    assert f"{check}: 1 targets met, 1 known miss(es)" in out
    targets = json.loads((tmp_path / f"{check}.json").read_text())["targets"]
    assert targets["min_predicted_over_allocated"]["met"] is False
    assert "issue 49" in targets["min_predicted_over_allocated"]["known_miss"]
    regression = t.holds("no_admitted_oom", False)
    assert t.exit_status([ratio, regression], check) == t.MISSED
    assert t.exit_status([ratio], "gpu_check") == t.MISSED  # known for one check only
    mended = t.at_least("min_predicted_over_allocated", 0.97, 0.95)
    assert "a known miss met: drop it" in t.summary(check, [mended])
    # Every known miss names a target its check states (a renamed one would stay quiet).
    for (name, goal), why in t.KNOWN_MISSES.items():
        assert f'"{goal}"' in (BENCH / f"{name}.py").read_text() and "issue" in why


def test_the_trace_holds_the_checks_bounds_on_the_transformer_and_mlp_it_measured() -> None:
    """Today's trace against the GPU check's committed measurement (an H100's allocated peaks
    of one real step in fp32 and bf16): within the check's own bounds, 0.95-1.15, for the
    transformer (attention and dropout as CUDA's kernels run them; the CPU's ops gave
    1.11-1.49) and the MLP up to micro batch 1024 (two cuBLAS workspaces; one gave 0.93).
    The MLP at 4096 is a known miss (``gpu_targets.KNOWN_MISSES``)."""
    gpu_memory_accuracy = _load("gpu_memory_accuracy")
    committed = json.loads((BENCH / "results" / "gpu_memory_accuracy.json").read_text())
    measured = {
        (row["workload"], row["amp"], row["micro_batch_size"]): row["allocated_bytes"]
        for row in committed["peaks"]
    }
    sizes = {"transformer": gpu_memory_accuracy.SIZES["transformer"], "mlp": [64, 256, 1024]}
    ratios = {
        (row["workload"], row["amp"], row["micro_batch_size"]): row["predicted_bytes"]
        / measured[(row["workload"], row["amp"], row["micro_batch_size"])]
        for row in gpu_memory_accuracy.predictions(sizes)
    }
    assert len(ratios) == 14
    low, high = 1 - gpu_memory_accuracy.UNDER_AT_MOST, 1 + gpu_memory_accuracy.OVER_AT_MOST
    assert all(low <= r <= high for r in ratios.values()), ratios


def _event(action: str, addr: int, mib: float, *frames: tuple[str, str]) -> dict[str, object]:
    """One entry of the allocator's history as ``torch.cuda.memory._snapshot`` gives it, its
    frames innermost first."""
    return {"action": action, "addr": addr, "size": int(mib * 2**20), "stream": 0,
            "frames": [{"filename": f, "line": 7, "name": n} for f, n in frames]}  # fmt: skip


def test_the_history_replay_finds_the_allocators_peak_and_what_was_alive_at_it() -> None:
    """The replay of ``bench/gpu_memory_history.py`` on a history written by hand: the peak
    where allocated bytes are highest, the blocks alive then with the phase whose marker came
    before each and the frame that allocated it, and the control (frees ignored) above."""
    h = _load("gpu_memory_history")
    mark = h.MARK_BYTES["forward"] / 2**20
    probe_py, models_py = "/r/raybatch/memory/probe.py", "/r/bench/models.py"
    torch_py = "/site-packages/torch/nn/functional.py"
    events = [
        _event("alloc", 1, 100, (probe_py, "steady_step")),
        _event("alloc", 2, mark, ("/r/bench/gpu_memory_history.py", "_mark")),
        _event("free_requested", 2, mark),
        _event("alloc", 3, 300, (torch_py, "linear"), (models_py, "forward")),
        _event("alloc", 4, 32),  # no Python frame: another thread's
        _event("free_requested", 3, 300),
        _event("alloc", 5, 200, (torch_py, "linear")),
    ]
    run = h.replay(events)
    assert run.peak_bytes == 432 * 2**20 and run.peak_index == 4
    assert run.phases == (None, "forward", "forward", "forward", "forward", "forward", "forward")
    groups = {(g["phase"], g["where"]): g["bytes"] // 2**20 for g in h.grouped(run.live)}
    assert groups == {
        ("before the step", "memory/probe.py:7 steady_step"): 100,
        ("forward", "bench/models.py:7 forward"): 300,
        ("forward", "no Python frame (autograd's or a library's own thread)"): 32,
    }
    assert h.replay(events, start=5).peak_bytes == 332 * 2**20  # the peak from event 5 on
    assert h.replay(events, frees=False).peak_bytes > run.peak_bytes  # the control
    assert h.where(events[6]) == "torch functional.py:7 linear"


def test_only_blocks_of_the_workspaces_size_never_freed_count_as_workspaces() -> None:
    h = _load("gpu_memory_history")
    ws = h.CUBLAS_WORKSPACE_BYTES / 2**20
    events = [
        _event("alloc", 1, ws),  # the forward's workspace, kept
        _event("alloc", 2, ws),  # an activation of the same size, freed
        _event("free_requested", 2, ws),
        _event("alloc", 3, 64),
        _event("free_requested", 3, 64),
        _event("alloc", 3, ws),  # the backward's workspace, at an address freed before: kept
    ]
    assert h.persistent_workspaces(events, upto=5) == 1
    assert h.persistent_workspaces(events) == 2


def test_the_history_checks_findings_and_page_from_a_history_written_by_hand() -> None:
    """``findings`` and ``markdown`` as ``main`` calls them, on a recorded run written by hand:
    a forward alone that keeps one workspace, then a step whose backward keeps a second; each
    step's replay agrees with its probe's peak, and every control fails as it should."""
    from raybatch.memory.probe import ProbeResult

    h = _load("gpu_memory_history")
    ws, mib = h.CUBLAS_WORKSPACE_BYTES / 2**20, lambda name: h.MARK_BYTES[name] / 2**20
    mark = ("/r/bench/gpu_memory_history.py", "_mark")
    events = [
        _event("alloc", 1, ws, ("/r/bench/models.py", "forward")),  # the forward's workspace
        _event("alloc", 2, 64, ("/r/bench/models.py", "forward")),
        _event("free_requested", 2, 64),
        _event("alloc", 3, 80, ("/r/raybatch/memory/probe.py", "steady_step")),  # parameters
        _event("alloc", 4, mib("forward"), mark),
        _event("free_requested", 4, mib("forward")),
        _event("alloc", 5, 64, ("/r/bench/models.py", "forward")),
        _event("alloc", 6, mib("backward"), mark),
        _event("free_requested", 6, mib("backward")),
        _event("alloc", 7, ws),  # the backward's workspace
        _event("alloc", 8, 64),
        _event("free_requested", 8, 64),
        _event("free_requested", 5, 64),
        _event("free_requested", 3, 80),
    ]
    peak = int((ws + 80 + 64 + ws + 64) * 2**20)
    result = ProbeResult(True, "cuda:0", 4096, peak, peak, 0.1)
    recorded = {"events": events, "forward_end": 3, "steps": [("mlp", None, 4096, 3, result)]}
    rows, goals = h.findings(recorded)
    assert all(g.met for g in goals), [g for g in goals if not g.met]
    (row,) = rows
    assert row["replay_peak_bytes"] == peak and row["replay_peak_phase"] == "backward"
    assert row["trace"]["peak_bytes"] > 0
    page = h.markdown({"steps": rows})
    assert "| backward | no Python frame" in page and "The trace at its peak, MiB:" in page
    assert "## mlp fp32 at micro batch 4096: allocated" in page
    assert [g.name for g in goals][:2] == [
        "replay_peak_is_the_allocators_mlp_fp32_4096",
        "control_replay_without_frees_reads_above_mlp_fp32_4096",
    ]


def test_the_fp16_overflow_check_meets_its_targets_on_the_cpus_scaler() -> None:
    """``gpu_check.fp16_overflow`` as the GPU check runs it, on the CPU's ``GradScaler`` (which
    skips a step as CUDA's does): the overflow skips the weights, warmup and the average, the
    next step moves both, and the control's naive schedule moves on the overflow."""
    data, goals = _load("gpu_check").fp16_overflow("cpu")
    assert [g.name for g in goals if not g.met] == [], data
    assert data["overflow_step"]["scale_after"] < data["overflow_step"]["scale_before"]


def test_the_recipe_times_check_times_a_recipe_and_reads_its_findings_on_the_cpu() -> None:
    """``gpu_recipe_times`` as the GPU check runs it, its device the CPU: a recipe reaches
    with a time, the control's unreachable target does not read as reached, and the findings
    (rank agreement, packed over alone) come from the rows as recorded."""
    import torch

    g = _load("gpu_recipe_times")
    cpu = torch.device("cpu")
    one = g.time_to_target(64, cpu)
    assert one["status"] == "reached" and one["time_to_target_s"] > 0
    control = g.time_to_target(64, cpu, target=1.01, max_time_s=0.5)
    assert control["status"] != "reached" and control["time_to_target_s"] is None
    rows = [{"micro_batch_size": b, "status": "reached", "time_to_target_s": t}
            for b, t in ((16, 3.0), (64, 1.0), (256, 2.0))]  # fmt: skip
    other = [{**r, "time_to_target_s": r["time_to_target_s"] * 2} for r in rows]
    packed = [{"rank": i, "status": "reached", "time_to_target_s": 2.5} for i in range(g.PACKED)]
    data, goals = g.findings(rows, other, control, rows[1], packed)
    assert data["gpu_vs_cpu_spearman"] == 1.0 and data["fastest_on_gpu"] == 64
    assert data["packed_over_alone_median"] == 2.5
    assert [x.name for x in goals if not x.met] == []
    _, goals = g.findings(rows, other, one, rows[1], packed[:2])  # the control reached; one lost
    assert {x.name for x in goals if not x.met} == {
        "packed_all_reach_none_out_of_memory",
        "control_unreachable_target_is_not_reached",
    }
