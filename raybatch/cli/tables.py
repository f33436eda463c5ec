"""How the command line prints: tables and summaries of what the library returned."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer

from raybatch.memory.sizes import format_bytes
from raybatch.report import REPORT, verdict
from raybatch.results.rows import status_counts
from raybatch.space.config import TrialConfig

if TYPE_CHECKING:
    from raybatch.cluster.preflight import Preflight
    from raybatch.memory.estimator import MemoryReport


def budget_text(report: Any) -> str:
    if report.budget_bytes is None:
        return "no budget"
    return f"budget {format_bytes(report.budget_bytes)} ({report.budget_source})"


def print_estimate(report: MemoryReport) -> None:
    """The estimate's table, its linear model and the largest micro batch that fits."""

    rows = [
        (
            str(r.micro_batch_size),
            format_bytes(r.predicted_bytes),
            "?" if r.fits is None else ("yes" if r.fits else "NO"),
        )
        for r in report.rows
    ]
    typer.echo(table(("micro", "predicted peak", "fits"), rows))
    typer.echo(f"\nlinear model: {report.model.describe()}")
    if report.budget_bytes is not None:
        largest = report.max_micro_batch_size
        typer.echo(
            "largest micro batch that fits: "
            + ("no limit from memory" if largest is None else str(largest))
        )
    traces = 2 + (report.model.check_batch is not None)
    typer.echo(
        f"{traces} traces in {report.trace_seconds:.2f} s on the CPU (loading the workload's data"
        " included), no GPU step"
    )


def print_check(report: Preflight) -> None:
    view = report.view
    typer.echo(
        f"{len(view.nodes)} node(s), {view.cpus:g} CPUs, {view.gpus:g} GPUs on"
        f" {view.gpu_nodes} GPU node(s); trials run on {report.trial_device}"
    )
    rows = []
    for n in view.nodes:
        devices = "-" if n.gpus == 0 else "NVML did not answer"
        if n.devices is not None:
            devices = "; ".join(
                f"{d.name} {format_bytes(d.free_bytes)} free of {format_bytes(d.total_bytes)}"
                for d in n.devices
            )
        rows.append([n.address, f"{n.cpus:g}", f"{n.gpus:g}", devices])
    typer.echo(table(["node", "CPUs", "GPUs", "GPU memory (NVML)"], rows))
    if report.budget is not None:
        typer.echo(f"budget per GPU: {format_bytes(report.budget.bytes)} ({report.budget.source})")
    if report.recipes:
        recipes = [
            [
                f"{r.micro_batch_size}x{r.accumulation_steps}x{r.world_size}",
                show(None if r.predicted_bytes is None else format_bytes(r.predicted_bytes)),
                show(r.fits),
                show(r.trials_per_gpu),
                r.placement or "ok",
            ]
            for r in report.recipes
        ]
        header = ["micro x accum x world", "predicted", "fits", "trials/GPU", "placement"]
        typer.echo(table(header, recipes))
    for warning in report.warnings:
        typer.echo(f"warning: {warning}")


def print_summary(result: Any, target: Any) -> None:
    counts = status_counts(result.rows)
    typer.echo("")
    typer.echo(table(("status", "count"), [(k, str(v)) for k, v in sorted(counts.items())]))
    typer.echo("")
    typer.echo(verdict(result, target))
    for note in result.notes:
        typer.echo(f"note: {note}")
    if result.best is not None:
        typer.echo(f"best config: {result.run_dir / 'best_config.yaml'}")
    typer.echo(f"report:      {result.run_dir / REPORT}")


def recipe_table(cfg: TrialConfig) -> str:
    rows = [(k, show(v)) for k, v in cfg.to_dict().items()]
    return table(("key", "value"), rows) + "\n\n" + cfg.explain()


def show(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
