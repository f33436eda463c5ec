"""Verify the trial wrapper on a real NVIDIA GPU: clock, NVML fields and the OOM path.

On a ResNet-18 with synthetic but learnable data (labels are a fixed random projection of
the image, so accuracy rises above chance), this:

1. trains with raybatch's loop and compares every reported ``train_s`` (the objective's clock)
   with the same training time from CUDA events recorded in the stream, evaluations
   bracketed by events and taken out (target: within 2%); then again with the clock read
   without synchronising, a negative control that shows the comparison can fail;
2. checks the NVML-backed report fields (peak memory, mean GPU utilisation) are filled;
3. probes a micro batch that cannot fit: the probe must say infeasible and leave no memory
   allocated behind.

Run on a GPU machine: .venv/bin/python bench/gpu_trial_timing.py
(writes bench/results/gpu_trial_timing.json). Without CUDA it says so and exits.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).parent))

from models import ResNet18
from provenance import write_result

import raybatch
from raybatch import keys
from raybatch.memory.probe import probe
from raybatch.trial.gpu_monitor import DeviceFigures
from raybatch.trial.loop import LoopOptions, train
from raybatch.trial.reporting import TrialReporter

REQUIRES_GPU = True
RESULTS = Path(__file__).parent / "results" / "gpu_trial_timing.json"
SPACE = raybatch.load_space("resnet50_imagenet_sgd")


class LearnableResNet(ResNet18):
    """ResNet-18 on 64x64 images whose 10 labels a linear probe of the pixels decides."""

    def make_data(self) -> TensorDataset:
        generator = torch.Generator().manual_seed(0)
        images = torch.randn(4096, 3, 64, 64, generator=generator)
        projection = torch.randn(3 * 64 * 64, 10, generator=generator)
        labels = (images.flatten(1) @ projection).argmax(1)
        return TensorDataset(images, labels)

    def build_model(self) -> torch.nn.Module:
        from models import resnet18

        return resnet18(num_classes=10)


class EventTimedReporter(TrialReporter):
    """Also times the training with CUDA events recorded *in the stream*, for comparison.

    An event's timestamp is taken when the GPU reaches it, not when the host reads a clock:
    the training time it gives (first step to each report, less the evaluations, each also
    bracketed by events) is independent of the reporter's clock. If the clock were read
    before the queued work had run (a missing synchronise), ``train_s`` would fall short of
    it and the ratio would show it; the negative control below does exactly that.
    """

    def start(self) -> TrialReporter:
        self.event_start = _event()
        self.eval_spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.event_train: list[float] = []
        return super().start()

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        begin = _event()
        with super().evaluating():
            yield
        self.eval_spans.append((begin, _event()))

    def metrics(self) -> dict[str, Any]:
        end = _event()
        out = super().metrics()
        end.synchronize()
        evals = sum(a.elapsed_time(b) for a, b in self.eval_spans) / 1000.0
        self.event_train.append(self.event_start.elapsed_time(end) / 1000.0 - evals)
        return out


def _event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _timed_run(workload: LearnableResNet, synchronize: bool) -> tuple[Any, list[Any], list[Any]]:
    """A short training run; its clock with the device synchronised (as trials run) or not."""
    device = torch.device("cuda", 0)
    reports: list[dict[str, Any]] = []
    reporter = EventTimedReporter(
        raybatch.Target(0.5),
        eval_every_samples=4096,
        max_time_s=120,
        report_fn=reports.append,
        synchronize=(lambda: torch.cuda.synchronize(device)) if synchronize else None,
        extra=DeviceFigures(device),
    )
    train(workload, SPACE.derive(128), reporter, device, LoopOptions(seed=0))
    pairs = [
        {"train_s": r[keys.TRAIN_S], "cuda_event_train_s": e, "ratio": r[keys.TRAIN_S] / e}
        for r, e in zip(reports, reporter.event_train, strict=True)
        if e > 0
    ]
    return reporter, reports, pairs


def main() -> None:
    if not torch.cuda.is_available():
        print("gpu_trial_timing: no CUDA device here; run this on a GPU machine.")
        return
    device = torch.device("cuda", 0)
    workload = LearnableResNet()
    start = time.time()
    reporter, reports, pairs = _timed_run(workload, synchronize=True)
    _, _, unsynced = _timed_run(workload, synchronize=False)  # the negative control
    before = torch.cuda.memory_allocated(device)
    too_big = probe(workload, SPACE.derive(1 << 16), "cuda:0")
    data = {
        "benchmark": "gpu_trial_timing",
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "status": reporter.status.value,
        "wall_s": time.time() - start,
        "clock_vs_cuda_events": pairs,
        "max_clock_error": max(abs(p["ratio"] - 1) for p in pairs),
        "negative_control_unsynchronised": {
            "pairs": unsynced,
            "max_clock_error": max(abs(p["ratio"] - 1) for p in unsynced),
        },
        "nvml_fields": {
            k: reports[-1].get(k) for k in (keys.PEAK_MEMORY_BYTES, keys.GPU_UTILIZATION)
        },
        "oom_probe": {
            "fits": too_big.fits,
            "error": too_big.error,
            "allocated_before": before,
            "allocated_after": torch.cuda.memory_allocated(device),
        },
    }
    write_result(RESULTS, data)
    print(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
