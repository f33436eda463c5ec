"""Recipes timed to their target on the GPU and on the CPUs, and one recipe packed three to a GPU.

Issue 49, item 5. A search ranks recipes by their time to the target, and raybatch's own
benchmarks rank them on CPUs; on a big GPU a small model is host-bound (a ResNet-18 trial used
8 % of an H200), so a GPU's ranking may not be a CPU's. This check trains the same six recipes
of the bundled digits CNN (the ``digits_cnn_sgd`` preset at micro batches 16 to 512, the
learning rate scaled by the preset's rule) to accuracy 0.97 with the trial's own loop
(``raybatch.trial.loop.train``, its reporter and clock as a trial builds them), three times
each from one seed, on the GPU and on the machine's CPUs, and records each median time to
target and the rank agreement (Spearman).
Then one of them trains alone on the GPU, and three at once in three processes, each capped by
the trial's own ``limit_packed_memory`` at a third of the GPU: the packed times over the lone
one, by how much a packed run's clock is not a lone run's (why the race compares lone runs).

Targets: every recipe reaches the target on both devices; the three packed runs all reach it,
none out of memory. The control: the same loop with a target no recipe reaches does not read
as reached. The rank agreement and the packed slowdown are findings, recorded without a
target: what they are is the question.

Run on a GPU machine: python bench/gpu_recipe_times.py (writes gpu_recipe_times.json to
``$RAYBATCH_RESULTS_DIR``, default bench/results/); exits 3 when a target is missed. Without
CUDA it says so, writes nothing and exits 0. About a minute on an H100.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from queue import Empty
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from gpu_recipes import recipe
from gpu_targets import Goal, begin, finish, holds

import raybatch
from raybatch.examples.digits import DigitsWorkload
from raybatch.timemodel.model import spearman
from raybatch.trial.clock import TrialClock
from raybatch.trial.loop import LoopOptions, train
from raybatch.trial.reporting import TrialReporter

REQUIRES_GPU = True
NAME = "gpu_recipe_times"
SPACE = "digits_cnn_sgd"
MICRO_BATCHES = (16, 32, 64, 128, 256, 512)
TARGET = 0.97
MAX_TIME_S = 15.0
"""A recipe's cap: the digits CNN reaches 0.97 in a few seconds at every one of them on a
laptop's CPU."""
CONTROL_TIME_S = 3.0
EVAL_EVERY_SAMPLES = 512
REPEATS = 3
PACKED = 3
PACKED_MICRO_BATCH = 64
WARM_UP_S = 2.0
"""Each packed process first trains this long before the barrier (CUDA's start, the kernels'
loading): the lone run's median comes after a warm start, and a packed run's must too."""
PACKED_WAIT_S = 90.0
"""How long the check waits for a packed run's record: its start, CUDA's, and a capped run."""


def time_to_target(
    micro_batch_size: int,
    device: torch.device,
    target: float = TARGET,
    max_time_s: float = MAX_TIME_S,
) -> dict[str, Any]:
    """One recipe trained by the trial's loop until it reaches ``target`` (or its cap)."""
    synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    reporter = TrialReporter(
        raybatch.Target(target),
        eval_every_samples=EVAL_EVERY_SAMPLES,
        max_time_s=max_time_s,
        report_fn=lambda metrics: None,
        clock=TrialClock(synchronize=synchronize),  # as a trial on the device has it
    )
    try:
        train(DigitsWorkload(), recipe(SPACE, micro_batch_size), reporter, device,
              LoopOptions(seed=0))  # fmt: skip
    finally:
        reporter.close()
    return {
        "micro_batch_size": micro_batch_size,
        "device": device.type,
        "status": reporter.status.value,
        "time_to_target_s": reporter.tally.time_to_target_s,
    }


def repeated(micro_batch_size: int, device: torch.device) -> dict[str, Any]:
    """The recipe trained ``REPEATS`` times from the same seed (the same steps: only the clock
    varies), its median time to target; reached only if every run reached."""
    runs = [time_to_target(micro_batch_size, device) for _ in range(REPEATS)]
    times = sorted(r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None)
    reached = len(times) == len(runs)
    return {
        "micro_batch_size": micro_batch_size,
        "device": device.type,
        "status": "reached"
        if reached
        else next(r["status"] for r in runs if r["status"] != "reached"),
        "time_to_target_s": times[len(times) // 2] if reached else None,
        "runs_s": [r["time_to_target_s"] for r in runs],
    }


def _packed_run(rank: int, budget: int, barrier: Any, out: Any) -> None:
    """One of the packed runs: capped by the trial's own call, started with the others."""
    from raybatch.cluster.placement import limit_packed_memory
    from raybatch.errors import first_line

    device = torch.device("cuda", 0)
    record: dict[str, Any] = {"rank": rank}
    try:
        record["fraction"] = limit_packed_memory(device, budget, share=1 / PACKED)
        time_to_target(PACKED_MICRO_BATCH, device, max_time_s=WARM_UP_S)  # CUDA's start, as alone
        barrier.wait(timeout=PACKED_WAIT_S / 2)
        record.update(time_to_target(PACKED_MICRO_BATCH, device))
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {first_line(exc)}"
    out.put(record)


def packed_runs() -> list[dict[str, Any]]:
    """The recipe trained by ``PACKED`` processes at once, each capped at its share."""
    import torch.multiprocessing as mp

    from raybatch.cluster.budget import resolve_budget

    budget = resolve_budget().bytes
    spawn = mp.get_context("spawn")
    barrier, queue = spawn.Barrier(PACKED), spawn.Queue()
    processes = [
        spawn.Process(target=_packed_run, args=(i, budget, barrier, queue)) for i in range(PACKED)
    ]
    for p in processes:
        p.start()
    records = []
    for _ in processes:
        try:
            records.append(queue.get(timeout=PACKED_WAIT_S))
        except Empty:  # a process that died without a word: the target says fewer reached
            break
    for p in processes:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    return sorted(records, key=lambda r: r["rank"])


def findings(
    gpu: list[dict[str, Any]],
    cpu: list[dict[str, Any]],
    control: dict[str, Any],
    alone: dict[str, Any],
    packed: list[dict[str, Any]],
) -> tuple[dict[str, Any], list[Goal]]:
    """The rank agreement, the packed slowdown, and the targets (module docstring)."""
    both = [(g["time_to_target_s"], c["time_to_target_s"]) for g, c in zip(gpu, cpu, strict=True)
            if g["time_to_target_s"] and c["time_to_target_s"]]  # fmt: skip
    lone = alone.get("time_to_target_s")
    slowdowns = [r["time_to_target_s"] / lone for r in packed if lone and r.get("time_to_target_s")]
    data = {
        "gpu_vs_cpu_spearman": spearman([a for a, _ in both], [b for _, b in both]),
        "fastest_on_gpu": _fastest(gpu),
        "fastest_on_cpu": _fastest(cpu),
        "packed_over_alone": slowdowns,
        "packed_over_alone_median": sorted(slowdowns)[len(slowdowns) // 2] if slowdowns else None,
    }
    goals = [
        holds("every_recipe_reaches_on_the_gpu", _reached(gpu), "reached"),
        holds("every_recipe_reaches_on_the_cpus", _reached(cpu), "reached"),
        holds("alone_reaches", _reached([alone]), "reached"),
        holds(
            "packed_all_reach_none_out_of_memory",
            len(packed) == PACKED and _reached(packed),
            f"{PACKED} reached",
        ),
        holds(
            "control_unreachable_target_is_not_reached",
            control.get("status") not in (None, "reached"),
            "not reached",
        ),
    ]
    return data, goals


def _reached(rows: list[dict[str, Any]]) -> bool:
    return all(r.get("status") == "reached" for r in rows)


def _fastest(rows: list[dict[str, Any]]) -> int | None:
    """The micro batch of the fastest recipe that reached."""
    timed = [r for r in rows if r.get("time_to_target_s")]
    return min(timed, key=lambda r: r["time_to_target_s"])["micro_batch_size"] if timed else None


def main() -> int:
    if (started := begin(NAME)) is None:
        return 0
    data, at = started
    start = time.time()
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    time_to_target(MICRO_BATCHES[0], cuda)  # warm: CUDA's kernels load once, outside the times
    on_gpu = [repeated(b, cuda) for b in MICRO_BATCHES]
    on_cpu = [repeated(b, cpu) for b in MICRO_BATCHES]
    control = time_to_target(PACKED_MICRO_BATCH, cuda, target=1.01, max_time_s=CONTROL_TIME_S)
    alone = repeated(PACKED_MICRO_BATCH, cuda)
    torch.cuda.empty_cache()
    packed = packed_runs()
    figures, goals = findings(on_gpu, on_cpu, control, alone, packed)
    data.update(
        figures,
        gpu=on_gpu,
        cpu=on_cpu,
        cpu_threads=torch.get_num_threads(),
        control=control,
        alone=alone,
        packed=packed,
        wall_s=time.time() - start,
    )
    return finish(NAME, data, goals, at)


if __name__ == "__main__":
    sys.exit(main())
