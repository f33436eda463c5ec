"""Loading workloads by reference, and the contract's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from raybatch import load_space
from raybatch.errors import WorkloadError
from raybatch.examples.digits import DigitsWorkload
from raybatch.workload import SimpleWorkload, build_optimizer, load_workload

WORKLOAD_FILE = """
import torch
from torch.utils.data import TensorDataset
from raybatch.workload import SimpleWorkload, Workload

data = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
instance = SimpleWorkload(lambda: torch.nn.Linear(4, 2), data, data, name="from_file")

def factory():
    return SimpleWorkload(lambda: torch.nn.Linear(4, 2), data, data, name="factory")

class Sub(SimpleWorkload):
    def __init__(self):
        super().__init__(lambda: torch.nn.Linear(4, 2), data, data, name="subclass")

not_a_workload = 42
"""


@pytest.fixture
def workload_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_workload.py"
    path.write_text(WORKLOAD_FILE)
    return path


@pytest.mark.parametrize(
    ("attr", "name"), [("instance", "from_file"), ("factory", "factory"), ("Sub", "subclass")]
)
def test_a_file_reference_gives_an_instance_factory_or_subclass(
    workload_file: Path, attr: str, name: str
) -> None:
    assert load_workload(f"{workload_file}:{attr}").name == name


def test_a_module_reference_loads_the_bundled_example() -> None:
    assert isinstance(load_workload("raybatch.examples.digits:workload"), DigitsWorkload)


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("no_colon_here", "a workload is given as path/to/file.py:NAME or package.module:NAME"),
        ("missing/file.py:w", "no such file missing/file.py"),
        ("raybatch.no_such_module:w", "cannot import module raybatch.no_such_module"),
        ("raybatch.examples.digits:nothing", "has no attribute 'nothing'"),
    ],
)
def test_bad_references_say_what_is_wrong(reference: str, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        load_workload(reference)


def test_an_object_that_is_not_a_workload_is_refused(workload_file: Path) -> None:
    with pytest.raises(WorkloadError, match=r"not_a_workload is a int, not a raybatch\.Workload"):
        load_workload(f"{workload_file}:not_a_workload")


def test_a_file_that_fails_to_import_is_reported(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(WorkloadError, match=r"importing .*broken\.py failed: RuntimeError: boom$"):
        load_workload(f"{broken}:w")


def test_default_example_batch_cycles_a_small_dataset() -> None:
    data = torch.utils.data.TensorDataset(torch.arange(3.0).view(3, 1), torch.tensor([0, 1, 2]))
    workload = SimpleWorkload(lambda: torch.nn.Linear(1, 3), data, data)
    inputs, labels = workload.example_batch(7)
    assert labels.tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert inputs.shape == (7, 1)


def test_default_evaluate_is_accuracy() -> None:
    model = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
    batches = [(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))]
    data = torch.utils.data.TensorDataset(torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))
    assert SimpleWorkload(lambda: model, data, data).evaluate(model, batches) == 0.5


@pytest.mark.parametrize(
    ("space", "cls", "extra"),
    [
        ("digits_cnn_sgd", torch.optim.SGD, {"momentum": 0.9}),
        ("bert_finetune_adamw", torch.optim.AdamW, {"betas": (0.9, 0.999), "eps": 1e-6}),
    ],
)
def test_optimizer_is_built_from_the_derived_recipe(space: str, cls: type, extra: dict) -> None:
    config = load_space(space).derive(16, 2)
    optimizer = build_optimizer(torch.nn.Linear(2, 2).parameters(), config)
    assert isinstance(optimizer, cls)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"]) == (config.lr, config.weight_decay)
    assert {k: group[k] for k in extra} == extra
