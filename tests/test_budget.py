"""Memory budgets: size strings, and NVML degrading cleanly where there is no NVIDIA driver."""

from __future__ import annotations

import pytest

from raybatch.cluster.budget import CUDA_CONTEXT_OVERHEAD_BYTES, resolve_budget
from raybatch.cluster.nvml import DeviceMemory, read_device_memory
from raybatch.errors import BudgetUnavailableError, OptionError
from raybatch.memory.sizes import format_bytes, parse_size

from .fake_nvml import FourGpus, NoPermission


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 * 2**30),
        ("1500MB", 1_500_000_000),
        ("512 MiB", 512 * 2**20),
        ("1.5gib", int(1.5 * 2**30)),
        ("1073741824", 2**30),
        ("1e9", 10**9),
        ("64KiB", 65536),
        (4096, 4096),
    ],
)
def test_sizes_parse_with_binary_and_decimal_units(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-2GiB", "memory_budget: must be a positive size"),
        ("0", "memory_budget: must be a positive size"),
        ("3GX", "memory_budget: unknown unit 'GX' in '3GX'"),
        ("lots", "memory_budget: must be a positive size such as 2GiB"),
        ("", "memory_budget: must be a positive size"),
        (True, "memory_budget: must be a positive size"),
        ("inf", "memory_budget: must be a positive size"),
        (float("nan"), "memory_budget: must be a positive size"),
    ],
)
def test_bad_sizes_are_refused_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(OptionError) as err:
        parse_size(text)
    assert message in str(err.value)
    assert "units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB" in str(err.value)


def test_format_bytes_uses_binary_units() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 2**30 // 2) == "1.50 GiB"


def test_nvml_without_a_driver_reads_as_no_device() -> None:
    # CI machines have no NVIDIA driver: pynvml raises NVMLError_LibraryNotFound inside.
    assert read_device_memory(0) is None


def test_no_driver_and_no_explicit_budget_is_a_clear_error() -> None:
    with pytest.raises(
        BudgetUnavailableError, match=r"NVML is not available here.*--memory-budget"
    ):
        resolve_budget(None, cuda_index=0)


def test_an_explicit_budget_needs_no_driver_and_is_used_as_is() -> None:
    budget = resolve_budget("2GiB", cuda_index=0)
    assert (budget.bytes, budget.source, budget.device) == (2 * 2**30, "explicit", None)


def test_nvml_budget_applies_headroom_and_context_overhead(monkeypatch: pytest.MonkeyPatch) -> None:
    """The arithmetic on NVML's reading (the reading itself is verified on a real GPU)."""
    gpu = DeviceMemory("NVIDIA H100", 80 * 2**30, 60 * 2**30, 20 * 2**30, 19 * 2**30)
    monkeypatch.setattr("raybatch.cluster.budget.read_device_memory", lambda index: gpu)
    budget = resolve_budget(None, cuda_index=0, headroom=0.9)
    assert budget.bytes == int(0.9 * 60 * 2**30) - CUDA_CONTEXT_OVERHEAD_BYTES
    assert "0.9 x 60.00 GiB free on NVIDIA H100" in budget.source


def test_headroom_outside_zero_one_is_refused() -> None:
    with pytest.raises(OptionError, match="headroom: must be in"):
        resolve_budget(None, headroom=1.5)


class _ContainerNvml:
    """What NVML answers in many containers and under MIG: memory yes, process list no.

    No NVIDIA driver exists on CI to give this answer for real; the fake stands in for the
    driver only, and the code under test is the real reading."""

    NVMLError = NoPermission

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> object:
        from types import SimpleNamespace

        return SimpleNamespace(total=80 * 2**30, free=70 * 2**30, used=10 * 2**30)

    def nvmlDeviceGetName(self, handle: object) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[object]:
        raise NoPermission("Insufficient Permissions")


def test_a_process_listing_nvml_refuses_keeps_the_memory_reading() -> None:
    from raybatch.cluster.budget import budget_of
    from raybatch.cluster.nvml import _device_memory

    device = _device_memory(_ContainerNvml(), handle=object())
    assert (device.free_bytes, device.total_bytes) == (70 * 2**30, 80 * 2**30)
    assert device.used_by_other_processes_bytes is None  # unknown, not zero
    assert device.name == "NVIDIA H100 80GB HBM3"
    assert budget_of(device).bytes == int(0.9 * 70 * 2**30) - CUDA_CONTEXT_OVERHEAD_BYTES


@pytest.mark.parametrize(
    ("visible", "names"),
    [(None, ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]), ("3,GPU-b", ["GPU 3", "GPU 1"])],
)
def test_the_node_reader_sees_the_gpus_cuda_numbers_not_every_physical_one(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, names: list[str]
) -> None:
    """A node started with CUDA_VISIBLE_DEVICES gives Ray only those GPUs (indices or UUIDs, in
    CUDA's order); a busy GPU outside them must not shrink the budget. With --num-gpus below
    what CUDA sees, Ray manages the first ones."""
    import raybatch.cluster.nvml as nvml
    from raybatch.cluster.hardware import ClusterView, NodeView, rays_devices

    monkeypatch.setattr(nvml, "nvml", FourGpus)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    devices = nvml.read_all_devices()
    assert devices is not None and [d.name for d in devices] == names
    ray_two = rays_devices(tuple(devices), 2.0)  # ray start --num-gpus 2
    assert ray_two is not None and [d.name for d in ray_two] == names[:2]
    budget_of_two = ClusterView((NodeView("n", "n", 8, 2, ray_two),)).budget()
    assert budget_of_two is not None and budget_of_two.bytes > 60 * 2**30  # GPU 2 not counted
