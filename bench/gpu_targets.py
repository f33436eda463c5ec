"""The targets a GPU check states, what it measured against each, and its exit status.

A check that cannot fail proves nothing. Each GPU script therefore states its targets, records
each with the measured value and whether it was met (``targets`` in its result file), prints
them, and exits 3 when one was missed, so that ``make gpu-check`` fails. A value that could not
be measured (``None``, NaN) misses its target.
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


def record(goals: Sequence[Goal]) -> dict[str, dict[str, Any]]:
    """The ``targets`` field of a result: ``{name: {"target", "measured", "met"}}``."""
    names = [g.name for g in goals]
    if len(set(names)) != len(names):
        raise ValueError(f"target names repeat: {names}")
    return {g.name: {"target": g.target, "measured": g.measured, "met": g.met} for g in goals}


def missed(goals: Sequence[Goal]) -> list[Goal]:
    return [g for g in goals if not g.met]


MISSED = 3
"""The exit status of a check that missed a target (a crash exits 1, as Python does)."""


def exit_status(goals: Sequence[Goal]) -> int:
    """0 when every target was met, :data:`MISSED` when one was missed (or none was stated: a
    check that states no target checks nothing)."""
    return 0 if goals and not missed(goals) else MISSED


def summary(check: str, goals: Sequence[Goal]) -> str:
    """One line per target, then the verdict, for the log of ``make gpu-check``."""
    lines = [
        f"{check}: {'met   ' if g.met else 'MISSED'} {g.name}: {_show(g.measured)}"
        f" (target {g.target})"
        for g in goals
    ]
    bad = missed(goals)
    verdict = f"{len(goals)} targets met" if goals and not bad else f"{len(bad)} target(s) missed"
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

    data["targets"] = record(goals)
    path = results_dir() / f"{check}.json"
    write_result(path, data, at)
    print(summary(check, goals))
    print(f"{check}: wrote {path}")
    return exit_status(goals)
