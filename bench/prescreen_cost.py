"""What landing on the largest batch that fits costs: raybatch vs the finders users run.

Ways to learn the largest micro batch that fits a memory budget:

- ``trace_alone``: the trace's answer, used as is (0 device steps). The estimate is off by the
  simulated member's own ``estimate_error``, so the answer is below the true largest batch
  (estimate too high) or over it, an OOM at the first step (estimate too low);
- ``raybatch``: what a search does on a GPU: the largest micro batch *of its space* the
  estimate admits within the probe margin (20%), confirmed by the trial's real probe (one step);
  a probe that runs out of memory ends that trial and the next smaller micro batch of the space
  is launched instead (a restart). It lands on the space's grid, so ``exact_on_grid`` is the
  best it can find;
- ``power``: PyTorch Lightning's ``BatchSizeFinder`` in its default mode: from batch 2, double
  until a try runs out of memory (3 steps per try, an OOM try fails on its first); it lands on
  a power of two, the grid the benchmark's space has;
- ``power_binsearch``: PyTorch Lightning's ``BatchSizeFinder(mode="binsearch")``: from batch 2,
  double until a try runs out of memory, then bisect between the last success and the first
  failure until they are adjacent; each try runs ``steps_per_trial=3`` training steps (an OOM
  try fails on its first);
- ``shrink_0.9``: the retry loop of ``accelerate.find_executable_batch_size``: start large,
  and on each OOM restart the training function with the batch x 0.9 (each retry is a restart:
  model, optimizer and data loader are built again before the step that fails or succeeds).

Counted two ways, side by side in one run:

1. on the simulator's memory model (``bench/simulator.py``, the members of the search
   benchmark, each with its estimate error): device steps, OOMs suffered, tries, simulated GPU
   seconds (a try's steps at the member's step time; a restart costs the member's
   ``oom_cost_s``), the batch found and how far below the true largest batch it is;
2. timed on this CPU for the digits example: the finders' real training steps and restarts,
   and the trace's own CPU seconds. A CPU cannot run out of memory the way a GPU does, so the
   "device" there is the traced prediction against a budget: the trace is measured against
   itself (its found/OOM figures are true by construction, ``circular``); only the seconds
   are measurements.

Run: .venv/bin/python bench/prescreen_cost.py  (writes bench/results/prescreen_cost.json)
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from provenance import measured_at, write_result
from simulator import MEMBERS, MICRO, Member, SimulatedEstimator, sim_space

import raybatch
from raybatch import keys
from raybatch.examples.digits import DigitsWorkload
from raybatch.memory.estimator import MemoryEstimator
from raybatch.tuning.seeding import budget_check, max_batch_point
from raybatch.workload import build_optimizer

RESULTS = Path(__file__).parent / "results" / "prescreen_cost.json"
STEPS_PER_TRY = 3  # Lightning's BatchSizeFinder default steps_per_trial
SHRINK = 0.9  # accelerate's find_executable_batch_size reduction
MAX_BATCH = 2**20
PROBE_MARGIN = raybatch.SearchOptions().probe_margin  # on GPUs, the real probe decides near it

Fits = Callable[[int], bool]


def power(fits: Fits, init: int = 2) -> tuple[int, list[tuple[int, bool]]]:
    """Lightning's default power mode: double until a try fails; the last success (a power
    of two, the same grid as raybatch's space) and every (batch, fitted) try in order."""
    tries: list[tuple[int, bool]] = []
    low, batch = 1, init
    while batch <= MAX_BATCH:
        ok = fits(batch)
        tries.append((batch, ok))
        if not ok:
            break
        low, batch = batch, batch * 2
    return low, tries


def power_binsearch(fits: Fits, init: int = 2) -> tuple[int, list[tuple[int, bool]]]:
    """Lightning's binsearch mode: the batch found and every (batch, fitted) try in order."""
    low, tries = power(fits, init)
    if tries[-1][1]:
        return low, tries
    high = tries[-1][0]
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


def trace_estimate(member: Member) -> int:
    """The largest micro batch the member's memory *estimate* admits (off by its
    ``estimate_error``): what the trace alone answers, before any device has run."""
    return int((member.budget / (1 + member.estimate_error) - member.mem_fixed)
               // member.mem_per_sample)  # fmt: skip


def raybatch_procedure(member: Member) -> tuple[int, list[tuple[int, bool]]]:
    """What a search does on a GPU to land on its largest batch, with the member's error.

    The opening point is the largest micro batch of the space the estimate admits within the
    probe margin (:func:`raybatch.tuning.seeding.max_batch_point` with ``budget_check``, as the
    search benchmark plans it); its trial's probe runs one real step; one that runs out of
    memory ends its trial and the next smaller micro batch of the space is launched in its place
    (a new trial: a restart). The batch found is the first one whose probe fits.
    """
    space = sim_space()
    fits = budget_check(SimulatedEstimator(member), int(member.budget), PROBE_MARGIN)
    start = max_batch_point(space, fits)[keys.MICRO_BATCH_SIZE]
    tries: list[tuple[int, bool]] = []
    for micro in sorted((m for m in MICRO if m <= start), reverse=True):
        ok = member.fits(micro)
        tries.append((micro, ok))
        if ok:
            return micro, tries
    return 0, tries


def simulated(member: Member) -> list[dict[str, Any]]:
    """Every procedure against one member's memory model; costs in simulated seconds.

    ``exact`` is the true largest micro batch (any integer); ``exact_on_grid`` the largest of
    the space's micro batches that truly fits, the best a search over that space can land on.
    """
    exact = int((member.budget - member.mem_fixed) // member.mem_per_sample)
    estimate = trace_estimate(member)
    fitting = member.fits(estimate)
    rows = [
        {"strategy": "trace_alone", "found": estimate, "device_steps": 0 if fitting else 1,
         "ooms": 0 if fitting else 1, "tries": 0 if fitting else 1, "restarts": 0,
         "device_seconds": 0.0 if fitting else member.oom_cost_s,
         "lands_fitting": fitting},
    ]  # fmt: skip
    found, tries = raybatch_procedure(member)
    seconds = sum(member.step_time(b, 1) if ok else member.oom_cost_s for b, ok in tries)
    rows.append(_row("raybatch", found, tries, True, seconds))
    for name, finder in (("power", power), ("power_binsearch", power_binsearch)):
        found, tries = finder(member.fits)
        seconds = sum((STEPS_PER_TRY if ok else 1) * member.step_time(b, 1) for b, ok in tries)
        rows.append(_row(name, found, tries, False, seconds))
    found, tries = shrink_retry(member.fits, 4 * max(exact, 1))  # a user's optimistic start
    seconds = sum(member.oom_cost_s if not ok else member.step_time(b, 1) for b, ok in tries)
    rows.append(_row("shrink_0.9", found, tries, True, seconds))
    grid = max((m for m in MICRO if member.fits(m)), default=0)
    for r in rows:
        r.setdefault("lands_fitting", r["found"] > 0 and member.fits(r["found"]))
        r.update(
            workload=member.name,
            exact=exact,
            exact_on_grid=grid,
            found_fraction=r["found"] / exact,
            estimate_error=member.estimate_error,
        )
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
        {"strategy": "trace_alone", "found": found_by_trace, "device_steps": 0, "ooms": 0,
         "tries": 0, "restarts": 0, "cpu_trace_s": trace_s, "device_seconds": 0.0,
         "circular": True},
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
    at = measured_at()
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
        "probe_margin": PROBE_MARGIN,
        "space_micro_batches": MICRO,
        "rows": rows,
    }
    write_result(out, data, at)
    return data


if __name__ == "__main__":
    main()
