"""The time model in a search's record: kept in the run directory, written into its rows.

:mod:`raybatch.timemodel.model` holds the model; :mod:`raybatch.timemodel.measure` measures it
in the trial the searcher's plan asked (:mod:`raybatch.tuning.plan`). Here the driver's two uses
once the search has ended: :func:`time_model_found` (the model, kept in the run directory,
with a note saying where it was measured and what it found) and :func:`write_predictions`
(each row's ``predicted_time_s``, and how well the model ranked the search's trials).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from raybatch import keys
from raybatch.results.rows import TrialRow
from raybatch.timemodel.model import MeasuredTimeModel, TimeModel, spearman

PRIOR_FILE = "prior.json"
"""The time model a search measured, in its run directory (the record; a resumed search reads
it from the searcher's checkpoint)."""


class TimeModelKept(Protocol):
    """What the search kept of the measurement (the searcher's plan has both)."""

    time_model: MeasuredTimeModel | None
    """The model and the trial that measured it; ``None``: none did."""
    time_model_problem: str | None
    """Why an asked trial (the last to say) could not measure it, where one said."""


def time_model_found(
    plan: TimeModelKept, run_dir: Path, asked: bool, notes: list[str]
) -> TimeModel | None:
    """The time model a trial of the search measured (``None``, and a note, if none did), kept
    in ``run_dir``'s :data:`PRIOR_FILE`."""
    if plan.time_model is None:
        if asked:
            why = f" ({plan.time_model_problem})" if plan.time_model_problem else ""
            notes.append("no time model: no trial asked to measure it reached the target before"
                         f" the ladder{why}; the ladder was a geometric one")  # fmt: skip
        return None
    model = plan.time_model.model
    (run_dir / PRIOR_FILE).write_text(json.dumps(plan.time_model.to_dict(), indent=2) + "\n")
    n = model.noise
    notes.append(
        f"time model measured in trial {plan.time_model.trial_id} once it reached the"
        f" target, in {model.cost_s:.1f} s of its device time: gradient noise scale"
        f" {n.b_simple:.0f} (80% interval {n.low:.0f}-{n.high:.0f}, batches {n.small_batch} and"
        f" {n.big_batch})"
    )
    return model


MIN_RANKED = 5
"""Fewer reached trials than this say nothing of a ranking: with 3 a rank correlation takes one of
four values, and a single swap reads as -0.5."""
MIN_SPREAD = 1.2
"""Reached times closer than this (slowest / fastest) differ by run-to-run noise: their order,
and so a rank correlation with them, is noise too."""
WEAK_RANKING = 0.5
"""Below this rank correlation the note says what it means: the model's order was little
better than chance (or, below 0, the reverse of what was measured), so the batches it put
first were no better bets than others; the winner is chosen from the measured times anyway."""


def ranking_note(rho: float | None, times: list[float]) -> str | None:
    """What the closing notes say of how the time model ranked the reached trials: the
    correlation where it means something (:data:`MIN_RANKED` trials, times :data:`MIN_SPREAD`
    apart), else why nothing is said (``None``: no time model ranked anything)."""
    if rho is None and len(times) < 2:
        return None
    if len(times) < MIN_RANKED:
        return (f"too few trials reached the target ({len(times)}) to say how well the time model"
                " ranked them")  # fmt: skip
    if max(times) < MIN_SPREAD * min(times):
        return (f"the {len(times)} trials that reached the target did so within"
                f" {max(times) / min(times) - 1:.0%} of each other: run-to-run noise, so how the"
                " time model ranked them says nothing")  # fmt: skip
    if rho is None:
        return None
    said = (f"the time model ranked the {len(times)} trials that reached the target with"
            f" Spearman {rho:.2f} against their measured times")  # fmt: skip
    if rho < 0:
        return f"{said}: the reverse of what was measured, its order no guide on this task"
    if rho < WEAK_RANKING:
        return f"{said}: weak, its order little better than chance on this task"
    return said


def write_predictions(
    rows: list[TrialRow], model: TimeModel, notes: list[str]
) -> tuple[list[TrialRow], dict[str, Any]]:
    """Each row with its predicted time (the model's relative time, scaled by the one constant
    that best matches the search's measured times), and how well the model ranked them."""
    relative = [model.predicted_time(r) for r in rows]
    pairs = [
        (p, r.time_to_target_s)
        for p, r in zip(relative, rows, strict=True)
        if r.phase == keys.PHASE_SEARCH and r.reached and r.time_to_target_s is not None
    ]
    scale = statistics.median(t / p for p, t in pairs) if pairs else None
    rows = [
        replace(r, predicted_time_s=p * scale if scale is not None and math.isfinite(p) else None)
        for p, r in zip(relative, rows, strict=True)
    ]
    rho = spearman([p for p, _ in pairs], [t for _, t in pairs])
    said = ranking_note(rho, [t for _, t in pairs])
    if said is not None:
        notes.append(said)
    grid = {r.effective_batch_size: r for r in rows}
    return rows, {
        "noise_scale": model.noise.to_dict(),
        "predicted_best_effective_batch": model.best_effective_batch(list(grid.values())),
        "spearman_predicted_vs_measured": rho,
        "cost_s": model.cost_s,
    }
