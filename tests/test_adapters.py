"""A LightningModule and its LightningDataModule searched as they are (real Lightning, real
training), through the trial wrapper and, from a user's folder, through the CLI."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import raybatch
from raybatch import Target, keys
from raybatch.errors import OptionError, WorkloadError
from raybatch.results.rows import read_trials_csv
from raybatch.trial.settings import TrialSettings
from raybatch.trial.wrapper import run_trial
from raybatch.workload import load_workload

pytest.importorskip("lightning")

JOB = Path(__file__).parent / "lightning_job.py"
SAMPLES = 300_000
"""What bounds a trial these tests expect to reach: a sample budget (the Lightning job reached at
69,632 samples, the Hugging Face ones at 4,096-8,192), with the time cap far past it; a time
cap is what a loaded machine runs out of first."""
WORKLOAD = """
from raybatch.adapters.lightning import LightningWorkload
from lightning_job import DigitsClassifier, DigitsData

workload = LightningWorkload(DigitsClassifier, DigitsData(), metrics=("val_acc", "val_loss"),
                             name="lightning_digits")
"""


@pytest.fixture()
def job(tmp_path: Path) -> Path:
    """The user's Lightning job in a folder of its own, and the two lines that search it."""
    folder = tmp_path / "user"
    folder.mkdir()
    shutil.copy(JOB, folder / "lightning_job.py")
    (folder / "search_me.py").write_text(WORKLOAD)
    yield folder / "search_me.py"
    sys.modules.pop("lightning_job", None)


def test_the_module_trains_as_written_with_the_recipes_lr_and_its_own_optimizer(job: Path) -> None:
    """Its training_step is the loss, its loaders' collate_fn makes the batches (dicts here),
    validation_step's self.log values are the metrics, and its AdamW runs at the recipe's LR
    and weight decay with its own group ratios (the bias group: a tenth of the LR, no decay)."""
    workload = load_workload(f"{job}:workload")
    space = raybatch.load_space("tabular_mlp_adamw")
    recipe = space.derive(64, 2)
    model = workload.build_model()
    optimizer = workload.build_optimizer(model, recipe)
    weights, biases = optimizer.param_groups
    assert type(optimizer).__name__ == "AdamW"
    assert weights["lr"] == pytest.approx(recipe.lr)
    assert biases["lr"] == pytest.approx(recipe.lr / 10)
    assert weights["weight_decay"] == pytest.approx(recipe.weight_decay)
    assert biases["weight_decay"] == 0.0
    batch = workload.example_batch(4)
    assert set(batch) == {"pixels", "label"} and batch["pixels"].shape == (4, 64)
    assert getattr(workload.collate(), "__name__", None) == "as_dict"  # the loaders' own
    assert getattr(workload.eval_collate(), "__name__", None) == "as_dict"

    reports: list[dict[str, Any]] = []
    settings = TrialSettings(Target(0.9, metric="val_acc"), max_time_s=600.0, max_samples=SAMPLES)
    config = {keys.MICRO_BATCH_SIZE: 64, keys.ACCUMULATION_STEPS: 2}
    run_trial(workload, space, settings, config, report_fn=reports.append)
    final = reports[-1]
    assert final[keys.STATUS] == "reached", final[keys.REASON]
    assert final["val_val_acc"] >= 0.9 and final["val_val_loss"] > 0


def test_a_metric_validation_step_does_not_log_is_named(job: Path) -> None:
    from raybatch.adapters.lightning import LightningWorkload

    workload = load_workload(f"{job}:workload")
    assert isinstance(workload, LightningWorkload)
    workload.metrics = (raybatch.Metric("val_f1"),)
    model = workload.build_model()
    from raybatch.batches import eval_batches

    batches = eval_batches(workload.val_dataset(), 256, model.device, workload.collate())
    with pytest.raises(WorkloadError, match=r"logged \['val_acc', 'val_loss'\], not \['val_f1'\]"):
        workload.evaluate(model, batches)


def _search_from_elsewhere(tmp_path: Path, workload: str, space: str, target: str,
                           max_time_s: int) -> str:  # fmt: skip
    """Two trials of ``raybatch search`` run from a folder beside the user's, through the CLI:
    one at least reaches, and the winner records the target. Returns what it said (stderr).
    A sample cap bounds a trial that cannot reach; the time cap is one no loaded machine hits."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "raybatch", "search", workload, "--space", space,
         "--target", target, "--trials", "2", "--max-time-per-trial", str(max_time_s),
         "--max-samples-per-trial", "100000",
         "--confirm-seeds", "0", "--run-dir", "run", "--quiet"],
        capture_output=True, text=True, cwd=cwd, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in read_trials_csv(cwd / "run" / "trials.csv") if r["phase"] == "search"]
    assert len(rows) == 2 and any(r["status"] == "reached" for r in rows), rows
    assert raybatch.load_best(cwd / "run").provenance.target == target
    # --quiet: raybatch's own lines, and none of Ray's boxes or INFO lines.
    assert "raybatch: trial 2 of 2" in proc.stderr and "Winner:" in proc.stdout
    assert "Configuration for experiment" not in proc.stdout, proc.stdout[:2000]
    assert "View detailed results" not in proc.stdout
    assert " INFO " not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr


@pytest.mark.slow
def test_cli_search_of_a_lightning_job_from_another_folder(job: Path, tmp_path: Path) -> None:
    """Searched as it is, and what its code does that the trials do not is said at the start:
    its configure_optimizers() returns a StepLR the search's warmup replaces."""
    workload = "../user/search_me.py:workload"
    said = _search_from_elsewhere(tmp_path, workload, "tabular_mlp_adamw", "val_acc>=0.9", 120)
    left_out = ("raybatch: not used by the search: DigitsClassifier.configure_optimizers()'s LR"
                " scheduler (StepLR)")  # fmt: skip
    assert left_out in said and said.index(left_out) < said.index("raybatch: searching:")


def test_init_space_writes_the_modules_own_recipe_as_the_reference(job: Path) -> None:
    """`raybatch init-space` reads the recipe from the module itself (configure_optimizers()'s
    AdamW: lr, weight decay, betas; the datamodule's batch size), says its source beside each
    value and what a search leaves out, and writes a space a search reads as is; never over
    a file."""
    run = [sys.executable, "-m", "raybatch", "init-space", "search_me.py:workload"]
    proc = subprocess.run(run, capture_output=True, text=True, cwd=job.parent, check=False)
    assert proc.returncode == 0, proc.stderr
    path = job.parent / "search_me_space.yaml"
    assert f"wrote {path.name}: the reference is 32 a step at lr 0.001 (adamw)" in proc.stdout
    assert "not used by a search: DigitsClassifier.configure_optimizers()'s LR" in proc.stdout
    space = raybatch.load_space(str(path))
    ref = space.reference
    assert (ref.batch_size, ref.lr, ref.weight_decay, ref.optimizer.value) == (
        32, 0.001, 0.01, "adamw")  # fmt: skip
    assert ref.optimizer_kwargs["betas"] == [0.9, 0.999] and ref.optimizer_kwargs["eps"] == 1e-8
    assert space.rules.lr.value == "sqrt" and space.search.world_size == [1]
    assert space.search.micro_batch_size == [4, 8, 16, 32, 64, 128, 256, 512]
    text = path.read_text()
    assert "# DigitsData.train_dataloader()'s batch size" in text
    assert "# Not used by a search: DigitsClassifier.configure_optimizers()'s LR scheduler" in text
    again = subprocess.run(run, capture_output=True, text=True, cwd=job.parent, check=False)
    assert again.returncode == 2 and "exists; choose another name (--out)" in again.stderr
    assert path.read_text() == text


def test_init_space_refuses_an_existing_file_before_it_imports_the_workload(
    tmp_path: Path,
) -> None:
    """Said in a second, not after the workload's imports (Lightning's alone take seconds):
    the file named by --out, or the default beside a workload file, is checked first."""
    from raybatch.cli.template import write_space_for

    job = tmp_path / "job.py"
    job.write_text("raise RuntimeError('the workload was imported')\n")
    for out, existing in (
        ("mine.yaml", tmp_path / "mine.yaml"),
        (None, tmp_path / "job_space.yaml"),
    ):
        existing.write_text("kept\n")
        with pytest.raises(OptionError, match="exists; choose another name"):
            write_space_for(f"{job}:workload", out and str(tmp_path / out))
        assert existing.read_text() == "kept\n"


def _job_classes(job: Path) -> tuple[Any, Any]:
    """The user's module and datamodule classes, imported from their folder as a user's
    script imports them."""
    sys.path.insert(0, str(job.parent))
    try:
        from lightning_job import DigitsClassifier, DigitsData
    finally:
        sys.path.remove(str(job.parent))
    return DigitsClassifier, DigitsData


def test_init_space_refuses_a_workload_of_raybatchs_own_and_an_unknown_optimizer(
    job: Path,
) -> None:
    """A raybatch Workload's recipe is its space already; an RMSprop has no space family."""
    from raybatch.adapters.lightning import LightningWorkload
    from raybatch.space.infer import write_space

    own = load_workload("raybatch.examples.tabular:workload")
    with pytest.raises(WorkloadError, match="a workload of raybatch's own: its recipe is its"):
        write_space(own.found_recipe(), own.name, job.parent / "x.yaml")
    DigitsClassifier, DigitsData = _job_classes(job)

    class Rms(DigitsClassifier):
        def configure_optimizers(self) -> Any:
            import torch

            return torch.optim.RMSprop(self.parameters(), lr=0.01)

        def on_train_epoch_end(self) -> None:
            pass

    workload = LightningWorkload(Rms, DigitsData(), name="rms")
    with pytest.raises(WorkloadError, match=r"trains with RMSprop; a space names sgd, adam"):
        write_space(workload.found_recipe(), workload.name, job.parent / "rms.yaml")
    assert not (job.parent / "rms.yaml").exists()
    assert workload.left_out() == ["Rms.on_train_epoch_end(): no Trainer calls it"]


def test_an_optimizer_other_than_the_spaces_is_said_as_not_used_by_the_search(job: Path) -> None:
    """The search trains with the space's optimizer, not configure_optimizers()'s: where the
    two differ (the family, or an argument both name), the start of the search says so."""
    from raybatch.adapters.lightning import LightningWorkload
    from raybatch.space.infer import not_searched

    DigitsClassifier, DigitsData = _job_classes(job)

    class Betas(DigitsClassifier):
        def configure_optimizers(self) -> Any:
            import torch

            return torch.optim.AdamW(self.parameters(), lr=0.001, betas=(0.5, 0.9))

    plain = LightningWorkload(DigitsClassifier, DigitsData(), name="plain")
    scheduler = "DigitsClassifier.configure_optimizers()'s LR scheduler (StepLR)"
    adamw = raybatch.load_space("tabular_mlp_adamw")
    assert [s[: len(scheduler)] for s in not_searched(plain, adamw)] == [scheduler]
    sgd = not_searched(plain, raybatch.load_space("digits_cnn_sgd"))
    assert sgd[1:] == ["DigitsClassifier.configure_optimizers(): AdamW: the search trains with"
                       " the space's reference.optimizer (sgd) instead"]  # fmt: skip
    betas = LightningWorkload(Betas, DigitsData(), name="betas")
    assert not_searched(betas, adamw) == [
        "Betas.configure_optimizers(): AdamW sets betas=[0.5, 0.9]: the search trains with the"
        " space's reference.optimizer_kwargs.betas=[0.9, 0.999] instead"
    ]
    assert not_searched(load_workload("raybatch.examples.tabular:workload"), adamw) == []


class _Tokens:
    """Generated token sequences (no download): the label says whether token 3 occurs."""

    def __init__(self, size: int, seed: int) -> None:
        import torch

        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(4, 32, (size, 12), generator=gen)
        self.labels = torch.randint(0, 2, (size,), generator=gen)
        where = torch.randint(0, 12, (size,), generator=gen)
        rows = self.labels.nonzero().flatten()
        self.ids[rows, where[rows]] = 3

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.labels[i], "idx": i}


def _with_mask(items: list[dict[str, Any]]) -> Any:
    """A collator of the user's own: a BatchEncoding, with the attention mask it adds."""
    import torch
    from transformers import BatchEncoding

    ids = torch.stack([item["input_ids"] for item in items])
    return BatchEncoding({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                          "labels": torch.stack([item["labels"] for item in items]),
                          "idx": torch.tensor([item["idx"] for item in items])})  # fmt: skip


def _tiny_bert() -> Any:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16, num_labels=2)  # fmt: skip
    return BertForSequenceClassification(config)


def _accuracy(prediction: Any) -> dict[str, float]:
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def test_a_hugging_face_model_trains_with_its_collator_and_compute_metrics() -> None:
    """What Trainer.hyperparameter_search takes (model_init, datasets, a collator,
    compute_metrics) is searched as it is: batches from its collator (a BatchEncoding made a
    dict; an ``idx`` column the model does not take left out, as the Trainer does), the model's
    own loss, the metrics compute_metrics returns, AdamW at the recipe's LR with no decay on
    biases and LayerNorm weights, as the Trainer does."""
    pytest.importorskip("transformers")
    from raybatch.adapters.huggingface import HuggingFaceWorkload

    workload = HuggingFaceWorkload(_tiny_bert, _Tokens(2048, 0), _Tokens(512, 1),
                                   data_collator=_with_mask, compute_metrics=_accuracy)  # fmt: skip
    space = raybatch.load_space("tabular_mlp_adamw")
    recipe = space.derive(32)
    model = workload.build_model()
    decayed, exempt = workload.build_optimizer(model, recipe).param_groups
    assert decayed["weight_decay"] == pytest.approx(recipe.weight_decay)
    assert exempt["weight_decay"] == 0.0 and decayed["lr"] == exempt["lr"] == recipe.lr
    assert len(exempt["params"]) > 0 and len(decayed["params"]) > 0
    batch = workload.collate()([workload.train_dataset()[i] for i in range(4)])
    assert type(batch) is dict and batch["attention_mask"].shape == (4, 12)
    assert workload.loss(model, batch) > 0  # idx left out

    reports: list[dict[str, Any]] = []
    settings = TrialSettings(Target(0.9), max_time_s=600.0, max_samples=SAMPLES)
    run_trial(workload, space, settings, {keys.MICRO_BATCH_SIZE: 32}, report_fn=reports.append)
    final = reports[-1]
    assert final[keys.STATUS] == "reached", final[keys.REASON]
    assert final["val_accuracy"] >= 0.9 and final["val_loss"] > 0


# ------------------------------------------------------------ init-workload's starting points


def _init(folder: Path, kind: str) -> Path:
    """``raybatch init-workload job.py --from KIND`` in ``folder``, as a user runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "raybatch", "init-workload", "job.py", "--from", kind],
        capture_output=True, text=True, cwd=folder, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--space job_space.yaml" in proc.stdout
    return folder / "job.py"


@pytest.mark.parametrize(
    ("kind", "metric"), [("lightning", "val_acc"), ("huggingface", "accuracy")]
)
def test_each_starting_point_of_init_workload_trains_to_its_target_as_written(
    tmp_path: Path, kind: str, metric: str
) -> None:
    """The Lightning and Hugging Face files ``init-workload --from`` writes run as written: one
    trial of their own space reaches the target their instructions name."""
    pytest.importorskip("transformers")
    path = _init(tmp_path, kind)
    assert f'--target "{metric}>=0.9"' in path.read_text()
    workload = load_workload(f"{path}:workload")
    space = raybatch.load_space(str(tmp_path / "job_space.yaml"))
    target = raybatch.metric.resolve_target(f"{metric}>=0.9", workload.metrics)
    reports: list[dict[str, Any]] = []
    settings = TrialSettings(target, max_time_s=600.0, max_samples=SAMPLES)
    run_trial(workload, space, settings, {keys.MICRO_BATCH_SIZE: 64}, report_fn=reports.append)
    assert reports[-1][keys.STATUS] == "reached", reports[-1][keys.REASON]


def test_an_unknown_starting_point_is_refused_naming_the_choices(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "raybatch", "init-workload", "job.py", "--from", "keras"],
        capture_output=True, text=True, cwd=tmp_path, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "from: must be one of workload, lightning, huggingface, got 'keras'" in proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_cli_search_of_a_hugging_face_model_from_another_folder(tmp_path: Path) -> None:
    """A Hugging Face model, written by ``init-workload --from huggingface`` in a folder of the
    user's, searched through the CLI from another folder."""
    pytest.importorskip("transformers")
    (tmp_path / "user").mkdir()
    _init(tmp_path / "user", "huggingface")
    workload, space = "../user/job.py:workload", "../user/job_space.yaml"
    _search_from_elsewhere(tmp_path, workload, space, "accuracy>=0.9", 120)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_python_search_of_a_lightning_job(job: Path, tmp_path: Path) -> None:
    """The same job searched from Python (``raybatch.search``), as a notebook would: the
    workload object is the user's, its module shipped to the trials' workers."""
    from raybatch.tuning.options import SearchOptions

    workload = load_workload(f"{job}:workload")
    options = SearchOptions(trials=2, max_time_s=120.0, max_samples=100_000, confirm_seeds=0,
                            gpus_per_trial=0)  # fmt: skip
    result = raybatch.search(workload, "tabular_mlp_adamw", "val_acc>=0.9", tmp_path / "run",
                             options, verbose=0)  # fmt: skip
    assert any(r.status.value == "reached" for r in result.rows), result.rows
    assert result.best is not None and result.best.provenance.target == "val_acc>=0.9"


def test_init_space_of_a_hugging_face_model_starts_from_training_arguments_defaults(
    tmp_path: Path,
) -> None:
    """The workload carries no TrainingArguments: the space's reference is what a Trainer
    trains with by default (as a TrainingArguments the user builds has it), each value marked
    to be replaced; the file reads back as a space, 5e-05 a float, not a string."""
    pytest.importorskip("transformers")
    from transformers import TrainingArguments

    from raybatch.adapters.huggingface import HuggingFaceWorkload
    from raybatch.space.infer import write_space

    workload = HuggingFaceWorkload(_tiny_bert, _Tokens(64, 0), _Tokens(32, 1), name="tiny")
    found = workload.found_recipe()
    args = TrainingArguments(output_dir=str(tmp_path / "out"))
    assert (found.batch_size, found.lr, found.weight_decay) == (
        args.per_device_train_batch_size, args.learning_rate, args.weight_decay)  # fmt: skip
    assert found.optimizer_kwargs == {"betas": [args.adam_beta1, args.adam_beta2],
                                      "eps": args.adam_epsilon}  # fmt: skip
    path = write_space(found, workload.name, tmp_path / "tiny_space.yaml")
    space = raybatch.load_space(str(path))
    assert space.reference.lr == args.learning_rate and space.reference.optimizer.value == "adamw"
    assert "# TrainingArguments' default: put your own learning_rate" in path.read_text()
