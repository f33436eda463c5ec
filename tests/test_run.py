"""The search end to end on digits: real Ray, real Optuna in SQLite, real training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import torch

import raybatch
from raybatch import keys
from raybatch.examples.digits import DigitsWorkload
from raybatch.memory.estimator import MemoryEstimator
from raybatch.results.rows import read_trials_csv
from raybatch.run.record import stored_result
from raybatch.run.rundir import STUDY_NAME
from raybatch.tuning.options import SearchOptions
from raybatch.tuning.scheduler import DEFAULT_SLACK
from raybatch.tuning.study import STATUS_ATTR

from .conftest import run_cli
from .workloads import CLOCKED_SECONDS, CLOCKED_TARGET_SAMPLES, ClockedWorkload

SPACE = raybatch.load_space("digits_cnn_sgd")
COMPLETE = optuna.trial.TrialState.COMPLETE
DIGITS = "raybatch.examples.digits:workload"


@pytest.fixture(scope="module")
def finished_run(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One small search under a tight budget: micro batches above 64 cannot fit."""
    # As the search builds it for its CPU trials: the trace projected for the CPU.
    estimator = MemoryEstimator.for_space(DigitsWorkload(), SPACE, cuda=False)
    budget = estimator.predict(SPACE.derive(64, 4))
    run_dir = tmp_path_factory.mktemp("run") / "digits"
    # No time model: the plan and the files under test do not need one (tests of the prior
    # measure it; this fixture is shared by a dozen tests and its minute is the suite's).
    # Every trial here reaches the target (the LR is fixed) and stops there, or is capped
    # behind the best: the caps only bound what cannot reach. A sample cap, not a time cap,
    # so that a loaded machine (a 15 s cap censored the confirmation's runs beside two busy
    # processes) changes no outcome. No rungs either (``zone=None``; the tests of the rungs are
    # in test_scheduler.py and the clocked run below): two trials compared at equal training
    # *seconds* are compared by how the machine shared its cores between them, and beside two
    # busy loops every trial of this search was stopped at a rung before any reached.
    options = SearchOptions(trials=6, max_time_s=60.0, max_samples=100_000, memory_budget=budget,
                            gpus_per_trial=0, confirm_top=1, confirm_seeds=2, seed=0,
                            prior=False, zone=None)  # fmt: skip
    # The LR fixed, so the plan is short (the max batch, a ladder point) and TPE suggests the
    # rest, some of them over the budget.
    data = SPACE.model_dump()
    data["search"]["lr_multiplier"] = None
    space = raybatch.SearchSpace.from_dict(data)
    result = raybatch.search(DigitsWorkload(), space, 0.97, run_dir, options, DIGITS, verbose=0)
    return {"result": result, "budget": budget, "run_dir": run_dir}


@pytest.mark.slow
def test_search_writes_every_file_of_the_run_directory(finished_run: dict[str, Any]) -> None:
    run_dir = finished_run["run_dir"]
    for name in ("run.json", "space.yaml", "optuna.db", "trials.csv", "best_config.yaml",
                 "best_config.json", "report.html", "time_vs_batch.png", "memory.png",
                 "history.png"):  # fmt: skip
        assert (run_dir / name).is_file(), name
    assert (run_dir / "tune" / "search").is_dir()
    page = (run_dir / "report.html").read_text()
    assert "reaches accuracy&gt;=0.97" in page and "optuna-dashboard sqlite:///optuna.db" in page
    assert '<a href="best_config.yaml">' in page  # a winner: its file is linked


@pytest.mark.slow
def test_the_runs_log_is_not_filled_with_tunes_warning_that_its_state_is_saved_often(
    finished_run: dict[str, Any],
) -> None:  # fmt: skip
    """Tune's state is saved whenever a trial saves a checkpoint (deliberately: a resume reads
    it), and Tune warned of it at every save, three lines each (111 of a real search's 111
    lines of log)."""
    log = (finished_run["run_dir"] / "search.log").read_text()
    assert "snapshotting has been triggered" not in log


@pytest.mark.slow
def test_trials_csv_and_the_optuna_study_agree(finished_run: dict[str, Any]) -> None:
    run_dir = finished_run["run_dir"]
    rows = read_trials_csv(run_dir / "trials.csv")
    search_rows = [r for r in rows if r["phase"] == "search"]
    prescreened = [r for r in rows if r["phase"] == "prescreen"]
    assert len(search_rows) == 6
    # Each says where it ran: its node (Tune's figure); its GPU, none on CPU.
    assert all(r["node_ip"] and not r["gpu_name"] and not r["gpu_id"] for r in search_rows)
    assert all(r["status"] == "prescreened_out" for r in prescreened)
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{run_dir / 'optuna.db'}")
    waiting = optuna.trial.TrialState.WAITING  # plan points queued that no trial reached
    asked = [t for t in study.trials if t.state != waiting]
    assert len(asked) == len(search_rows) + len(prescreened)
    by_tune_id = {t.user_attrs.get("tune_trial_id"): t for t in asked}
    for row in search_rows:
        trial = by_tune_id[row["trial_id"]]
        assert trial.user_attrs[STATUS_ATTR] == row["status"]
        capped = row["status"] == "capped"  # stopped by the scheduler: Optuna's own word
        assert trial.state == (optuna.trial.TrialState.PRUNED if capped else COMPLETE)
        assert int(trial.params.get("micro_batch_size", row["micro_batch_size"])) == int(
            row["micro_batch_size"]
        )
        if row["status"] == "reached":  # its learning curve, ending at the target
            steps = sorted(trial.intermediate_values)
            assert steps and steps[-1] == int(row["samples_to_target"])
            assert trial.intermediate_values[steps[-1]] >= 0.97
    # The LR is fixed: a trial reaches, is capped behind the best, or (a slow machine) meets its
    # time cap; the budget keeps the larger micro batches out before launch.
    statuses = {r["status"] for r in search_rows}
    assert "reached" in statuses and statuses <= {"reached", "capped", "censored"}, statuses
    assert prescreened
    assert all(t.state == COMPLETE for t in asked if t.user_attrs[STATUS_ATTR] != "capped")
    # The race's runs, in the study beside (optuna-dashboard lists both), as trials.csv has them.
    confirmed = [r for r in rows if r["phase"] == "confirmation"]
    assert confirmed  # the lone best recipe is run once more on a fresh seed
    race = optuna.load_study(study_name=f"{STUDY_NAME}-confirmation",
                             storage=f"sqlite:///{run_dir / 'optuna.db'}").trials  # fmt: skip
    assert [t.user_attrs["tune_trial_id"] for t in race] == [r["trial_id"] for r in confirmed]
    for row, run in zip(confirmed, race, strict=True):
        assert run.user_attrs["seed"] == int(row["seed"]) and run.params
        if row["status"] == "reached":
            assert run.value == pytest.approx(float(row["time_to_target_s"]))
            assert max(run.intermediate_values) == int(row["samples_to_target"])
    for row in search_rows:  # the objective is training time; evaluation is kept beside it
        if row["status"] == "reached":
            trained, evaluated = float(row["time_to_target_s"]), float(row["eval_s"])
            assert float(row["objective"]) == pytest.approx(trained)
            assert evaluated > 0
            assert float(row["elapsed_to_target_s"]) == pytest.approx(trained + evaluated)


@pytest.mark.slow
def test_no_launched_trial_exceeds_the_budget_and_rejections_are_listed(
    finished_run: dict[str, Any],
) -> None:
    rows = read_trials_csv(finished_run["run_dir"] / "trials.csv")
    launched = [r for r in rows if r["phase"] in ("search", "confirmation")]
    assert all(int(r["micro_batch_size"]) <= 64 for r in launched)
    prescreened = [r for r in rows if r["phase"] == "prescreen"]
    # Not vacuous: with this seed TPE's random start suggests 128 or 256, over the budget.
    assert prescreened
    assert all(int(r["micro_batch_size"]) > 64 for r in prescreened)
    assert all(int(r["peak_memory_bytes"]) > finished_run["budget"] for r in prescreened)


@pytest.mark.slow
def test_reference_recipe_and_max_batch_baseline_are_among_the_trials(
    finished_run: dict[str, Any],
) -> None:
    result = finished_run["result"]
    assert result.reference == {"micro_batch_size": 64, "accumulation_steps": 1, "world_size": 1}
    assert result.baseline == {"micro_batch_size": 64, "accumulation_steps": 1, "world_size": 1}
    first = next(r for r in result.rows if r.phase == "search")
    assert (first.micro_batch_size, first.accumulation_steps, first.lr_multiplier) == (
        64,
        1,
        1.0,
    )


CLOCKED_EVAL_EVERY = 64


@pytest.fixture(scope="module")
def clocked_run(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A search of :class:`ClockedWorkload` (time to target fixed per micro batch, so the
    optimum is known and nothing depends on the machine's speed), one trial at a time, so each
    trial's incumbent is known. The reference (128) and the max batch (256) run first; the
    optimum, 64, is not among them: the plan's ladder reaches it third. The capping rules
    themselves are proved on synthetic results in ``test_scheduler.py``; this is the whole
    search with them."""
    space = raybatch.SearchSpace.from_dict({
        "name": "clocked",
        "reference": {"batch_size": 128, "lr": 0.01, "optimizer": "sgd"},
        "rules": {"lr": "linear", "weight_decay": "none"},
        "search": {"micro_batch_size": [16, 32, 64, 128, 256], "accumulation_steps": [1]},
    })  # fmt: skip
    options = SearchOptions(trials=4, max_time_s=20.0, gpus_per_trial=0, confirm_seeds=1,
                            eval_every_samples=CLOCKED_EVAL_EVERY, seed=0, max_concurrent=1,
                            prior=False)  # fmt: skip
    run_dir = tmp_path_factory.mktemp("clocked")
    return raybatch.search(ClockedWorkload(), space, 0.99, run_dir, options, verbose=0)


@pytest.mark.slow
def test_capping_stops_slow_trials_and_the_optimum_still_wins(clocked_run: Any) -> None:
    """Capping stops trials slower than the incumbent before their target (so it saves their
    training) and the search still picks the optimum, which ran after slower trials had set
    the incumbent."""
    rows = [r for r in clocked_run.rows if r.phase == "search"]
    capped = [r for r in rows if r.status == "capped"]
    assert capped, rows
    assert all(r.train_s < CLOCKED_SECONDS[r.micro_batch_size] for r in capped)
    assert clocked_run.best is not None
    optimum = min(CLOCKED_SECONDS, key=CLOCKED_SECONDS.get)
    assert clocked_run.best.config.micro_batch_size == optimum
    assert rows[0].micro_batch_size != optimum  # not won by the first trial
    # Every other recipe is 3x the optimum's time or more: the search's runs decide, no race
    # is run (nor a lone recipe that reached run again), and the closing notes say which.
    reached = {r.micro_batch_size for r in rows if r.status == "reached"}
    assert [r for r in clocked_run.rows if r.phase == "confirmation"] == []
    said = "ahead of the next" if len(reached) > 1 else "only one recipe reached"
    assert any(said in n for n in clocked_run.notes), clocked_run.notes


@pytest.mark.slow
def test_capped_trials_stop_near_slack_times_the_incumbent(clocked_run: Any) -> None:
    """Each capped trial stopped before it would have reached the target: one stopped at a rung
    only when it truly is more than ``1 + zone`` slower than a recipe whose curve was there
    (the trials run one at a time: with stops, one before it; paused, one before or after it,
    since a paused trial is judged again on the curves seen since, and one still paused when
    the search ends stays capped there); one stopped at the final time within one evaluation
    interval after its cap (slack x the incumbent), and no earlier."""
    rows = [r for r in clocked_run.rows if r.phase == "search"]
    zone = SearchOptions().zone or 0.0
    paused = SearchOptions().pause
    checked = 0
    for i, row in enumerate(rows):
        if row.status != "capped":
            continue
        micro = row.micro_batch_size
        assert row.train_s < CLOCKED_SECONDS[micro]
        # Evaluations are off the clock (a trial capped at a heartbeat may have had none).
        assert row.elapsed_s >= row.train_s
        checked += 1
        seen = [r for r in rows if r is not row] if paused else rows[:i]
        if "rung" in row.reason:
            assert paused or i > 0  # with stops the first trial at a rung always goes on
            fastest_seen = min(CLOCKED_SECONDS[r.micro_batch_size] for r in seen)
            assert CLOCKED_SECONDS[micro] > (1 + zone) * fastest_seen
            continue
        # Its incumbent when it was capped: the fastest before it, or (paused) one of the
        # others' times, whichever was fastest by then.
        times = [r.time_to_target_s for r in seen if r.status == "reached" and r.time_to_target_s]
        incumbent = max(times) if paused else min(times)  # at most: the cap's upper bound
        interval = CLOCKED_SECONDS[micro] * CLOCKED_EVAL_EVERY / CLOCKED_TARGET_SAMPLES
        assert DEFAULT_SLACK * min(times) * 0.999 <= row.train_s
        assert row.train_s <= DEFAULT_SLACK * incumbent + interval + 0.3
    assert checked


@pytest.mark.slow
def test_load_best_builds_a_real_optimizer_and_schedule(finished_run: dict[str, Any]) -> None:
    best = raybatch.load_best(finished_run["run_dir"])
    assert (best.provenance.median_time_to_target_s or 0) > 0
    # One candidate (confirm_top=1): its search run(s) and one more run on a fresh seed.
    confirmation = [r for r in finished_run["result"].rows if r.phase == keys.PHASE_CONFIRMATION]
    assert len(confirmation) == 1 and confirmation[0].seed == 1
    assert len(best.provenance.time_to_target_s_runs or []) >= 2
    cost = best.provenance.search_cost
    assert cost is not None and cost.trainings > cost.trainings_train
    model = torch.nn.Linear(4, 2)
    optimizer = best.build_optimizer(model.parameters())
    assert isinstance(optimizer, torch.optim.SGD)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"]) == (best.config.lr, best.config.weight_decay)
    scheduler = best.build_scheduler(optimizer)
    assert scheduler.get_last_lr()[0] <= best.config.lr
    assert best.dataloader_kwargs() == {
        "batch_size": best.config.micro_batch_size,
        "drop_last": True,
    }
    exported = run_cli("export", str(finished_run["run_dir"]), "--format", "args")
    assert exported.returncode == 0
    assert f"--micro-batch-size {best.config.micro_batch_size}" in exported.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["search", "missing/wl.py:w", "--target", "0.97"],
            "missing/wl.py:w: no such file missing/wl.py",
        ),
        (
            ["search", DIGITS, "--target", "acc>0.9"],
            "command line: --target: must be METRIC>=VALUE",
        ),
        (
            ["search", DIGITS, "--target", "0.97", "--gpus-per-trial", "lots"],
            "command line: --gpus-per-trial: must be 'auto' or a number >= 0, got 'lots'",
        ),
        (
            ["search", DIGITS, "--target", "0.97", "--hang-grace", "0"],
            "command line: --hang-grace: must be a positive number, got 0.0",
        ),
        (
            ["search", DIGITS, "--target", "0.97", "--eval-every", "0"],
            "command line: --eval-every: must be an integer >= 1",
        ),
        (["resume", "/nonexistent/run"], "run.json: missing: not a raybatch run directory"),
        (["export", "/nonexistent/run"], "best_config: not found"),
    ],
)
def test_cli_bad_input_exits_2_with_a_clear_message(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before anything starts: the CLI's own app, in this process (each case needs no
    Ray; the console entry point itself is run as a user runs it by the tests that search)."""
    from typer.testing import CliRunner

    from raybatch.cli.app import app

    monkeypatch.chdir(Path(__file__).parent)  # where run_cli runs, so relative paths agree
    if args[0] == "search":
        args = [*args, "--run-dir", str(tmp_path / "r"), "--trials", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output[-2000:]
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()  # nothing written


def test_gpus_asked_of_a_machine_without_one_are_refused_through_the_console_script(
    tmp_path: Path,
) -> None:
    """Read from the Ray the search starts (a process of its own): no node has a GPU."""
    proc = run_cli("search", DIGITS, "--target", "0.97", "--gpus-per-trial", "1",
                   "--run-dir", str(tmp_path / "r"), "--trials", "1")  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "gpus_per_trial: is 1.0, but no node of the cluster has a GPU" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_example_training_script_uses_the_exported_recipe(finished_run: dict[str, Any]) -> None:
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "examples" / "train_with_best_config.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(finished_run["run_dir"]), "--epochs", "8"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    best = raybatch.load_best(finished_run["run_dir"])
    assert f"effective batch {best.config.effective_batch_size}" in proc.stdout
    accuracy = float(proc.stdout.rsplit(":", 1)[1])
    assert accuracy > 0.9


@pytest.mark.slow
def test_report_is_rebuilt_from_the_run_directory_alone(finished_run: dict[str, Any]) -> None:
    page = finished_run["run_dir"] / "report.html"
    verdict = page.read_text().split("<b>")[1].split("</b>")[0]
    page.unlink()
    proc = run_cli("report", str(finished_run["run_dir"]))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert page.read_text().split("<b>")[1].split("</b>")[0] == verdict


@pytest.mark.slow
def test_a_search_s_result_says_its_verdict_as_the_cli_does(finished_run: dict[str, Any]) -> None:
    """The README's Python example ends with ``print(raybatch.verdict(result))``: the result
    carries its target, and says what the run's stored files say."""
    result = finished_run["result"]
    said = raybatch.verdict(result)
    assert said.startswith("Winner: micro batch ") and "accuracy>=0.97" in said
    assert raybatch.verdict(stored_result(finished_run["run_dir"])) == said


CLUSTER_SEARCH = """
import json, subprocess, sys
import ray
from ray.cluster_utils import Cluster
from raybatch.cluster.connect import LOCAL_SYSTEM_CONFIG

cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 0, "_system_config": LOCAL_SYSTEM_CONFIG})
cluster.add_node(num_cpus=2)
cluster.wait_for_nodes()
proc = subprocess.run(
    [sys.executable, "-m", "raybatch", "search", WORKLOAD, "--space", SPACE,
     "--target", "0.9", "--trials", "3", "--run-dir", RUN_DIR, "--address", cluster.address,
     "--max-time-per-trial", "120", "--max-samples-per-trial", "200000",
     "--confirm-seeds", "0", "--gpus-per-trial", "0",
     "--quiet"],
    capture_output=True, text=True,
)
ray.init(address=cluster.address, log_to_driver=False)
jobs = [str(j.get("Entrypoint") or j.get("EntryPoint") or j) for j in ray._private.state.jobs()]
print("RESULT " + json.dumps({"rc": proc.returncode, "stderr": proc.stderr[-2000:],
                              "nodes": len([n for n in ray.nodes() if n["Alive"]]), "jobs": jobs}))
ray.shutdown()
cluster.shutdown()
"""


@pytest.mark.slow
def test_a_user_workload_file_searches_on_a_multi_node_cluster_through_address(
    tmp_path: Path,
) -> None:
    """A workload file of the user's, with a sibling module, on a two-node cluster: the head
    offers no CPU (as a cluster's head often does not), so every trial runs on the second
    node, whose workers get the code by value. Its trials are bounded by samples, not by a
    time cap, so that a loaded machine changes no outcome (the search must find a winner)."""
    import json
    import subprocess
    import sys

    from .userland import write_user_workload

    workload = write_user_workload(tmp_path / "user")
    script = tmp_path / "cluster_search.py"
    run_dir = tmp_path / "run"
    script.write_text(
        f"RUN_DIR = {str(run_dir)!r}\nWORKLOAD = {f'{workload}:workload'!r}\n"
        f"SPACE = {str(workload.with_name('space.yaml'))!r}\n" + CLUSTER_SEARCH
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=400, check=False, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert data["rc"] == 0, data["stderr"]
    assert data["nodes"] == 2
    # The GCS of this cluster knows the CLI's driver: it joined instead of starting a Ray.
    assert any("raybatch" in job for job in data["jobs"]), data["jobs"]
    rows = [r for r in read_trials_csv(run_dir / "trials.csv") if r["phase"] == "search"]
    assert len(rows) == 3
    assert {r["status"] for r in rows} <= {"reached", "censored", "capped"}, rows
