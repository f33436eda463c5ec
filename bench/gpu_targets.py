"""The targets a GPU check states, what it measured against each, and its exit status.

A check that cannot fail proves nothing. Each GPU script therefore states its targets, records
each with the measured value and whether it was met (``targets`` in its result file), prints
them, and exits 3 when one was missed, so that ``make gpu-check`` fails. A value that could not
be measured (``None``, NaN) misses its target. A miss already known (:data:`KNOWN_MISSES`: the
figure, and the issue whose work it waits on) is printed and recorded as such and does not turn
the check red, so that red means a regression; a known miss met again says so, to be dropped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Goal:
    """One target: its name, what it asks, the measured value and whether it was met."""

    name: str
    target: str
    measured: Any
    met: bool


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def at_most(name: str, measured: Any, limit: float) -> Goal:
    return Goal(name, f"<= {limit:g}", measured, _number(measured) and measured <= limit)


def at_least(name: str, measured: Any, limit: float) -> Goal:
    return Goal(name, f">= {limit:g}", measured, _number(measured) and measured >= limit)


def within(name: str, measured: Any, low: float, high: float) -> Goal:
    met = _number(measured) and low <= measured <= high
    return Goal(name, f"in [{low:g}, {high:g}]", measured, met)


def holds(name: str, measured: Any, what: str = "true") -> Goal:
    """A yes/no target (``what`` says what must hold): met only by ``True`` itself."""
    return Goal(name, what, measured, measured is True)


def record(goals: Sequence[Goal], check: str | None = None) -> dict[str, dict[str, Any]]:
    """The ``targets`` field of a result: ``{name: {"target", "measured", "met"}}``, with
    ``known_miss`` (why) on a known miss of ``check``."""
    names = [g.name for g in goals]
    if len(set(names)) != len(names):
        raise ValueError(f"target names repeat: {names}")
    out: dict[str, dict[str, Any]] = {}
    for g in goals:
        out[g.name] = {"target": g.target, "measured": g.measured, "met": g.met}
        why = known(check, g)
        if why is not None and not g.met:
            out[g.name]["known_miss"] = why
    return out


KNOWN_MISSES: dict[tuple[str, str], str] = {
    ("gpu_memory_accuracy", "min_predicted_over_allocated"): (
        "issue 49, item 2: the MLP at micro batch 4096 is under-predicted (0.74 on the H100 at"
        " c21938b, 0.79 by the trace since it counts a cuBLAS workspace per thread): 129 MiB the"
        " trace does not see, alike in fp32 and bf16, to be found with the allocator's history"
    ),
}
"""(check, target) -> why it misses, and what it waits on: misses measured on a GPU and owned by
an open issue. Not a waiver: the target and the figure are printed and recorded each run."""


def known(check: str | None, goal: Goal) -> str | None:
    """Why ``goal`` of ``check`` is a known miss (``None``: it is not one)."""
    return KNOWN_MISSES.get((check, goal.name)) if check is not None else None


def missed(goals: Sequence[Goal], check: str | None = None) -> list[Goal]:
    """The targets missed, known misses of ``check`` left out."""
    return [g for g in goals if not g.met and known(check, g) is None]


MISSED = 3
"""The exit status of a check that missed a target (a crash exits 1, as Python does)."""


def exit_status(goals: Sequence[Goal], check: str | None = None) -> int:
    """0 when every target was met or missed as known (:data:`KNOWN_MISSES` of ``check``),
    :data:`MISSED` when another was missed (or none was stated: a check that states no target
    checks nothing)."""
    return 0 if goals and not missed(goals, check) else MISSED


def summary(check: str, goals: Sequence[Goal]) -> str:
    """One line per target, then the verdict, for the log of ``make gpu-check``."""
    lines = []
    for g in goals:
        why = known(check, g)
        word = "met   " if g.met else "MISSED" if why is None else "KNOWN "
        line = f"{check}: {word} {g.name}: {_show(g.measured)} (target {g.target})"
        if why is not None:
            line += f" -- known miss, {why}" if not g.met else " -- a known miss met: drop it"
        lines.append(line)
    bad = missed(goals, check)
    quiet = sum(1 for g in goals if not g.met) - len(bad)
    verdict = (f"{len(bad)} target(s) missed" if bad or not goals
               else f"{len(goals) - quiet} targets met, {quiet} known miss(es)" if quiet
               else f"{len(goals)} targets met")  # fmt: skip
    return "\n".join([*lines, f"{check}: {verdict}" if goals else f"{check}: no targets"])


def _show(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else repr(value)


def begin(check: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The start of a GPU check: ``None``, having said so, where there is no CUDA device; else
    the first fields of its result (the check, the device, torch's version, the date) and the
    tree it measures (:func:`provenance.measured_tree`), which :func:`finish` takes."""
    import torch  # deferred, as in finish: the targets alone load neither torch nor provenance
    from provenance import measured_tree

    if not torch.cuda.is_available():
        print(f"{check}: no CUDA device here; run this on a GPU machine.")
        return None
    at = measured_tree()
    data = {
        "benchmark": check,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    return data, at


def finish(check: str, data: dict[str, Any], goals: Sequence[Goal], at: dict[str, Any]) -> int:
    """Record the targets in ``data``, write it as ``<results dir>/<check>.json`` with the
    tree it measured (``at``, from :func:`provenance.measured_tree` at the start), print the
    targets, and return the exit status (:func:`exit_status`)."""
    from provenance import results_dir, write_result

    data["targets"] = record(goals, check)
    path = results_dir() / f"{check}.json"
    write_result(path, data, at)
    print(summary(check, goals))
    print(f"{check}: wrote {path}")
    return exit_status(goals, check)
