"""The ``raybatch`` command line's option types and the parsers of its option values, kept
apart from the commands (:mod:`raybatch.cli.app`) so each stays one screenful of its own."""

from __future__ import annotations

from typing import Annotated

import typer

from raybatch.errors import InputError, Issue

CLI = "command line"  # the "file" an error names when the bad input is an option

SpaceArg = Annotated[
    str, typer.Argument(help="A preset name (see `raybatch spaces`) or a path to a space YAML.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
SpaceOpt = Annotated[
    str | None, typer.Option("--space", help="Preset or YAML (default: the workload's).")
]
AddressOpt = Annotated[
    str | None, typer.Option("--address", help="Ray cluster address (default: local).")
]
BudgetOpt = Annotated[
    str | None, typer.Option("--memory-budget", help="Per-GPU budget: 8GiB, 1500MB...")
]
GpusOpt = Annotated[
    str | None, typer.Option("--gpus-per-trial", help="auto, N or a fraction (0: CPU).")
]
GpuModelOpt = Annotated[
    str | None, typer.Option("--gpu-model", help="On a cluster of mixed GPUs: this model only.")
]
VerboseOpt = Annotated[
    bool,
    typer.Option("--verbose/--quiet",
                 help="Ray Tune's live table and its lines too (default: raybatch's own lines)."),
]  # fmt: skip


EVAL_EVERY_HELP = (
    "Evaluate every SAMPLES training samples, a fixed grid (default: at training-time marks,"
    " and at least once an epoch)."
)
ConfirmTopOpt = Annotated[
    int, typer.Option("--confirm-top", help="Best recipes that may enter the race (0: none).")
]
ConfirmSeedsOpt = Annotated[
    int, typer.Option("--confirm-seeds", help="At most this many fresh seeds in the race.")
]
HangGraceOpt = Annotated[
    float,
    typer.Option(
        "--hang-grace", help="Seconds past the time cap after which a trial counts as hung."
    ),
]
MaxSamplesOpt = Annotated[
    int | None,
    typer.Option(
        "--max-samples-per-trial",
        metavar="SAMPLES",
        help="Training-sample cap per trial (a cap that does not depend on the machine's speed).",
    ),
]
NoPriorOpt = Annotated[
    bool,
    typer.Option(
        "--no-prior",
        help="Do not measure the time model (in the first trial that reaches the target):"
        " the ladder is then geometric.",
    ),
]
NoPauseOpt = Annotated[
    bool,
    typer.Option(
        "--no-pause/--pause",
        help="--no-pause: stop a trial behind at a rung for good, rather than pause it until"
        " the rung passes it (successive halving's promotion) or the search has nothing left"
        " to run (the default, --pause).",
    ),
]
ZoneOpt = Annotated[
    float,
    typer.Option(
        "--zone",
        help="Indifference zone at the rungs: a trial at most 1 + zone times slower than the"
        " best curve goes on (negative: no rungs, only the final time caps).",
    ),
]


def gpus(text: str) -> str | float:
    """A number where the text is one; anything else is left for SearchOptions to judge."""
    try:
        return float(text)
    except ValueError:
        return text


SEARCH_FLAGS = {
    "trials": "--trials",
    "max_time_s": "--max-time-per-trial",
    "max_samples": "--max-samples-per-trial",
    "memory_budget": "--memory-budget",
    "gpus_per_trial": "--gpus-per-trial",
    "gpu_model": "--gpu-model",
    "cpus_per_trial": "--cpus-per-trial",
    "max_concurrent": "--max-concurrent",
    "confirm_top": "--confirm-top",
    "confirm_seeds": "--confirm-seeds",
    "zone": "--zone",
    "hang_grace_s": "--hang-grace",
    "eval_every_samples": "--eval-every",
}
"""SearchOptions' fields as ``raybatch search`` spells them, for its error messages."""


def positive_ints(text: str, name: str) -> list[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise InputError(
            [Issue(name, f"must be positive integers separated by commas, got {text!r}")], CLI
        )
    return [int(p) for p in parts]


def device(text: str) -> tuple[str, int]:
    kind, _, index = text.partition(":")
    if kind == "cpu" and not index:
        return "cpu", 0
    if kind == "cuda" and (not index or index.isdigit()):
        return "cuda", int(index or 0)
    raise InputError([Issue("--device", f"must be cpu, cuda or cuda:N, got {text!r}")], CLI)
