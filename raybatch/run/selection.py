"""Choosing the winner: the candidates of the search and their confirmation runs."""

from __future__ import annotations

import math
import platform
import statistics
import time
from typing import Any

from raybatch import keys
from raybatch.export import BestConfig
from raybatch.metric import Target
from raybatch.run.options import SearchOptions
from raybatch.space.search_space import SearchSpace
from raybatch.trial.status import TrialStatus


def _knobs(row: dict[str, Any]) -> tuple[float, ...]:
    return tuple(float(row[k]) for k in keys.RAW_KNOBS)


def same_knobs(row: dict[str, Any], others: list[dict[str, Any]]) -> bool:
    return any(_knobs(row) == _knobs(o) for o in others)


def runs_point(row: dict[str, Any], point: dict[str, Any]) -> bool:
    """Whether ``row`` ran the seeded ``point`` (the max-batch baseline or the reference).

    The point fixes integer knobs; the multipliers are the rule's own (1.0). Rows read back
    from ``trials.csv`` carry floats through text, hence a relative tolerance, not ``==``.
    """
    return (
        all(int(row[k]) == int(v) for k, v in point.items())
        and math.isclose(float(row[keys.LR_MULTIPLIER]), 1.0, rel_tol=1e-9)
        and math.isclose(float(row[keys.WEIGHT_DECAY_MULTIPLIER]), 1.0, rel_tol=1e-9)
    )


def comparison_rows(
    rows: list[dict[str, Any]], *points: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The search rows of the baseline and reference points (LR and WD multipliers 1)."""
    out: list[dict[str, Any]] = []
    for point in points:
        if point is None:
            continue
        for r in rows:
            search = r[keys.PHASE] == keys.PHASE_SEARCH
            if search and runs_point(r, point) and not same_knobs(r, out):
                out.append(r)
                break
    return out


def candidates(rows: list[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    reached = [r for r in rows if r[keys.STATUS] == TrialStatus.REACHED.value]
    reached.sort(key=lambda r: r[keys.TIME_TO_TARGET_S])
    out, seen = [], set()
    for r in reached:
        knobs = _knobs(r)
        if knobs not in seen:
            seen.add(knobs)
            out.append(r)
        if len(out) == top:
            break
    return out


def _versions() -> dict[str, str]:
    import optuna
    import ray
    import torch

    import raybatch

    return {
        "raybatch": raybatch.__version__,
        "torch": str(torch.__version__),
        "ray": ray.__version__,
        "optuna": optuna.__version__,
        "python": platform.python_version(),
    }


def _device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return str(torch.cuda.get_device_name(0))
    return f"CPU ({platform.machine()})"


def choose_winner(
    space: SearchSpace,
    target: Target,
    candidates: list[dict[str, Any]],
    confirm_rows: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    options: SearchOptions,
) -> BestConfig | None:
    """Lowest median time among candidates that reached the target in every confirmation run."""
    scored = []
    for index, candidate in enumerate(candidates):
        runs = [r for r in confirm_rows if r.get(keys.CANDIDATE) == index]
        times = [r[keys.TIME_TO_TARGET_S] for r in runs if r[keys.STATUS] == "reached"]
        if not options.confirm_seeds:
            times, runs = [candidate[keys.TIME_TO_TARGET_S]], [candidate]
        if runs and len(times) == len(runs):
            scored.append((statistics.median(times), index, times, runs))
    if not scored:
        return None
    median, index, times, runs = min(scored)
    candidate = candidates[index]
    recipe = space.derive_from(candidate)
    peaks = [r[keys.PEAK_MEMORY_BYTES] for r in runs if r.get(keys.PEAK_MEMORY_BYTES)]
    provenance = {
        "median_time_to_target_s": median,
        "time_to_target_s_runs": times,
        "spread_s": max(times) - min(times),
        "samples_to_target": candidate[keys.SAMPLES_TO_TARGET],
        "peak_memory_bytes": max(peaks) if peaks else None,
        "device": _device_name(),
        "versions": _versions(),
        keys.TRIAL_ID: candidate[keys.TRIAL_ID],
        "space": space.name,
        "target": str(target),
        "search_trials": sum(1 for r in rows if r[keys.PHASE] == keys.PHASE_SEARCH),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    return BestConfig(recipe, provenance)
