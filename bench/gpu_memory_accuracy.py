"""Verify the memory pre-screen on a real NVIDIA GPU: prediction vs measurement.

For an MLP, a ResNet-18 (224x224) and a small transformer, with AdamW, in fp32 and under bf16
autocast, at four micro-batch sizes each:

- predicted peak (fake-tensor trace, CUDA projection) vs measured ``max_memory_allocated`` and
  ``max_memory_reserved`` of one real steady-state step (raybatch's probe);
- under ``torch.cuda.set_per_process_memory_fraction`` emulating 8 and 24 GiB cards: the
  largest micro batch the pre-screen admits (default headroom 0.9, and with none) vs the real
  out-of-memory boundary, found with real steps to within 1/64 of it; the admitted micro batch
  itself is run on the emulated card;
- the CUDA context's size outside the allocator (NVML used memory before and after
  ``torch.cuda.init``), which ``raybatch.cluster.budget.CUDA_CONTEXT_OVERHEAD_BYTES`` stands for.

Targets (issue 3), enforced: every step of the table is measured; the prediction is never
below the measured (allocated) peak by more than 5 % and never above it by more than 15 %;
the micro batch admitted at the default headroom runs on every emulated card measured (no OOM
slips through), and every workload and precision is measured on the 8 GiB card at least
(the 24 GiB card is measured while time allows: ``DEADLINE_S``).

Run on a GPU machine: python bench/gpu_memory_accuracy.py (writes gpu_memory_accuracy.json
and .md to ``$RAYBATCH_RESULTS_DIR``, default bench/results/); exits 3 when a target is
missed. Without CUDA it says so, writes nothing and exits 0; ``predictions()`` also runs on
the CPU, which the test suite uses to keep this script honest. Two to three minutes on an H100.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from gpu_recipes import at_micro_batch, recipe
from gpu_targets import Goal, at_least, at_most, begin, finish, holds
from models import WORKLOADS
from provenance import results_dir

from raybatch.cluster.budget import DEFAULT_HEADROOM
from raybatch.cluster.nvml import read_device_memory
from raybatch.memory.estimator import MemoryEstimator
from raybatch.memory.probe import probe, release_memory

REQUIRES_GPU = True
NAME = "gpu_memory_accuracy"
SIZES = {"mlp": [64, 256, 1024, 4096], "resnet18": [8, 16, 32, 64], "transformer": [8, 16, 32, 64]}
CARDS_GIB = [8, 24]
DEADLINE_S = 150.0
"""No emulated card is begun after this many seconds; the first card is always measured."""
UNDER_AT_MOST = 0.05
OVER_AT_MOST = 0.15
REFERENCE = recipe("generic_adamw")
"""The recipe every step is measured with (AdamW); only the micro batch changes."""


def predictions(
    sizes: dict[str, list[int]] = SIZES, dtypes: tuple[str | None, ...] = (None, "bf16")
) -> list[dict[str, Any]]:
    """Predicted peaks (CPU only): the part of the benchmark that needs no GPU."""
    rows = []
    for name, sizes_for in sizes.items():
        for amp in dtypes:
            workload = WORKLOADS[name](amp)
            estimator = MemoryEstimator(
                workload, REFERENCE, anchors=(min(sizes_for), max(sizes_for))
            )
            for b in sizes_for:
                rows.append(
                    {
                        "workload": name,
                        "amp": amp or "fp32",
                        "micro_batch_size": b,
                        "predicted_bytes": estimator.predict(at_micro_batch(REFERENCE, b)),
                    }
                )
    return rows


def measure(rows: list[dict[str, Any]]) -> None:
    """Add measured allocated/reserved peaks and the error ratios to each row."""
    for row in rows:
        workload = WORKLOADS[row["workload"]](None if row["amp"] == "fp32" else row["amp"])
        result = probe(workload, at_micro_batch(REFERENCE, row["micro_batch_size"]), "cuda:0")
        row["fits"] = result.fits
        row["allocated_bytes"] = result.max_allocated_bytes
        row["reserved_bytes"] = result.max_reserved_bytes
        if result.fits and result.max_allocated_bytes and result.max_reserved_bytes:
            row["predicted_over_allocated"] = row["predicted_bytes"] / result.max_allocated_bytes
            row["predicted_over_reserved"] = row["predicted_bytes"] / result.max_reserved_bytes


@functools.cache
def _estimator(name: str, amp: str | None) -> MemoryEstimator:
    """One traced estimator per workload and precision, whatever the card (it traces on CPU)."""
    return MemoryEstimator(WORKLOADS[name](amp), REFERENCE, anchors=(1, 64))


def oom_boundary(name: str, amp: str | None, card_bytes: int, total_bytes: int) -> dict[str, Any]:
    """Predicted largest micro batch on an emulated card vs the real OOM boundary.

    The boundary is bracketed from the prediction in steps of 25 % and then bisected until
    its bracket is within 1/64 of it: enough to compare with 5 % and 15 % targets, in a few
    real steps. The admitted micro batch (default headroom) is then run on its own.
    """
    workload = WORKLOADS[name](amp)
    estimator = _estimator(name, amp)
    template = at_micro_batch(REFERENCE, 1)
    predicted_default = estimator.max_micro_batch_size(template, int(DEFAULT_HEADROOM * card_bytes))
    predicted_full = estimator.max_micro_batch_size(template, card_bytes)

    probes: list[int] = []

    def fits(b: int) -> bool:
        probes.append(b)
        return probe(workload, at_micro_batch(REFERENCE, b), "cuda:0").fits

    torch.cuda.set_per_process_memory_fraction(card_bytes / total_bytes, 0)
    try:
        guess = max(predicted_full or 64, 1)
        low, high = (guess, 0) if fits(guess) else (0, guess)  # low runs (or is 0), high OOMs
        while high == 0:  # up from a guess that ran
            b = math.ceil(low * 1.25) + 1
            low, high = (b, 0) if fits(b) else (low, b)
        while low == 0 and high > 1:  # down from a guess that ran out of memory
            b = max(int(high / 1.25), 1)
            low, high = (b, high) if fits(b) else (0, b)
        while high - low > max(1, low // 64):
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        admitted_runs = fits(predicted_default) if predicted_default else None
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
        "real_oom_micro_batch": high,
        "admitted_batch_runs": admitted_runs,
        "probes": len(probes),
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
        "| workload | amp | card GiB | admitted (0.9 headroom) | admitted (none) | real boundary |"
        " admitted runs |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in data["boundaries"]:
        lines.append(
            f"| {r['workload']} | {r['amp']} | {r['card_gib']:.0f}"
            f" | {r['predicted_max_micro_batch_headroom_0.9']}"
            f" | {r['predicted_max_micro_batch_no_headroom']} | {r['real_max_micro_batch']}"
            f" | {r.get('admitted_batch_runs')} |"
        )
    return "\n".join(lines) + "\n"


def goals_of(rows: list[dict[str, Any]], boundaries: list[dict[str, Any]]) -> list[Goal]:
    """The targets (module docstring) of the table and the boundaries."""
    ratios = [r["predicted_over_allocated"] for r in rows if "predicted_over_allocated" in r]
    first_card = [b for b in boundaries if b["card_gib"] == CARDS_GIB[0]]
    return [
        holds(
            "every_step_measured",
            len(ratios) == len(rows) > 0,
            f"all {len(rows)} steps of the table measured",
        ),
        at_least("min_predicted_over_allocated", min(ratios, default=None), 1 - UNDER_AT_MOST),
        at_most("max_predicted_over_allocated", max(ratios, default=None), 1 + OVER_AT_MOST),
        at_least("boundaries_on_first_card", len(first_card), 2 * len(SIZES)),
        holds(
            "admitted_micro_batch_runs",
            bool(boundaries) and all(b["admitted_batch_runs"] for b in boundaries),
            "every admitted micro batch runs on its emulated card",
        ),
    ]


def main() -> int:
    if (started := begin(NAME)) is None:
        return 0
    data, at = started
    start = time.time()
    overhead = context_overhead_bytes()
    total = torch.cuda.get_device_properties(0).total_memory
    rows = predictions()
    measure(rows)
    boundaries = []
    cards = [gib for gib in CARDS_GIB if gib * 2**30 < total]
    for i, gib in enumerate(cards):
        if i > 0 and time.time() - start > DEADLINE_S:
            print(f"{NAME}: {gib} GiB card skipped, past {DEADLINE_S:g} s")
            continue
        boundaries += [
            oom_boundary(name, amp, gib * 2**30, total) for name in SIZES for amp in (None, "bf16")
        ]
    data.update(
        context_overhead_bytes=overhead,
        peaks=rows,
        boundaries=boundaries,
        wall_s=time.time() - start,
    )
    status = finish(NAME, data, goals_of(rows, boundaries), at)
    (results_dir() / f"{NAME}.md").write_text(markdown(data))
    print(markdown(data))
    return status


if __name__ == "__main__":
    sys.exit(main())
