"""Where a step's GPU memory is at its peak: the allocator's own history beside the trace.

Issue 49, item 2: the bench's MLP at micro batch 4096 allocated 129 MiB more at its peak than
the trace predicts, alike in fp32 and bf16 (an H100 at c21938b), where from 64 to 1024 the two
agree within 0.2 %. This check runs the probe's real step (``raybatch.memory.probe.probe``, the
pre-screen's own) of that MLP at 4096 (fp32, bf16), and of the ResNet-18 at micro batch 8,
where the trace reads 0.94 of the peak, in a fresh process with the CUDA caching allocator's
history recorded (Python stacks), replays the history to each step's peak and groups the blocks
alive there by the phase of the step that allocated them (forward, backward, optimizer:
markers the workload allocates at each phase's start) and by the Python frame that did, beside
the trace's categories at its own peak. It says where the missing bytes are.

Targets (each with a control that fails it, run here):

- the replay's peak is the allocator's (the probe's ``max_memory_allocated``, within 1 MiB),
  else the history missed allocations and its grouping counts nothing; the control replays
  the same history with its frees ignored, which must read above;
- the trace counts a cuBLAS workspace for each of a step's two threads (the forward's and
  autograd's backward device thread): after a step, blocks of the workspace's size that are
  never freed number ``CUBLAS_HANDLES_PER_STEP``; the control, a forward alone under
  ``no_grad`` first, must leave one.

Run on a GPU machine: python bench/gpu_memory_history.py (writes gpu_memory_history.json and .md
to ``$RAYBATCH_RESULTS_DIR``, default bench/results/); exits 3 when a target is missed. Without
CUDA it says so, writes nothing and exits 0. A few seconds on an H100.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))

from gpu_recipes import at_micro_batch, recipe
from gpu_targets import Goal, at_least, begin, finish, holds
from models import MLP, WORKLOADS
from provenance import results_dir

from raybatch.memory.probe import probe
from raybatch.memory.trace import CUBLAS_HANDLES_PER_STEP, CUBLAS_WORKSPACE_BYTES, trace_step

REQUIRES_GPU = True
NAME = "gpu_memory_history"
STEPS: tuple[tuple[str, str | None, int], ...] = (
    ("mlp", None, 4096),
    ("mlp", "bf16", 4096),
    ("resnet18", None, 8),
)
"""(workload, precision, micro batch): the MLP where the trace misses 129 MiB, and the ResNet
at the batch where it reads 0.94 of the allocated peak (cuDNN's workspaces, presumably)."""
MICRO_BATCH = 4096
REFERENCE = recipe("generic_adamw")
TOLERANCE_BYTES = 2**20
"""How far the replay's peak may sit from the allocator's: a marker's few blocks."""

PHASES = ("forward", "backward", "optimizer")
MARK_BYTES = {phase: 512 * (101 + i) for i, phase in enumerate(PHASES)}
"""Each phase's marker, a block no step allocates otherwise, from :func:`_mark`'s frame."""


def _mark(size: int, device: torch.device) -> None:
    """Allocate and free at once a block of ``size``: a phase's mark in the history, known by
    its size and this function's frame."""
    torch.empty(size, dtype=torch.uint8, device=device)


class _Marks:
    """Marks in the allocator's history where each phase of a step begins: forward (in
    ``loss``), backward (a hook on the loss, run by autograd's thread) and the optimizer's step
    (a pre-hook). Mixed into a bench workload; the probe's code path is the pre-screen's."""

    device: torch.device

    def mark(self, phase: str) -> None:
        _mark(MARK_BYTES[phase], self.device)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        self.mark("forward")
        loss: torch.Tensor = super().loss(model, batch)  # type: ignore[misc]
        loss.register_hook(lambda grad: self.mark("backward"))
        return loss

    def build_optimizer(self, model: nn.Module, config: Any) -> torch.optim.Optimizer:
        optimizer: torch.optim.Optimizer = super().build_optimizer(model, config)  # type: ignore[misc]
        optimizer.register_step_pre_hook(lambda *args: self.mark("optimizer"))
        return optimizer


def marked(name: str, amp_dtype: str | None, device: torch.device) -> Any:
    """The bench's workload ``name`` (:data:`models.WORKLOADS`) with the phases marked."""
    kind = type(f"Marked{WORKLOADS[name].__name__}", (_Marks, WORKLOADS[name]), {})
    workload = kind(amp_dtype)
    workload.device = device
    return workload


@dataclass(frozen=True)
class Replay:
    """The history replayed: its peak, when, and the blocks alive then."""

    peak_bytes: int
    peak_index: int
    live: tuple[dict[str, Any], ...]
    phases: tuple[str | None, ...]
    """For each event, the phase whose marker came last before it (``None``: before any)."""


def replay(events: Sequence[dict[str, Any]], start: int = 0, frees: bool = True) -> Replay:
    """Allocated bytes after each event (``alloc`` adds its block, ``free_requested`` takes it
    away, as the allocator's own statistic does); the peak over the events from ``start`` on,
    and the blocks alive at it. ``frees=False`` is the control: it never takes a block away."""
    sizes = {size: phase for phase, size in MARK_BYTES.items()}
    live: dict[int, dict[str, Any]] = {}
    total, best, best_at, best_live = 0, -1, -1, {}
    phase: str | None = None
    phases: list[str | None] = []
    for i, event in enumerate(events):
        action = event["action"]
        if action == "alloc":
            if event["size"] in sizes and _marked(event):
                phase = sizes[event["size"]]
            live[event["addr"]] = {**event, "phase": phase}
            total += event["size"]
        elif action == "free_requested" and frees and event["addr"] in live:
            total -= live.pop(event["addr"])["size"]
        phases.append(phase)
        if i >= start and total > best:
            best, best_at, best_live = total, i, dict(live)
    return Replay(max(best, 0), best_at, tuple(best_live.values()), tuple(phases))


def _marked(event: dict[str, Any]) -> bool:
    return any(frame["name"] == "_mark" for frame in event.get("frames") or [])


def where(event: dict[str, Any]) -> str:
    """The innermost frame outside torch's own code that allocated the block (its file's last
    two parts, line and function), or what says there was none: a C++ thread's allocation."""
    for frame in event.get("frames") or []:
        path = Path(frame["filename"])
        if "torch" not in path.parts:
            return f"{'/'.join(path.parts[-2:])}:{frame['line']} {frame['name']}"
    frames = event.get("frames") or []
    if frames:
        top = frames[0]
        return f"torch {Path(top['filename']).name}:{top['line']} {top['name']}"
    return "no Python frame (autograd's or a library's own thread)"


def grouped(live: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks alive at the peak, by (phase allocated, where, size), largest total first."""
    groups: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    for block in live:
        groups[(block["phase"] or "before the step", where(block), block["size"])].append(1)
    rows = [
        {"phase": p, "where": w, "block_bytes": s, "blocks": len(n), "bytes": s * len(n)}
        for (p, w, s), n in groups.items()
    ]
    return sorted(rows, key=lambda r: -r["bytes"])


def persistent_workspaces(events: Sequence[dict[str, Any]], upto: int | None = None) -> int:
    """Blocks of the cuBLAS workspace's size allocated by event ``upto`` and still alive at
    the end of the history: what the workspaces are, since a step frees everything else it
    made. Replayed in order: the allocator reuses a freed block's address."""
    live: dict[int, tuple[int, int]] = {}
    for i, event in enumerate(events):
        if event["action"] == "alloc":
            live[event["addr"]] = (i, event["size"])
        elif event["action"] == "free_requested":
            live.pop(event["addr"], None)
    low, high = CUBLAS_WORKSPACE_BYTES, CUBLAS_WORKSPACE_BYTES + 2**20
    end = len(events) if upto is None else upto
    return sum(1 for i, size in live.values() if i < end and low <= size < high)


def _trace_of(name: str, amp: str | None, micro_batch_size: int) -> dict[str, Any]:
    """The trace's peak at the same micro batch, by category and the segment it falls in."""
    config = at_micro_batch(REFERENCE, micro_batch_size)
    cls: Any = WORKLOADS[name]
    traced = trace_step(cls(amp), config, micro_batch_size)
    segment = max(traced.phases, key=lambda k: sum(traced.phases[k].values()))
    return {"peak_bytes": traced.peak_bytes, "segment": segment, "breakdown": traced.breakdown}


def measure(device: torch.device) -> dict[str, Any]:
    """The history of a forward alone, then of the probe's step of each of :data:`STEPS`."""
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    trace = lambda: torch.cuda.memory._snapshot()["device_traces"][device.index or 0]  # noqa: E731
    with torch.no_grad():  # the control: one thread's matmuls, one workspace
        model = MLP().build_model().to(device)
        model(torch.randn(MICRO_BATCH, 1024, device=device))
        del model
    torch.cuda.synchronize(device)
    forward_end = len(trace())
    steps = []
    for name, amp, micro in STEPS:
        begun = len(trace())
        result = probe(marked(name, amp, device), at_micro_batch(REFERENCE, micro), str(device))
        steps.append((name, amp, micro, begun, result))
    events = trace()
    torch.cuda.memory._record_memory_history(enabled=None)
    return {"events": events, "forward_end": forward_end, "steps": steps}


def findings(recorded: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Goal]]:
    """Each step's replay beside its trace, and the targets (module docstring)."""
    events, rows, goals = recorded["events"], [], []
    phases = replay(events).phases  # each event's phase: one replay serves every step
    ends = [begun for *_, begun, _ in recorded["steps"][1:]] + [len(events)]
    for (workload, amp, micro, begun, result), end in zip(recorded["steps"], ends, strict=True):
        name = f"{workload}_{amp or 'fp32'}_{micro}"
        # The measured step: from its forward marker on (the probe's warm-up step before it
        # materialises the optimizer state; the allocator's peak was reset after it).
        first = next((i for i in range(begun, len(events)) if phases[i] == "forward"), begun)
        run = replay(events[:end], start=first)  # this step's window: to the next one's start
        control = replay(events[:end], start=first, frees=False)
        measured = result.max_allocated_bytes
        gap = abs(run.peak_bytes - measured) if measured else None
        rows.append(
            {
                "workload": workload,
                "amp": amp or "fp32",
                "micro_batch_size": micro,
                "fits": result.fits,
                "allocated_bytes": measured,
                "replay_peak_bytes": run.peak_bytes,
                "replay_peak_phase": run.phases[run.peak_index] if run.peak_index >= 0 else None,
                "live_at_peak": grouped(run.live),
                "trace": _trace_of(workload, amp, micro),
            }
        )
        goals += [
            holds(
                f"replay_peak_is_the_allocators_{name}",
                gap is not None and gap <= TOLERANCE_BYTES,
                f"within {TOLERANCE_BYTES} bytes of max_memory_allocated",
            ),
            at_least(
                f"control_replay_without_frees_reads_above_{name}",
                (control.peak_bytes - measured) if measured else None,
                TOLERANCE_BYTES + 1,
            ),
        ]
    goals += [
        holds(
            "one_workspace_after_a_forward_alone",
            persistent_workspaces(events, recorded["forward_end"]) == 1,
            "1 (the forward's thread)",
        ),
        holds(
            "workspaces_after_a_step_are_the_traces",
            persistent_workspaces(events) == CUBLAS_HANDLES_PER_STEP,
            f"{CUBLAS_HANDLES_PER_STEP} (CUBLAS_HANDLES_PER_STEP)",
        ),
    ]
    return rows, goals


def markdown(data: dict[str, Any]) -> str:
    mib = lambda v: f"{v / 2**20:.1f}"  # noqa: E731
    lines = ["# Where a step holds its memory at its peak", ""]
    for row in data["steps"]:
        trace = row["trace"]
        lines += [
            f"## {row['workload']} {row['amp']} at micro batch {row['micro_batch_size']}:"
            f" allocated {mib(row['allocated_bytes'] or 0)} MiB at its peak"
            f" ({row['replay_peak_phase']}); the trace predicts {mib(trace['peak_bytes'])} MiB"
            f" ({trace['segment']})",
            "",
            "| phase | where | block MiB | blocks | MiB |",
            "| --- | --- | ---: | ---: | ---: |",
            *(
                f"| {g['phase']} | {g['where']} | {mib(g['block_bytes'])} | {g['blocks']}"
                f" | {mib(g['bytes'])} |"
                for g in row["live_at_peak"]
                if g["bytes"] >= 2**20
            ),
            "",
            "The trace at its peak, MiB: "
            + ", ".join(f"{k} {mib(v)}" for k, v in trace["breakdown"].items() if v),
            "",
        ]
    return "\n".join(lines)


def main() -> int:
    if (started := begin(NAME)) is None:
        return 0
    data, at = started
    start = time.time()
    rows, goals = findings(measure(torch.device("cuda", 0)))
    data.update(steps=rows, wall_s=time.time() - start)
    status = finish(NAME, data, goals, at)
    text = markdown(data)
    (results_dir() / f"{NAME}.md").write_text(text)
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
