"""Verify the memory pre-screen on a real NVIDIA GPU: prediction vs measurement.

For an MLP, a ResNet-18 (224x224) and a small transformer, with AdamW, in fp32 and under bf16
autocast, at four micro-batch sizes each:

- predicted peak (fake-tensor trace, CUDA projection) vs measured ``max_memory_allocated`` and
  ``max_memory_reserved`` of one real steady-state step (raybatch's probe);
- under ``torch.cuda.set_per_process_memory_fraction`` emulating 8, 16 and 24 GiB cards: the
  largest micro batch the pre-screen admits (default headroom 0.9, and with none) vs the real
  out-of-memory boundary found by bisection with real steps;
- the CUDA context's size outside the allocator (NVML used memory before and after
  ``torch.cuda.init``), which ``raybatch.memory.budget.CUDA_CONTEXT_OVERHEAD_BYTES`` stands for.

Targets (issue 3): the prediction is never below the measured peak by more than 5% at the
default headroom (no OOM slips through) and never above it by more than 15%.

Run on a GPU machine: .venv/bin/python bench/gpu_memory_accuracy.py
(writes bench/results/gpu_memory_accuracy.json and .md). Without CUDA it says so and exits;
``predictions()`` also runs on the CPU, which the test suite uses to keep this script honest.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from models import WORKLOADS
from provenance import write_result

import raybatch
from raybatch.memory.budget import DEFAULT_HEADROOM, read_device_memory
from raybatch.memory.estimator import MemoryEstimator
from raybatch.memory.probe import probe, release_memory

REQUIRES_GPU = True
RESULTS = Path(__file__).parent / "results" / "gpu_memory_accuracy"
SIZES = {"mlp": [64, 256, 1024, 4096], "resnet18": [8, 16, 32, 64], "transformer": [8, 16, 32, 64]}
CARDS_GIB = [8, 16, 24]
SPACE = raybatch.load_space("generic_adamw")


def predictions(
    sizes: dict[str, list[int]] = SIZES, dtypes: tuple[str | None, ...] = (None, "bf16")
) -> list[dict[str, Any]]:
    """Predicted peaks (CPU only): the part of the benchmark that needs no GPU."""
    rows = []
    for name, sizes_for in sizes.items():
        for amp in dtypes:
            workload = WORKLOADS[name](amp)
            estimator = MemoryEstimator(
                workload, SPACE.reference_config(), anchors=(min(sizes_for), max(sizes_for))
            )
            for b in sizes_for:
                rows.append(
                    {
                        "workload": name,
                        "amp": amp or "fp32",
                        "micro_batch_size": b,
                        "predicted_bytes": estimator.predict(SPACE.derive(b)),
                    }
                )
    return rows


def measure(rows: list[dict[str, Any]]) -> None:
    """Add measured allocated/reserved peaks and the error ratios to each row."""
    for row in rows:
        workload = WORKLOADS[row["workload"]](None if row["amp"] == "fp32" else row["amp"])
        result = probe(workload, SPACE.derive(row["micro_batch_size"]), "cuda:0")
        row["fits"] = result.fits
        row["allocated_bytes"] = result.max_allocated_bytes
        row["reserved_bytes"] = result.max_reserved_bytes
        if result.fits and result.max_allocated_bytes and result.max_reserved_bytes:
            row["predicted_over_allocated"] = row["predicted_bytes"] / result.max_allocated_bytes
            row["predicted_over_reserved"] = row["predicted_bytes"] / result.max_reserved_bytes


def oom_boundary(name: str, amp: str | None, card_bytes: int, total_bytes: int) -> dict[str, Any]:
    """Predicted largest micro batch on an emulated card vs the real OOM boundary."""
    workload = WORKLOADS[name](amp)
    estimator = MemoryEstimator(workload, SPACE.reference_config(), anchors=(1, 64))
    template = SPACE.derive(1)
    predicted_default = estimator.max_micro_batch_size(template, int(DEFAULT_HEADROOM * card_bytes))
    predicted_full = estimator.max_micro_batch_size(template, card_bytes)
    torch.cuda.set_per_process_memory_fraction(card_bytes / total_bytes, 0)
    try:
        low, high = 0, max(2 * (predicted_full or 64), 2)
        while probe(workload, SPACE.derive(high), "cuda:0").fits:
            low, high = high, 2 * high
        while high - low > 1:  # invariant: low runs (or is 0), high runs out of memory
            mid = (low + high) // 2
            if probe(workload, SPACE.derive(mid), "cuda:0").fits:
                low = mid
            else:
                high = mid
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        release_memory("cuda:0")
    return {
        "workload": name,
        "amp": amp or "fp32",
        "card_gib": card_bytes / 2**30,
        "predicted_max_micro_batch_headroom_0.9": predicted_default,
        "predicted_max_micro_batch_no_headroom": predicted_full,
        "real_max_micro_batch": low,
        "admitted_batch_oomed": predicted_default is not None and predicted_default > low,
    }


def context_overhead_bytes() -> int | None:
    """NVML-used memory a fresh CUDA context adds beyond what PyTorch's allocator reserved.

    Measured after a cuBLAS matmul and a cuDNN convolution, forward and backward: their
    handles and the kernel modules they load live outside the allocator too, and every
    training process has them (``torch.empty(1)`` alone loads neither).
    """
    before = read_device_memory(0)
    torch.cuda.init()
    a = torch.randn(512, 512, device="cuda", requires_grad=True)
    (a @ a).sum().backward()
    conv = torch.nn.Conv2d(3, 16, 3).cuda()
    conv(torch.randn(8, 3, 32, 32, device="cuda")).sum().backward()
    torch.cuda.synchronize()
    after = read_device_memory(0)
    if before is None or after is None:
        return None
    return after.used_bytes - before.used_bytes - torch.cuda.memory_reserved(0)


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"# Memory pre-screen on {data['device']}",
        "",
        f"torch {data['torch']}, measured {data['date']}; CUDA context outside the allocator:"
        f" {data['context_overhead_bytes']} bytes.",
        "",
        "| workload | amp | micro batch | predicted MiB | allocated MiB | reserved MiB |"
        " pred/alloc | pred/reserved |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in data["peaks"]:
        mib = lambda v: f"{v / 2**20:.1f}" if v else "OOM"  # noqa: E731
        lines.append(
            f"| {r['workload']} | {r['amp']} | {r['micro_batch_size']}"
            f" | {mib(r['predicted_bytes'])}"
            f" | {mib(r.get('allocated_bytes'))} | {mib(r.get('reserved_bytes'))}"
            f" | {r.get('predicted_over_allocated', float('nan')):.3f}"
            f" | {r.get('predicted_over_reserved', float('nan')):.3f} |"
        )
    lines += [
        "",
        "| workload | amp | card GiB | admitted (0.9 headroom) | admitted (none) | real boundary |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in data["boundaries"]:
        lines.append(
            f"| {r['workload']} | {r['amp']} | {r['card_gib']:.0f}"
            f" | {r['predicted_max_micro_batch_headroom_0.9']}"
            f" | {r['predicted_max_micro_batch_no_headroom']} | {r['real_max_micro_batch']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    if not torch.cuda.is_available():
        print("gpu_memory_accuracy: no CUDA device here; run this on a GPU machine.")
        return
    overhead = context_overhead_bytes()
    total = torch.cuda.get_device_properties(0).total_memory
    rows = predictions()
    measure(rows)
    boundaries = [
        oom_boundary(name, amp, gib * 2**30, total)
        for name in SIZES
        for amp in (None, "bf16")
        for gib in CARDS_GIB
        if gib * 2**30 < total
    ]
    data = {
        "benchmark": "gpu_memory_accuracy",
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "context_overhead_bytes": overhead,
        "peaks": rows,
        "boundaries": boundaries,
    }
    write_result(RESULTS.with_suffix(".json"), data)
    RESULTS.with_suffix(".md").write_text(markdown(data))
    print(markdown(data))


if __name__ == "__main__":
    main()
