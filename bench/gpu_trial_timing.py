"""Verify the trial wrapper on a real NVIDIA GPU: clock, NVML fields and the OOM path.

On a ResNet-18 with synthetic but learnable data (labels are a fixed random projection of
the image, so accuracy rises above chance), this:

1. trains with raybatch's loop and compares every reported ``elapsed_s`` with CUDA-event
   timing of the same span (target: within 2%);
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


class EventTimedReporter(raybatch.TrialReporter):
    """Also times every reported span with CUDA events, for comparison."""

    def start(self) -> raybatch.TrialReporter:
        self.event_start = torch.cuda.Event(enable_timing=True)
        self.event_start.record()
        self.event_elapsed: list[float] = []
        return super().start()

    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        self.event_elapsed.append(self.event_start.elapsed_time(end) / 1000.0)
        return out


def main() -> None:
    if not torch.cuda.is_available():
        print("gpu_trial_timing: no CUDA device here; run this on a GPU machine.")
        return
    device = torch.device("cuda", 0)
    workload = LearnableResNet()
    recipe = SPACE.derive(128)
    reports: list[dict[str, Any]] = []
    reporter = EventTimedReporter(
        raybatch.Target(0.5),
        eval_every_samples=4096,
        max_time_s=120,
        report_fn=reports.append,
        synchronize=lambda: torch.cuda.synchronize(device),
        extra=DeviceFigures(device),
    )
    start = time.time()
    train(workload, recipe, reporter, device, LoopOptions(seed=0))
    pairs = [
        {"elapsed_s": r[keys.ELAPSED_S], "cuda_event_s": e, "ratio": r[keys.ELAPSED_S] / e}
        for r, e in zip(reports, reporter.event_elapsed, strict=True)
    ]
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
