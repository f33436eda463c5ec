"""The bundled workloads' data: built once per machine, then read back without scikit-learn."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from raybatch.examples import datacache
from raybatch.examples.datacache import CACHE_ENV, cache_path, cached_split

# Every bundled split, and the benchmark's: each process that builds one prints a checksum of
# its tensors and whether scikit-learn was imported to build it.
BUILD_ALL = """
import sys
sys.path.insert(0, {bench!r})
import real_cases
from raybatch.examples import digits, tabular, wide
splits = [digits._split(), tabular._split(), wide._split(), real_cases._friedman()]
sums = [float(t.double().sum()) for s in splits for d in s for t in d.tensors]
print("sklearn" in sys.modules, sums)
"""


def _build_all_in_a_fresh_process(cache: Path) -> tuple[bool, str]:
    bench = str(Path(__file__).resolve().parent.parent / "bench")
    done = subprocess.run(
        [sys.executable, "-c", BUILD_ALL.format(bench=bench)], capture_output=True, text=True,
        check=True, env={**os.environ, CACHE_ENV: str(cache)},
    )  # fmt: skip
    imported, sums = done.stdout.strip().split(" ", 1)
    return imported == "True", sums


def test_a_second_process_reads_the_data_back_without_importing_scikit_learn(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    first_imported, first = _build_all_in_a_fresh_process(cache)
    assert first_imported  # the first process built them
    assert len(list(cache.glob("*.pt"))) == 4  # digits, tabular, wide, friedman: one file each
    second_imported, second = _build_all_in_a_fresh_process(cache)
    assert not second_imported  # read back: scikit-learn's second of import is not paid
    assert second == first  # the very tensors the first built


def _split(value: float) -> tuple[TensorDataset, TensorDataset]:
    return (TensorDataset(torch.full((3, 2), value), torch.arange(3)),
            TensorDataset(torch.full((1, 2), value), torch.arange(1)))  # fmt: skip


def test_a_split_is_keyed_by_its_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert cache_path("x", {"seed": 0}) != cache_path("x", {"seed": 1})
    assert cache_path("x", {"seed": 0}) != cache_path("y", {"seed": 0})
    given: list[dict[str, object]] = []
    cached_split("z", lambda **args: given.append(args) or _split(0.0), seed=3, size=2)
    assert given == [{"seed": 3, "size": 2}]  # the key is what the data are built from
    one = cached_split("x", lambda **_: _split(1.0), seed=0)
    two = cached_split("x", lambda **_: _split(2.0), seed=1)
    assert float(one[0].tensors[0][0, 0]) == 1.0 and float(two[0].tensors[0][0, 0]) == 2.0
    # Built before with these arguments: read back, not built again.
    again = cached_split("x", lambda **_: _split(9.0), seed=0)
    assert torch.equal(again[0].tensors[0], one[0].tensors[0])
    assert torch.equal(again[1].tensors[1], one[1].tensors[1])


def test_a_damaged_cache_file_is_built_again_and_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    cached_split("x", lambda **_: _split(1.0), seed=0)
    path = cache_path("x", {"seed": 0})
    path.write_bytes(path.read_bytes()[:100])  # cut short, as by a full disk
    rebuilt = cached_split("x", lambda **_: _split(3.0), seed=0)
    assert float(rebuilt[0].tensors[0][0, 0]) == 3.0
    assert float(cached_split("x", lambda **_: _split(4.0), seed=0)[0].tensors[0][0, 0]) == 3.0


def test_a_cache_folder_that_cannot_be_written_still_gives_the_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(blocked / "cache"))
    train, val = cached_split("x", lambda **_: _split(5.0), seed=0)
    assert float(train.tensors[0][0, 0]) == 5.0 and len(val) == 1
    assert not list(tmp_path.glob(".*.pt.*"))  # no half-written file left about


def test_the_cache_folder_defaults_to_the_users_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert datacache.cache_dir() == Path("/somewhere/raybatch/data")
