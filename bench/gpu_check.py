"""Verify the GPU paths that only a real NVIDIA GPU can exercise (``make gpu-check`` runs this
after ``gpu_memory_accuracy.py`` and ``gpu_trial_timing.py``).

1. **Packed trials, all at their caps at once** (run first, while this process holds no CUDA
   context). ``k`` = 3 processes each hold ``1/k`` of the GPU and cap their allocators with
   the shipped ``limit_packed_memory(device, budget, context, 1/k)`` (a trial's own call, the
   share as Ray assigns it), the budget read from
   NVML and the context measured by a fresh process, as a search does. Each builds a real
   model (an MLP with AdamW), runs its steps once, then fills its slot to within
   ``SLOT_MARGIN_BYTES`` of its cap; at a barrier all train at once for ``STEP_S`` while NVML's
   device use is sampled. At a second barrier one of them trains a step on ``OVERRUN_FACTOR``
   times the micro batch, whose activations overrun its cap (its slot held, the device still
   had room), while its neighbours keep training. Targets: no process runs out of memory
   while all are at their caps and each trains; the device use of the ``k`` (NVML, contexts
   included) stays within the budget plus one context, the ``k`` slots' total, plus
   ``ALLOWANCE_BYTES`` per process; what each uses beyond its allocator (its real context)
   is within the measured context plus that allowance; the overrunning step gets the OOM
   itself, from its cap (the device had the room), while every neighbour was training, and
   every neighbour trains on without one.
2. **NVML fields**: every GPU of the machine as raybatch reads it (name, total, free, other
   processes' use, or ``None`` where NVML may not list processes), the budget it derives,
   and the utilisation monitor's figure and scope (``process`` where NVML gives per-process
   utilisation, else ``device``) over two seconds of matmuls. Targets: the GPUs are read, the
   budget is positive, the monitor reads a utilisation above zero.
3. **A real probe OOM is freed, and the next trial is unaffected**: the probe of a micro
   batch that cannot fit says infeasible and leaves allocated and reserved memory where they
   were (within ``FREED_TOLERANCE_BYTES``) and NVML's used memory within
   ``NVML_FREED_TOLERANCE_BYTES``. The control, the probe's own step run out of memory without
   the probe's release, must leave more than that reserved and used: a probe that skipped
   ``empty_cache`` would fail. Then a real trial (``run_trial``, the wrapper's own path,
   device from the process, its own probe first) reaches its target.

4. **An fp16 overflow skips warmup and the average**: a step whose gradients overflow, through
   the loop's own optimizer step on CUDA's ``GradScaler``, moves neither the weights, the
   warmup schedule nor the weight average, and the next step moves both; the control, a loop
   that steps its schedule whatever the scaler did, moves it on the same overflow.
5. **A GPU named by its UUID** in ``CUDA_VISIBLE_DEVICES`` (a fresh process): raybatch's NVML
   readers read that GPU and only it, torch sees one device; the control, a UUID that names
   no GPU, reads none.

A check that crashes is recorded with its error and misses its target; the others still run.

Run on a GPU machine: python bench/gpu_check.py (writes gpu_check.json to
``$RAYBATCH_RESULTS_DIR``, default bench/results/); exits 3 when a target is missed. Without
CUDA it says so, writes nothing and exits 0. About a minute on an H100.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from gpu_recipes import StoredSpace, at_micro_batch, recipe
from gpu_targets import Goal, at_least, at_most, begin, finish, holds

import raybatch
from raybatch.cluster.budget import CUDA_CONTEXT_OVERHEAD_BYTES, resolve_budget
from raybatch.cluster.nvml import read_all_devices, read_device_memory
from raybatch.cluster.placement import limit_packed_memory
from raybatch.errors import first_line

REQUIRES_GPU = True
NAME = "gpu_check"
PACKED = 3
"""Processes packed on the GPU, each holding ``1/PACKED`` of it."""
SLOT_MARGIN_BYTES = 256 * 2**20
"""How far inside its cap each packed process fills its slot before training."""
ALLOWANCE_BYTES = 64 * 2**20
"""Per process: kernel modules a training step loads beyond the context measurement's."""
STEP_S = 3.0
WIDTH, LAYERS, MICRO_BATCH = 4096, 6, 8192
"""The packed processes' MLP: 100M parameters (1.6 GB with AdamW's state and gradients) and
about 1.5 GB of activations a step: a real step, a few a second with three sharing a GPU."""
OVERRUN_FACTOR = 3
"""The overrunning step's micro batch, in micro batches: its activations need some 2 GB more
than its slot has left, and the device has room for them (the cap, not the device, refuses)."""
OVERRUN_AFTER_S = 0.5
FREED_TOLERANCE_BYTES = 2**20
NVML_FREED_TOLERANCE_BYTES = 256 * 2**20
"""What NVML may read above its figure before the probe: the kernel modules the step's first
kernels load live outside the allocator; a probe that kept its cache would hold gigabytes."""
OOM_MICRO_BATCH = 1 << 17
"""ResNet-18 at 64x64 on 131072 images: some 250 GB of activations, beyond any one GPU."""
BARRIER_TIMEOUT_S = 180.0


# ---------------------------------------------------------------- 1. packed trials


def _mlp() -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS - 1):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 10))


def _step(model: torch.nn.Module, optimizer: Any, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def _train_for(seconds: float, step: Callable[[], None]) -> dict[str, Any]:
    """One step, then more until ``seconds`` have passed, or until one runs out of memory."""
    start, steps, oom = time.time(), 0, None
    try:
        while steps == 0 or time.time() - start < seconds:
            step()
            steps += 1
    except torch.cuda.OutOfMemoryError as exc:
        oom = first_line(exc)
    return {"steps": steps, "oom": oom, "start": start, "end": time.time()}


def _wait(barrier: Any) -> bool:
    try:
        barrier.wait(BARRIER_TIMEOUT_S)
    except threading.BrokenBarrierError:
        return False
    return True


def _packed_trial(
    rank: int, budget: int, context_bytes: int, overrun: bool, barrier: Any, out: Any
) -> None:
    """One packed trial: cap, fill the slot, train with the others, overrun if asked."""
    record: dict[str, Any] = {"rank": rank, "overruns": overrun}
    try:
        total = torch.cuda.get_device_properties(0).total_memory
        # The trial's own call (raybatch.trial.wrapper), its share given as Ray would assign it.
        fraction = limit_packed_memory(torch.device("cuda", 0), budget, context_bytes, 1 / PACKED)
        if fraction is None:
            raise RuntimeError("limit_packed_memory set no cap for a 1/k share")
        cap = int(fraction * total)
        record.update(fraction=fraction, cap_bytes=cap)
        model = _mlp().cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(MICRO_BATCH, WIDTH, device="cuda")
        y = torch.randint(0, 10, (MICRO_BATCH,), device="cuda")
        if overrun:  # its next, larger batch is already loaded: the step is what overruns
            big_x, big_y = x.repeat(OVERRUN_FACTOR, 1), y.repeat(OVERRUN_FACTOR)
        _step(model, optimizer, x, y)  # the optimizer's state, cuBLAS, the kernels
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        _step(model, optimizer, x, y)
        record["step_peak_bytes"] = torch.cuda.max_memory_allocated() - before
        ballast = torch.empty(  # noqa: F841 (held: the slot is full)
            cap - torch.cuda.memory_reserved() - SLOT_MARGIN_BYTES, dtype=torch.uint8, device="cuda"
        ).fill_(1)
        torch.cuda.synchronize()
        record["reserved_at_cap_bytes"] = torch.cuda.memory_reserved()
    except Exception as exc:
        record["setup_error"] = f"{type(exc).__name__}: {first_line(exc)}"
    ready = "setup_error" not in record
    _wait(barrier)  # 1: every slot is full
    if ready:
        record["at_caps"] = _train_for(STEP_S, lambda: _step(model, optimizer, x, y))
    _wait(barrier)  # 2: one overruns while the others train on
    if ready and overrun:
        time.sleep(OVERRUN_AFTER_S)  # the neighbours are training by now
        device = read_device_memory(0)
        record["device_free_before_overrun_bytes"] = None if device is None else device.free_bytes
        record["overrun"] = _train_for(0.0, lambda: _step(model, optimizer, big_x, big_y))
    elif ready:
        record["beside_overrun"] = _train_for(STEP_S, lambda: _step(model, optimizer, x, y))
    record["max_reserved_bytes"] = torch.cuda.max_memory_reserved() if ready else None
    _wait(barrier)  # 3: done
    out.put(record)


class _Sampler:
    """NVML's device use, sampled in a thread until stopped; the peak of each phase."""

    def __init__(self) -> None:
        self.phase = "starting"
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            device = read_device_memory(0)
            if device is not None:
                self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), device.used_bytes)
            time.sleep(0.02)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _context_process(out: Any) -> None:
    """A fresh process measures its own CUDA context, as the search's measuring task does."""
    from raybatch.cluster.context import measure_context_bytes

    out.put(measure_context_bytes(0))


def packed_trials() -> tuple[dict[str, Any], list[Goal]]:
    import torch.multiprocessing as mp

    spawn = mp.get_context("spawn")
    queue = spawn.Queue()
    measurer = spawn.Process(target=_context_process, args=(queue,))
    measurer.start()
    measured = queue.get(timeout=120)
    measurer.join()
    context_bytes = measured or CUDA_CONTEXT_OVERHEAD_BYTES
    baseline = read_device_memory(0)
    if baseline is None:
        raise RuntimeError("NVML cannot read the device: the packing check needs it")
    budget = resolve_budget(context_overhead_bytes=context_bytes).bytes
    barrier = spawn.Barrier(PACKED + 1)
    trials = [
        spawn.Process(target=_packed_trial, args=(i, budget, context_bytes, i == 0, barrier, queue))
        for i in range(PACKED)
    ]
    with _Sampler() as sampler:
        for p in trials:
            p.start()
        sampler.phase = "filling"
        _wait(barrier)
        sampler.phase = "at_caps"
        _wait(barrier)
        sampler.phase = "overrun"
        _wait(barrier)
        records = sorted((queue.get(timeout=60) for _ in trials), key=lambda r: r["rank"])
    for p in trials:
        p.join(timeout=60)
    used_by_trials = max(sampler.peaks.values(), default=0) - baseline.used_bytes
    reserved = sum(r.get("reserved_at_cap_bytes") or 0 for r in records)
    at_caps_used = sampler.peaks.get("at_caps", 0) - baseline.used_bytes
    beyond_allocator = (at_caps_used - reserved) / PACKED
    over, neighbours = records[0], records[1:]
    overrun = over.get("overrun", {})
    needed = OVERRUN_FACTOR * over.get("step_peak_bytes", 0)
    data = {
        "processes": PACKED,
        "budget_bytes": budget,
        "context_bytes_measured": measured,
        "context_bytes_assumed": CUDA_CONTEXT_OVERHEAD_BYTES,
        "slots_with_contexts_bytes": budget + context_bytes,
        "device_used_before_bytes": baseline.used_bytes,
        "device_used_peaks_bytes": sampler.peaks,
        "device_used_by_trials_bytes": used_by_trials,
        "reserved_at_caps_bytes": reserved,
        "overrun_step_needs_about_bytes": needed,
        "beyond_allocator_per_process_bytes": beyond_allocator,
        "trials": records,
    }
    at_caps = [r.get("at_caps", {}) for r in records]
    beside = [n.get("beside_overrun", {}) for n in neighbours]
    when = overrun.get("end", -1.0)  # the OOM
    overlapped = bool(beside) and all(
        b.get("start", 1e30) <= when <= b.get("end", -1e30) for b in beside
    )
    trained_on = bool(beside) and all(
        b.get("steps", 0) > 0 and b.get("oom") is None for b in beside
    )
    goals = [
        holds(
            "packed_all_filled_their_slots",
            all("setup_error" not in r for r in records),
            "every process filled its slot",
        ),
        holds(
            "packed_none_oom_at_caps",
            all(a.get("steps", 0) > 0 and a.get("oom") is None for a in at_caps),
            "every process trains at its cap without an OOM",
        ),
        at_most(
            "packed_device_use_bytes",
            used_by_trials,
            budget + context_bytes + PACKED * ALLOWANCE_BYTES,
        ),
        at_most("packed_context_bytes", beyond_allocator, context_bytes + ALLOWANCE_BYTES),
        holds(
            "overrun_step_gets_the_oom",
            overrun.get("oom") is not None,
            "the overrunning step runs out of memory",
        ),
        holds(
            "overrun_from_its_cap_not_the_device",
            (over.get("device_free_before_overrun_bytes") or 0) > needed > 0,
            "the device had room for the step: the cap refused it",
        ),
        holds(
            "overrun_while_neighbours_train",
            overlapped,
            "the OOM came while every neighbour was training",
        ),
        holds(
            "neighbours_train_on",
            trained_on,
            "every neighbour trains through the overrun without an OOM",
        ),
    ]
    return data, goals


# ---------------------------------------------------------------- 2. NVML fields


def nvml_fields() -> tuple[dict[str, Any], list[Goal]]:
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
    del a
    budget = resolve_budget()
    data = {
        "devices": None if devices is None else [asdict(d) for d in devices],
        "device_0": None if (d := read_device_memory(0)) is None else asdict(d),
        "budget_bytes": budget.bytes,
        "budget_source": budget.source,
        "utilization_percent": monitor.mean(),
        "utilization_scope": monitor.scope,
    }
    goals = [
        at_least("nvml_devices_read", len(devices or []), 1),
        at_least("nvml_budget_bytes", budget.bytes, 1),
        at_least("nvml_utilization_under_matmuls_percent", monitor.mean(), 1),
    ]
    return data, goals


# ---------------------------------------------------------------- 3. probe OOM, then a trial


def _memory_now() -> dict[str, int | None]:
    """This process's allocated and reserved bytes, and NVML's used memory of the GPU."""
    device = read_device_memory(0)
    return {
        "allocated": int(torch.cuda.memory_allocated(0)),
        "reserved": int(torch.cuda.memory_reserved(0)),
        "nvml_used": None if device is None else device.used_bytes,
    }


def _left(before: dict[str, int | None], after: dict[str, int | None]) -> dict[str, int | None]:
    """What is held now that was not before, by each reading."""
    return {k: None if before[k] is None or after[k] is None else after[k] - before[k]  # type: ignore[operator]
            for k in before}  # fmt: skip


def _unreleased_oom_step(workload: Any, config: Any) -> None:
    """The control: the probe's own step, out of memory, without the probe's release (what a
    probe that skipped ``release_memory`` would leave: the step's blocks cached, reserved)."""
    from raybatch.memory.probe import is_out_of_memory, steady_step

    try:
        steady_step(workload, config, torch.device("cuda", 0))
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
    # Returning drops the traceback and the step's frames: their tensors go back to the cache.


def probe_oom_then_trial() -> tuple[dict[str, Any], list[Goal]]:
    from gpu_trial_timing import LearnableResNet

    from raybatch.examples.digits import DigitsWorkload
    from raybatch.memory.probe import probe, release_memory
    from raybatch.trial.settings import TrialSettings
    from raybatch.trial.wrapper import run_trial

    workload = LearnableResNet()
    too_big_recipe = at_micro_batch(recipe("resnet50_imagenet_sgd", None), OOM_MICRO_BATCH)
    release_memory("cuda:0")
    before = _memory_now()
    too_big = probe(workload, too_big_recipe, "cuda:0")
    left = _left(before, _memory_now())
    _unreleased_oom_step(workload, too_big_recipe)
    control = _left(before, _memory_now())
    release_memory("cuda:0")
    reports: list[dict[str, Any]] = []
    settings = TrialSettings(target=raybatch.Target(0.9), max_time_s=30.0, eval_every_samples=512)
    reporter = run_trial(
        DigitsWorkload(),
        StoredSpace("digits_cnn_sgd"),  # type: ignore[arg-type]
        settings,
        {"micro_batch_size": 64},
        reports.append,
    )
    release_memory("cuda:0")
    data = {
        "oom_probe": {
            "micro_batch_size": OOM_MICRO_BATCH,
            "fits": too_big.fits,
            "error": too_big.error,
        },
        "before_probe": before,
        "left_by_probe": left,
        "left_by_control_unreleased_step": control,
        "next_trial_status": reporter.status.value,
        "next_trial_reason": reporter.reason,
        "next_trial_reports": len(reports),
        "allocated_after_trial": torch.cuda.memory_allocated(0),
    }
    goals = [
        holds("oom_probe_says_infeasible", too_big.fits is False, "the probe says it cannot fit"),
        at_most("oom_probe_left_allocated_bytes", _abs(left["allocated"]), FREED_TOLERANCE_BYTES),
        at_most("oom_probe_left_reserved_bytes", _abs(left["reserved"]), FREED_TOLERANCE_BYTES),
        at_most(
            "oom_probe_left_nvml_used_bytes", _abs(left["nvml_used"]), NVML_FREED_TOLERANCE_BYTES
        ),
        at_least(
            "control_unreleased_step_left_reserved_bytes",
            control["reserved"],
            NVML_FREED_TOLERANCE_BYTES,
        ),
        at_least(
            "control_unreleased_step_left_nvml_used_bytes",
            control["nvml_used"],
            NVML_FREED_TOLERANCE_BYTES,
        ),
        holds(
            "next_trial_reaches_target",
            reporter.status.value == "reached",
            "the next trial reaches its target",
        ),
    ]
    return data, goals


def _abs(value: int | None) -> int | None:
    return None if value is None else abs(value)


# ---------------------------------------------------------------- 4. an fp16 overflow


def fp16_overflow(device: str = "cuda") -> tuple[dict[str, Any], list[Goal]]:
    """A step whose fp16 gradients overflow, through the loop's own optimizer step on CUDA's
    ``GradScaler``: the scaler skips it, and so must the warmup schedule and the weight
    average. The control is a loop that steps its schedule whatever the scaler did: on the
    same overflow its schedule moves, which the check would catch. (``device="cpu"``: the
    same on the CPU's scaler, as the tests run it.)"""
    from raybatch.trial.ema import WeightAverage
    from raybatch.trial.loop import LoopOptions, LoopParts, optimizer_step

    def parts() -> Any:
        model = torch.nn.Linear(64, 64).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        warmup = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / 100)
        )
        ema = WeightAverage(model, 0.5)
        return LoopParts(model, model, optimizer, warmup, ema, torch.amp.GradScaler(device), None)

    def backward(p: Any, overflow: bool) -> None:
        with torch.autocast(device, dtype=torch.float16):
            loss = p.model(torch.randn(8, 64, device=device)).float().mean()
        p.scaler.scale(loss * float("inf") if overflow else loss).backward()

    shipped = parts()
    weights = [w.detach().clone() for w in shipped.model.parameters()]
    scale = shipped.scaler.get_scale()
    backward(shipped, overflow=True)
    optimizer_step(shipped, LoopOptions())
    overflowed = {
        "scale_before": scale,
        "scale_after": shipped.scaler.get_scale(),
        "schedule_steps": shipped.scheduler.last_epoch,
        "ema_updates": shipped.ema.updates,
        "weights_unchanged": all(
            torch.equal(a, b) for a, b in zip(weights, shipped.model.parameters(), strict=True)
        ),
    }
    backward(shipped, overflow=False)
    optimizer_step(shipped, LoopOptions())
    then = {"schedule_steps": shipped.scheduler.last_epoch, "ema_updates": shipped.ema.updates}
    naive = parts()  # the control: scaler.step, then the schedule unconditionally
    backward(naive, overflow=True)
    naive.scaler.step(naive.optimizer)
    naive.scaler.update()
    with warnings.catch_warnings():  # torch's own: a schedule stepped without its optimizer
        warnings.simplefilter("ignore", UserWarning)
        naive.scheduler.step()
    data = {"overflow_step": overflowed, "next_step": then,
            "control_naive_schedule_steps": naive.scheduler.last_epoch}  # fmt: skip
    goals = [
        holds(
            "fp16_overflow_was_real",
            overflowed["scale_after"] < scale,
            "the scaler lowered its scale",
        ),
        holds(
            "fp16_overflow_skipped_the_weights",
            overflowed["weights_unchanged"],
            "weights unchanged",
        ),
        holds(
            "fp16_overflow_skipped_the_warmup",
            overflowed["schedule_steps"] == 0,
            "0 schedule steps",
        ),
        holds("fp16_overflow_skipped_the_ema", overflowed["ema_updates"] == 0, "0 average updates"),
        holds(
            "fp16_next_step_moves_both",
            then == {"schedule_steps": 1, "ema_updates": 1},
            "1 schedule step and 1 average update",
        ),
        holds(
            "control_naive_loop_moves_its_schedule",
            naive.scheduler.last_epoch == 1,
            "the naive loop's schedule moved on the overflow",
        ),
    ]
    return data, goals


# ---------------------------------------------------------------- 5. a GPU named by its UUID

_VISIBLE = """
import json, torch
from raybatch.cluster.nvml import read_all_devices, read_device_memory
one = read_device_memory(0)
every = read_all_devices()
print(json.dumps({"torch_devices": torch.cuda.device_count(),
                  "nvml_name": None if one is None else one.name,
                  "nvml_total_bytes": None if one is None else one.total_bytes,
                  "nvml_devices": None if every is None else len(every)}))
"""


def _visible_as(entry: str) -> dict[str, Any]:
    """What raybatch's NVML readers and torch see in a process whose only visible GPU is
    ``entry`` (``CUDA_VISIBLE_DEVICES``, as a scheduler or Ray sets it)."""
    import json
    import os
    import subprocess

    root = str(Path(__file__).resolve().parent.parent)  # raybatch, however this was started
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": entry, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", _VISIBLE], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def visible_by_uuid() -> tuple[dict[str, Any], list[Goal]]:
    """``CUDA_VISIBLE_DEVICES`` naming the GPU by its UUID: raybatch reads that GPU (its name
    and total memory as NVML gives them for its index), as torch sees it. The control, a UUID
    that names no GPU, reads none."""
    from raybatch.cluster.nvml import nvml

    pynvml = nvml()
    if pynvml is None:
        raise RuntimeError("NVML cannot be used here")
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    finally:
        pynvml.nvmlShutdown()
    seen = _visible_as(uuid)
    control = _visible_as("GPU-00000000-0000-0000-0000-000000000000")
    data = {"uuid": uuid, "seen": seen, "control_unknown_uuid": control}
    goals = [
        holds(
            "uuid_gpu_read_by_nvml",
            seen.get("nvml_total_bytes") == total and seen.get("nvml_devices") == 1,
            "the GPU the UUID names, and only it",
        ),
        holds("uuid_gpu_seen_by_torch", seen.get("torch_devices") == 1, "one CUDA device"),
        holds(
            "control_unknown_uuid_reads_no_gpu",
            "error" not in control and control.get("nvml_total_bytes") is None,
            "no GPU read for a UUID that names none",
        ),
    ]
    return data, goals


def _guarded(name: str, check: Callable[[], tuple[dict[str, Any], list[Goal]]]
             ) -> tuple[dict[str, Any], list[Goal]]:  # fmt: skip
    """Run one check; a crash is recorded and misses the check's target."""
    try:
        return check()
    except Exception as exc:
        traceback.print_exc()
        error = f"{type(exc).__name__}: {first_line(exc)}"
        return {"error": error}, [holds(f"{name}_ran", False, "the check ran to its end")]


def main() -> int:
    if (started := begin(NAME)) is None:
        return 0
    data, at = started
    start = time.time()
    goals: list[Goal] = []
    for name, check in (
        ("packed_trials", packed_trials),  # first: this process holds no CUDA memory yet
        ("nvml", nvml_fields),
        ("probe_oom_then_trial", probe_oom_then_trial),
        ("fp16_overflow", fp16_overflow),
        ("visible_by_uuid", visible_by_uuid),
    ):
        data[name], more = _guarded(name, check)
        goals += more
    data["wall_s"] = time.time() - start
    return finish(NAME, data, goals, at)


if __name__ == "__main__":
    sys.exit(main())
