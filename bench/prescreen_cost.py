"""What finding the largest batch that fits costs: raybatch's trace vs the finders users run.

Three ways to learn the largest micro batch that fits a memory budget:

- ``trace`` (raybatch): two fake-tensor traces (no device memory, no device step), a linear
  model per op, and the boundary solved from it; 0 device steps, some CPU seconds;
- ``power_binsearch``: PyTorch Lightning's ``BatchSizeFinder(mode="binsearch")``: from batch 2,
  double until a try runs out of memory, then bisect between the last success and the first
  failure until they are adjacent; each try runs ``steps_per_trial=3`` training steps (an OOM
  try fails on its first);
- ``shrink_0.9``: the retry loop of ``accelerate.find_executable_batch_size``: start large,
  and on each OOM restart the training function with the batch x 0.9 (each retry is a restart:
  model, optimizer and data loader are built again before the step that fails or succeeds).

Counted two ways, side by side in one run:

1. on the simulator's memory model (``bench/simulator.py``, the members of the search
   benchmark): device steps, OOMs suffered, tries, and simulated GPU seconds (a try's steps at
   the member's step time; a restart costs the member's ``oom_cost_s``);
2. timed on this CPU for the digits example: the same three procedures on the real model,
   with a budget emulated from the traced model (a CPU cannot run out of memory the way a GPU
   does, so "OOM" means "the traced prediction exceeds the budget"): real training steps and
   restarts timed, traces timed.

Run: .venv/bin/python bench/prescreen_cost.py  (writes bench/results/prescreen_cost.json)
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from simulator import MEMBERS, Member

import raybatch
from raybatch.examples.digits import DigitsWorkload
from raybatch.memory import MemoryEstimator
from raybatch.workload import build_optimizer

RESULTS = Path(__file__).parent / "results" / "prescreen_cost.json"
STEPS_PER_TRY = 3  # Lightning's BatchSizeFinder default steps_per_trial
SHRINK = 0.9  # accelerate's find_executable_batch_size reduction
MAX_BATCH = 2**20

Fits = Callable[[int], bool]


def power_binsearch(fits: Fits, init: int = 2) -> tuple[int, list[tuple[int, bool]]]:
    """Lightning's binsearch mode: the batch found and every (batch, fitted) try in order."""
    tries: list[tuple[int, bool]] = []
    low, high, batch = 1, None, init
    while batch <= MAX_BATCH:
        ok = fits(batch)
        tries.append((batch, ok))
        if not ok:
            high = batch
            break
        low, batch = batch, batch * 2
    if high is None:
        return low, tries
    while high - low > 1:
        mid = (low + high) // 2
        ok = fits(mid)
        tries.append((mid, ok))
        low, high = (mid, high) if ok else (low, mid)
    return low, tries


def shrink_retry(fits: Fits, start: int) -> tuple[int, list[tuple[int, bool]]]:
    """accelerate's loop: restart with int(batch x 0.9) after every OOM."""
    tries: list[tuple[int, bool]] = []
    batch = start
    while batch > 0:
        ok = fits(batch)
        tries.append((batch, ok))
        if ok:
            return batch, tries
        batch = int(batch * SHRINK)
    return 0, tries


def _row(
    strategy: str, found: int, tries: list[tuple[int, bool]], restarts: bool, seconds: float
) -> dict[str, Any]:
    """One finder's figures: a finder try runs 3 steps (1 if it OOMs), a restart try 1."""
    per_try = 1 if restarts else STEPS_PER_TRY
    return {
        "strategy": strategy,
        "found": found,
        "device_steps": sum(per_try if ok else 1 for _, ok in tries),
        "ooms": sum(not ok for _, ok in tries),
        "tries": len(tries),
        "restarts": len(tries) - 1 if restarts else 0,  # Lightning recovers in-process
        "device_seconds": seconds,
    }


# ----------------------------------------------------------------------- on the simulator


def simulated(member: Member) -> list[dict[str, Any]]:
    """The three procedures against one member's memory model; costs in simulated seconds."""
    exact = int((member.budget - member.mem_fixed) // member.mem_per_sample)

    def fits(b: int) -> bool:
        return member.memory(b) <= member.budget

    rows = [
        {"strategy": "trace", "found": exact, "device_steps": 0, "ooms": 0, "tries": 0,
         "restarts": 0, "device_seconds": 0.0},
    ]  # fmt: skip
    found, tries = power_binsearch(fits)
    seconds = sum((STEPS_PER_TRY if ok else 1) * member.step_time(b, 1) for b, ok in tries)
    rows.append(_row("power_binsearch", found, tries, False, seconds))
    found, tries = shrink_retry(fits, 4 * max(exact, 1))  # a user's optimistic start
    seconds = sum(member.oom_cost_s if not ok else member.step_time(b, 1) for b, ok in tries)
    rows.append(_row("shrink_0.9", found, tries, True, seconds))
    for r in rows:
        r["workload"] = member.name
        r["exact"] = exact
    return rows


# ----------------------------------------------------------------------- on this CPU


def _timed_steps(workload: DigitsWorkload, batch: int, steps: int, build: bool) -> float:
    """Wall seconds of ``steps`` real training steps at ``batch`` (plus a rebuild if asked)."""
    space = raybatch.load_space("digits_cnn_sgd")
    data = workload.train_dataset()
    start = time.perf_counter()
    model = workload.build_model()
    optimizer = build_optimizer(model.parameters(), space.reference_config())
    if not build:
        start = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        index = torch.randint(0, len(data), (batch,), generator=generator)  # type: ignore[arg-type]
        x, y = data[index]
        loss = workload.loss(model, (x, y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


def on_cpu(budget_batch: int = 200, repeats: int = 3) -> list[dict[str, Any]]:
    """The three procedures on the digits CNN, timed for real on this CPU."""
    torch.set_num_threads(1)
    workload = DigitsWorkload()
    space = raybatch.load_space("digits_cnn_sgd")
    config = space.reference_config()
    _timed_steps(workload, 8, 1, build=True)  # imports, data loading: not timed

    def trace_once() -> tuple[float, int | None, MemoryEstimator]:
        start = time.perf_counter()
        estimator = MemoryEstimator(workload, config, cuda=True, anchors=(16, 256))
        estimator.traced_model()
        return time.perf_counter() - start, None, estimator

    seconds, _, estimator = trace_once()
    budget = estimator.predict(space.derive(budget_batch))
    found_by_trace = estimator.max_micro_batch_size(config, budget)
    trace_s = statistics.median([seconds] + [trace_once()[0] for _ in range(repeats - 1)])

    def fits(b: int) -> bool:  # the emulated device: the traced prediction against the budget
        return estimator.model_for().predict(b) <= budget

    rows = [
        {"strategy": "trace", "found": found_by_trace, "device_steps": 0, "ooms": 0,
         "tries": 0, "restarts": 0, "cpu_trace_s": trace_s, "device_seconds": 0.0},
    ]  # fmt: skip
    found, tries = power_binsearch(fits)
    times = [
        sum(_timed_steps(workload, b, STEPS_PER_TRY if ok else 1, build=False) for b, ok in tries)
        for _ in range(repeats)
    ]
    rows.append(_row("power_binsearch", found, tries, False, statistics.median(times)))
    found, tries = shrink_retry(fits, 4 * budget_batch)
    times = [
        sum(_timed_steps(workload, b, 1, build=True) for b, _ in tries) for _ in range(repeats)
    ]
    rows.append(_row("shrink_0.9", found, tries, True, statistics.median(times)))
    for r in rows:
        r["workload"] = "digits_cnn (CPU, emulated budget)"
        r["exact"] = found_by_trace
        r["budget_bytes"] = budget
    return rows


def main(
    members: list[Member] = MEMBERS, budget_batch: int = 200, repeats: int = 3,
    out: Path = RESULTS,
) -> dict[str, Any]:  # fmt: skip
    rows = [r for m in members for r in simulated(m)] + on_cpu(budget_batch, repeats)
    for r in rows:
        print(f"{r['workload']:34} {r['strategy']:16} found {r['found']:>5}"
              f" steps {r['device_steps']:>3} ooms {r['ooms']:>2}"
              f" device s {r['device_seconds']:.3f}")  # fmt: skip
    data = {
        "benchmark": "prescreen_cost",
        "machine": f"{platform.machine()}, 1 torch thread",
        "torch": torch.__version__,
        "steps_per_try": STEPS_PER_TRY,
        "shrink": SHRINK,
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    return data


if __name__ == "__main__":
    main()
