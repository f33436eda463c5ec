"""Verify the GPU paths that only a real NVIDIA GPU can exercise (``make gpu-check`` runs this
after ``gpu_memory_accuracy.py`` and ``gpu_trial_timing.py``).

1. **NVML fields**: every GPU of the machine as raybatch reads it (name, total, free, other
   processes' use — or ``None`` where NVML may not list processes), the budget it derives,
   and the utilisation monitor's figure and scope (``process`` where NVML gives per-process
   utilisation, else ``device``) over two seconds of matmuls.
2. **A real probe OOM is freed, and the next trial is unaffected**: the probe of a micro batch
   that cannot fit says infeasible and leaves the allocated memory where it was; then a real
   trial (``run_trial``, the wrapper's own path, device from the process) trains normally.
3. **Two packed trials**: two processes each holding half a GPU cap their allocators with
   ``packed_memory_fraction(0.5, budget, total)``; the one that stays within its slot keeps
   running, the one that overruns gets the OOM — itself, not its neighbour — and the two caps
   plus two CUDA contexts stay within the budget plus one context.

Run on a GPU machine: .venv/bin/python bench/gpu_check.py (writes bench/results/gpu_check.json).
Without CUDA it says so and exits.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from provenance import write_result

import raybatch
from raybatch.memory.budget import (
    CUDA_CONTEXT_OVERHEAD_BYTES,
    read_all_devices,
    read_device_memory,
    resolve_budget,
)
from raybatch.trial.placement import packed_memory_fraction

REQUIRES_GPU = True
RESULTS = Path(__file__).parent / "results" / "gpu_check.json"
SLACK_BYTES = 64 * 2**20
"""How far inside (or past) its cap each packed process allocates."""


def nvml_fields() -> dict[str, Any]:
    from dataclasses import asdict

    from raybatch.trial.gpu_monitor import UtilizationMonitor

    devices = read_all_devices()
    monitor = UtilizationMonitor(0, interval_s=0.05).start()
    a = torch.randn(4096, 4096, device="cuda")
    end = time.perf_counter() + 2.0
    while time.perf_counter() < end:
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    time.sleep(0.2)
    monitor.stop()
    budget = resolve_budget()
    return {
        "devices": None if devices is None else [asdict(d) for d in devices],
        "device_0": None if (d := read_device_memory(0)) is None else asdict(d),
        "budget_bytes": budget.bytes,
        "budget_source": budget.source,
        "utilization_percent": monitor.mean(),
        "utilization_scope": monitor.scope,
    }


def probe_oom_then_trial() -> dict[str, Any]:
    from gpu_trial_timing import SPACE, LearnableResNet

    from raybatch.memory.probe import probe, release_memory
    from raybatch.trial.settings import TrialSettings
    from raybatch.trial.wrapper import run_trial

    workload = LearnableResNet()
    release_memory("cuda:0")
    before = torch.cuda.memory_allocated(0)
    too_big = probe(workload, SPACE.derive(1 << 16), "cuda:0")
    after = torch.cuda.memory_allocated(0)
    reports: list[dict[str, Any]] = []
    settings = TrialSettings(target=raybatch.Target(0.3), max_time_s=20.0, eval_every_samples=2048)
    reporter = run_trial(workload, SPACE, settings, {"micro_batch_size": 64}, reports.append)
    release_memory("cuda:0")
    return {
        "oom_probe": {"fits": too_big.fits, "error": too_big.error},
        "allocated_before_probe": before,
        "allocated_after_probe": after,
        "next_trial_status": reporter.status.value,
        "next_trial_reason": reporter.reason,
        "next_trial_reports": len(reports),
        "allocated_after_trial": torch.cuda.memory_allocated(0),
    }


def _packed_process(fraction: float, nbytes: int, hold_s: float, out: Any) -> None:
    """One packed trial: cap the allocator, allocate ``nbytes``, hold it, say what happened."""
    import torch

    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    try:
        block = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        block.fill_(1)
        torch.cuda.synchronize()
        time.sleep(hold_s)
        out.put({"allocated": nbytes, "oom": False})
    except torch.cuda.OutOfMemoryError as exc:
        out.put({"allocated": 0, "oom": True, "error": str(exc).splitlines()[0]})


def _context_process(out: Any) -> None:
    """A fresh process measures its own CUDA context, as the search's measuring task does."""
    from raybatch.memory.context import measure_context_bytes

    out.put(measure_context_bytes(0))


def packed_pair() -> dict[str, Any]:
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    queue = context.Queue()
    measurer = context.Process(target=_context_process, args=(queue,))
    measurer.start()
    measured = queue.get(timeout=120)
    measurer.join()
    context_bytes = measured or CUDA_CONTEXT_OVERHEAD_BYTES
    total = torch.cuda.get_device_properties(0).total_memory
    budget = resolve_budget(context_overhead_bytes=context_bytes).bytes
    fraction = packed_memory_fraction(0.5, budget, total, context_bytes)
    assert fraction is not None
    cap = int(fraction * total)
    within = context.Process(target=_packed_process, args=(fraction, cap - SLACK_BYTES, 6.0, queue))
    over = context.Process(target=_packed_process, args=(fraction, cap + SLACK_BYTES, 0.0, queue))
    within.start()
    time.sleep(2.0)  # the first holds its slot while the second overruns
    used = read_device_memory(0)
    over.start()
    outcomes = sorted((queue.get(timeout=120) for _ in range(2)), key=lambda r: r["oom"])
    within.join()
    over.join()
    return {
        "budget_bytes": budget,
        "total_bytes": total,
        "fraction": fraction,
        "cap_bytes": cap,
        "context_bytes_measured": measured,
        "context_bytes_assumed": CUDA_CONTEXT_OVERHEAD_BYTES,
        "two_slots_with_contexts_bytes": 2 * (cap + context_bytes),
        "budget_plus_one_context_bytes": budget + context_bytes,
        "nvml_used_while_one_held_bytes": None if used is None else used.used_bytes,
        "within_slot": outcomes[0],
        "over_slot": outcomes[1],
        "neighbour_unaffected": not outcomes[0]["oom"] and outcomes[1]["oom"],
    }


def main() -> None:
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run this on a GPU machine.")
        return
    start = time.time()
    data = {
        "benchmark": "gpu_check",
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "nvml": nvml_fields(),
        "probe_oom_then_trial": probe_oom_then_trial(),
        "packed_pair": packed_pair(),
    }
    data["wall_s"] = time.time() - start
    write_result(RESULTS, data)
    print(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
