"""The ``raybatch`` command line: parse, call the library, format. No logic lives here.

Bad input never shows a Python traceback: every :class:`~raybatch.errors.RaybatchError` is
printed to stderr as ``raybatch: error: FILE:LINE: FIELD: what is wrong`` and the command
exits with status 2 (the status click uses for usage errors).

The commands that search import the driver inside their bodies, not at the top: ``raybatch
--help`` or a bad option must answer at once, without importing torch, Ray and Optuna (seconds)
first. What the other commands need is light and imported at the top.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from raybatch.cli import args as cli_args
from raybatch.cli import tables
from raybatch.cli.args import (
    CLI,
    AddressOpt,
    BudgetOpt,
    ConfirmSeedsOpt,
    ConfirmTopOpt,
    GpuModelOpt,
    GpusOpt,
    JsonOpt,
    NoPriorOpt,
    SpaceArg,
    SpaceOpt,
)
from raybatch.cli.quick_exit import run_then_exit
from raybatch.cluster.budget import resolve_budget
from raybatch.cluster.connect import init_ray
from raybatch.cluster.hardware import read_cluster
from raybatch.cluster.preflight import preflight
from raybatch.errors import (
    BudgetUnavailableError,
    DiskFullError,
    InputError,
    Issue,
    OptionError,
    RaybatchError,
    SearchInterrupted,
)
from raybatch.export import AMP_NOT_RECORDED, load_best
from raybatch.formats.registry import format_named, formats_help
from raybatch.memory.estimator import estimate
from raybatch.memory.sizes import parse_size
from raybatch.metric import Target, resolve_target
from raybatch.results.outcome import no_winner_reason
from raybatch.run.rundir import RUN_FILE, read_run
from raybatch.space.presets import list_presets, load_space
from raybatch.tuning.options import SearchOptions
from raybatch.workload import load_workload

EXIT_NO_RECIPE = 1  # the search ran and no recipe reached the target
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # the shell's code for a process ended by SIGINT
EXIT_IO_ERROR = 74  # sysexits' EX_IOERR: a file could not be written or read (a full disk)

app = typer.Typer(
    name="raybatch",
    help="Find the batch-size recipe that reaches a target accuracy fastest, on Ray Tune.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@contextmanager
def _user_errors() -> Iterator[None]:
    """Report raybatch's input errors as one clean message and exit status 2."""
    try:
        yield
    except SearchInterrupted as exc:
        typer.echo(f"raybatch: {exc}", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except DiskFullError as exc:  # not bad input: the exit status of a write that failed
        typer.echo(f"raybatch: error: {exc}", err=True)
        raise typer.Exit(EXIT_IO_ERROR) from None
    except RaybatchError as exc:
        for line in str(exc).splitlines():
            typer.echo(f"raybatch: error: {line}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except OSError as exc:  # a full disk, a read-only folder: the file and the cause
        where = f"{exc.filename}: " if exc.filename else ""
        kept = "what was written before is kept; once the cause is gone, run the command again"
        typer.echo(f"raybatch: error: {where}{exc.strerror or exc} ({kept})", err=True)
        raise typer.Exit(EXIT_IO_ERROR) from None


@app.command("spaces")
def spaces_command() -> None:
    """List the bundled search-space presets."""
    with _user_errors():
        presets = list_presets()
    width = max(len(p.name) for p in presets)
    for p in presets:
        typer.echo(f"{p.name:<{width}}  {p.description}")


@app.command("space")
def space_command(
    space: SpaceArg,
    batch: Annotated[int, typer.Option("--batch", "-b", help="Micro batch size per device.")],
    accum: Annotated[int, typer.Option("--accum", "-a", help="Accumulation steps.")] = 1,
    world_size: Annotated[int, typer.Option("--world-size", "-w", help="Workers.")] = 1,
    lr_multiplier: Annotated[
        float, typer.Option("--lr-multiplier", help="Correction on top of the LR rule.")
    ] = 1.0,
    wd_multiplier: Annotated[
        float, typer.Option("--wd-multiplier", help="Correction on top of the weight-decay rule.")
    ] = 1.0,
    as_json: JsonOpt = False,
) -> None:
    """Print the recipe a space derives for one micro batch / accumulation / world size."""
    with _user_errors():
        cfg = load_space(space).derive(batch, accum, world_size, lr_multiplier, wd_multiplier)
    if as_json:
        typer.echo(json.dumps(cfg.to_dict(), indent=2))
        return
    typer.echo(tables.recipe_table(cfg))


@app.command("recipes")
def recipes_command(space: SpaceArg, as_json: JsonOpt = False) -> None:
    """Print the recipe of every micro batch x accumulation x world size in a space."""
    with _user_errors():
        loaded = load_space(space)
        configs = list(loaded.grid())
    if as_json:
        typer.echo(json.dumps([c.to_dict() for c in configs], indent=2))
        return
    typer.echo(f"{loaded.name}: {loaded.description}")
    typer.echo(
        f"reference: batch {loaded.reference.batch_size}, lr {loaded.reference.lr:g},"
        f" weight_decay {loaded.reference.weight_decay:g}, {loaded.reference.optimizer.value};"
        f" lr rule {loaded.rules.lr.value}, weight-decay rule {loaded.rules.weight_decay.value}"
    )
    header = ("micro", "accum", "world", "effective", "lr", "lr_scale", "weight_decay", "warmup")
    rows = [
        (
            str(c.micro_batch_size),
            str(c.accumulation_steps),
            str(c.world_size),
            str(c.effective_batch_size),
            f"{c.lr:.4g}",
            f"{c.lr_scale:.3g}x",
            f"{c.weight_decay:.4g}",
            f"{c.warmup_steps} steps" if c.warmup_steps else "-",
        )
        for c in configs
    ]
    typer.echo(tables.table(header, rows))


@app.command("estimate")
def estimate_command(
    workload: Annotated[
        str, typer.Argument(help="The workload: path/to/file.py:NAME or package.module:NAME.")
    ],
    batch: Annotated[
        str, typer.Option("--batch", "-b", help="Micro batch sizes, comma-separated: 8,16,32.")
    ],
    memory_budget: Annotated[
        str | None,
        typer.Option(
            "--memory-budget", help="Bytes a trial may use: 2GiB, 1500MB... (default: NVML)."
        ),
    ] = None,
    device: Annotated[
        str, typer.Option("--device", help="Device to predict for: cuda[:N] or cpu.")
    ] = "cuda:0",
    space: Annotated[
        str | None,
        typer.Option("--space", help="Space for the optimizer (default: the workload's)."),
    ] = None,
    accum: Annotated[int, typer.Option("--accum", "-a", help="Accumulation steps.")] = 1,
    world_size: Annotated[int, typer.Option("--world-size", "-w", help="Workers.")] = 1,
    as_json: JsonOpt = False,
) -> None:
    """Predict each micro batch's peak GPU memory by tracing, with no GPU and no training step."""
    with _user_errors():
        sizes = cli_args.positive_ints(batch, "--batch")
        for name, value in (("--accum", accum), ("--world-size", world_size)):
            if value < 1:
                raise InputError([Issue(name, f"must be a positive integer, got {value}")], CLI)
        kind, index = cli_args.device(device)
        loaded = load_workload(workload)
        chosen = load_space(space or loaded.space or "generic_adamw")
        note = None
        explicit = None
        if memory_budget is not None:
            explicit = parse_size(memory_budget, "--memory-budget", CLI)
        try:
            budget = resolve_budget(explicit, index if kind == "cuda" else None)
            budget_bytes, budget_source = budget.bytes, budget.source
        except BudgetUnavailableError as exc:
            budget_bytes, budget_source, note = None, None, str(exc)
        report = estimate(
            loaded,
            chosen.reference_config(),
            sizes,
            budget_bytes,
            budget_source,
            cuda=kind == "cuda",
            accumulation_steps=accum,
            world_size=world_size,
        )
    if note:
        typer.echo(f"raybatch: note: {note}", err=True)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
        return
    typer.echo(
        f"{report.workload} on {device}, {report.optimizer} from space {chosen.name},"
        f" accumulation {accum}, world size {world_size}; {tables.budget_text(report)}"
    )
    tables.print_estimate(report)


@app.command("search")
def search_command(
    workload: Annotated[
        str, typer.Argument(help="The workload: path/to/file.py:NAME or package.module:NAME.")
    ],
    target: Annotated[
        str, typer.Option("--target", help="METRIC>=VALUE, METRIC<=VALUE or VALUE (>=).")
    ],
    space: SpaceOpt = None,
    trials: Annotated[int, typer.Option("--trials", help="Trials to launch.")] = 20,
    run_dir: Annotated[
        str | None, typer.Option("--run-dir", help="Run directory (default: runs/NAME-TIME).")
    ] = None,
    address: AddressOpt = None,
    memory_budget: BudgetOpt = None,
    max_time_per_trial: Annotated[
        float, typer.Option("--max-time-per-trial", help="Training-time cap per trial, seconds.")
    ] = 60.0,
    max_samples_per_trial: cli_args.MaxSamplesOpt = None,
    eval_every: Annotated[
        int | None, typer.Option("--eval-every", metavar="SAMPLES", help=cli_args.EVAL_EVERY_HELP)
    ] = None,
    gpus_per_trial: GpusOpt = None,
    cpus_per_trial: Annotated[float, typer.Option("--cpus-per-trial")] = 1.0,
    max_concurrent: Annotated[int | None, typer.Option("--max-concurrent")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    no_capping: Annotated[bool, typer.Option("--no-capping")] = False,
    confirm_top: ConfirmTopOpt = 2,
    confirm_seeds: ConfirmSeedsOpt = 1,
    no_prior: NoPriorOpt = False,
    zone: cli_args.ZoneOpt = 0.1,
    no_pause: cli_args.NoPauseOpt = False,
    hang_grace: cli_args.HangGraceOpt = 300.0,
    gpu_model: GpuModelOpt = None,
    verbose: cli_args.VerboseOpt = False,
) -> None:
    """Search the recipe that reaches the target fastest; writes a run directory."""
    with _user_errors():
        Target.parse(target, CLI)  # the syntax first, before the (slower) workload import
        try:
            options = SearchOptions(
                trials=trials,
                max_time_s=max_time_per_trial,
                max_samples=max_samples_per_trial,
                memory_budget=memory_budget,
                gpus_per_trial=None if gpus_per_trial is None else cli_args.gpus(gpus_per_trial),
                cpus_per_trial=cpus_per_trial,
                max_concurrent=max_concurrent,
                address=address,
                seed=seed,
                capping=not no_capping,
                confirm_top=confirm_top,
                confirm_seeds=confirm_seeds,
                prior=not no_prior,
                zone=zone if zone >= 0 else None,
                pause=not no_pause,
                hang_grace_s=hang_grace,
                eval_every_samples=eval_every,
                gpu_model=gpu_model,
            )
        except OptionError as exc:
            raise exc.renamed(cli_args.SEARCH_FLAGS, CLI) from None
        loaded = load_workload(workload)
        parsed_target = resolve_target(target, loaded.metrics, CLI)
        chosen = load_space(space or loaded.space or "generic_adamw")
        directory = run_dir or f"runs/{loaded.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        # The search's machinery (Ray Tune, Optuna: 1.7 s) loads once the input is known good.
        from raybatch.run.driver import search
        from raybatch.tuning.progress import printed

        with printed(True):  # raybatch's lines always; Ray's table with --verbose
            result = search(loaded, chosen, parsed_target, directory, options, workload,
                            2 if verbose else 1)  # fmt: skip
    tables.print_summary(result, parsed_target)
    _fail_without_recipe(result, parsed_target)


@app.command("init-workload")
def init_workload_command(
    file: Annotated[
        str, typer.Argument(help="The workload file to write, e.g. my_workload.py.")
    ] = "my_workload.py",
    start: Annotated[
        str,
        typer.Option(
            "--from",
            help="What to start from: workload (raybatch's own class), lightning (a"
            " LightningModule and its LightningDataModule), huggingface (model_init, datasets,"
            " collator and compute_metrics, as Trainer.hyperparameter_search takes them).",
        ),
    ] = "workload",
) -> None:
    """Write a workload file to start from (own model, own data) and its space file."""
    from raybatch.cli.template import write_template  # imports PyTorch: this command only

    with _user_errors():
        workload_path, space_path = write_template(file, start)
    metric = "val_acc" if start == "lightning" else "accuracy"
    typer.echo(f"wrote {workload_path} and {space_path}; replace the model and data, then run:")
    typer.echo(
        f'  raybatch search {workload_path}:workload --space {space_path} --target "{metric}>=0.9"'
    )


@app.command("init-space")
def init_space_command(
    workload: Annotated[
        str,
        typer.Argument(
            help="A LightningWorkload or HuggingFaceWorkload:"
            " path/to/file.py:NAME or package.module:NAME."
        ),
    ],
    out: Annotated[
        str | None,
        typer.Option(
            "--out", "-o", help="The space file (default: FILE_space.yaml beside a workload file)."
        ),
    ] = None,
) -> None:
    """Write a space file from the training code itself: the reference recipe is the one it
    trains with (a LightningModule's configure_optimizers() and its datamodule's batch size;
    TrainingArguments' defaults for a Hugging Face model), each value's source in a comment."""
    from raybatch.cli.template import write_space_for  # the workload's PyTorch: this command's

    with _user_errors():
        path, found = write_space_for(workload, out)
    for item in found.left_out:
        typer.echo(f"not used by a search: {item}")
    typer.echo(f"wrote {path}: the reference is {found.batch_size} a step at lr {found.lr:g}"
               f" ({found.optimizer.value}); check it, then run:")  # fmt: skip
    typer.echo(f'  raybatch search {workload} --space {path} --target "METRIC>=VALUE"')


@app.command("resume")
def resume_command(
    run_dir: Annotated[str, typer.Argument(help="The run directory of an interrupted search.")],
    verbose: cli_args.VerboseOpt = False,
) -> None:
    """Continue an interrupted search; completed trials are kept, never re-run. A finished
    run is left alone (its result is printed again); to search again, start a new search."""
    with _user_errors():
        target = read_run(run_dir).target
        # The search's machinery (Ray Tune, Optuna: 1.7 s) loads once the run reads well.
        from raybatch.run.driver import resume
        from raybatch.tuning.progress import printed

        with printed(True):
            result = resume(run_dir, 2 if verbose else 1)
    tables.print_summary(result, target)
    _fail_without_recipe(result, target)


def _fail_without_recipe(result: Any, target: Any) -> None:
    """A search that found no recipe fails (exit 1), saying why in one line."""
    if result.best is None:
        why = no_winner_reason(result.rows, target)
        typer.echo(f"raybatch: error: no recipe reached {target}: {why}", err=True)
        raise typer.Exit(EXIT_NO_RECIPE)


@app.command("export")
def export_command(
    run_dir: Annotated[str, typer.Argument(help="A run directory or a best_config file.")],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help=formats_help(),
        ),
    ] = "yaml",
    world_size: Annotated[
        int | None,
        typer.Option("--world-size", help="Move the recipe to this many GPUs first."),
    ] = None,
    gpus_per_node: Annotated[
        int | None,
        typer.Option(
            "--gpus-per-node",
            help="GPUs per node: below the world size, multi-node launch lines and Trainer.",
        ),
    ] = None,
    output: Annotated[str | None, typer.Option("-o", "--output", help="Write to a file.")] = None,
) -> None:
    """Print (or write) the winning recipe with its provenance, or in a trainer's format."""

    note = None
    with _user_errors():
        best = load_best(run_dir)
        if world_size is not None:
            if world_size < 1:
                message = f"must be an integer >= 1, got {world_size}"
                raise InputError([Issue("--world-size", message)], CLI)
            in_run = (Path(run_dir) / RUN_FILE).is_file()  # a run knows its space
            space = read_run(run_dir).space if in_run else None
            best = best.retarget(world_size, space)
            moved = best.provenance.retargeted
            note = moved.note if moved is not None else None
        try:
            if output:
                text = best.write(output, fmt, gpus_per_node)
            else:
                text = best.render(fmt, gpus_per_node)
        except InputError as exc:  # an option's value: the command line's, not <python>'s
            raise (exc.located(CLI) if exc.source == "<python>" else exc) from None
        written = format_named(fmt)
        if written.precision and written.origin != "comment" and not best.amp_recorded:
            note = f"{note}; {AMP_NOT_RECORDED}" if note else AMP_NOT_RECORDED  # no comments
    if note:
        typer.echo(f"raybatch: note: {note}", err=True)
    typer.echo(f"wrote {output}" if output else text, nl=bool(output))


@app.command("report")
def report_command(
    run_dir: Annotated[str, typer.Argument(help="A finished run directory.")],
) -> None:
    """Write a finished run's report again (report.html and its PNGs) and print its path."""
    # The report's machinery (matplotlib, the estimator's trace) loads only when it redraws;
    # not the search's (Ray Tune: 1.7 s of every `raybatch report`, a refusal's included).
    from raybatch.run.record import rebuild_report

    with _user_errors():
        page = rebuild_report(run_dir)
    typer.echo(str(page.resolve()))


@app.command("check")
def check_command(
    workload: Annotated[
        str | None,
        typer.Argument(help="Optional workload (path/to/file.py:NAME): per-recipe figures."),
    ] = None,
    space: SpaceOpt = None,
    address: AddressOpt = None,
    memory_budget: BudgetOpt = None,
    gpus_per_trial: GpusOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show what a search would see and do here: nodes, GPUs, budget, packing, placement."""
    import ray

    with _user_errors():
        if memory_budget is not None:
            parse_size(memory_budget, "--memory-budget", CLI)
        gpus = None if gpus_per_trial is None else cli_args.gpus(gpus_per_trial)
        loaded = load_workload(workload) if workload is not None else None
        chosen = None
        if loaded is not None:
            chosen = load_space(space or loaded.space or "generic_adamw")
        started = init_ray(address)
        try:
            report = preflight(
                read_cluster(), loaded, chosen, memory_budget, gpus, measure_context=True
            )
        finally:
            if started:
                ray.shutdown()
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
        return
    tables.print_check(report)


def main() -> None:
    """Console-script entry point (``raybatch``): the command, then an immediate exit
    (:mod:`raybatch.cli.quick_exit`: the prompt comes back seconds sooner)."""
    run_then_exit(app)


if __name__ == "__main__":
    main()
