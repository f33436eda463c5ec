"""Per-trial cost of raybatch's coupled space inside Ray Tune's OptunaSearch.

Users of Ray Tune + OptunaSearch report it several times slower per trial than without; the
coupled space adds a derivation and one Optuna user attribute per derived key on every
suggestion. This benchmark measures what that costs, side by side in one run, against plain
``OptunaSearch`` over the same raw knobs (independent, nothing derived), for in-memory and
SQLite storage. It drives the searcher directly (``suggest`` -> ``on_trial_complete``), as Ray
Tune's own searcher tests do, so only the searcher's work is timed.

Run: .venv/bin/python bench/space_overhead.py   (writes bench/results/space_overhead.json)
"""

from __future__ import annotations

import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from provenance import measured_at, write_result
from ray.tune.search.optuna import OptunaSearch

import raybatch
from raybatch import keys
from raybatch.space.tune_space import optuna_space

RESULTS = Path(__file__).parent / "results" / "space_overhead.json"
TRIALS = 60
REPEATS = 3


def plain_space(space: raybatch.SearchSpace) -> Callable[[optuna.Trial], None]:
    """The baseline: the same raw knobs, sampled independently, nothing derived or stored."""
    s = space.search

    def define(trial: optuna.Trial) -> None:
        trial.suggest_categorical(keys.MICRO_BATCH_SIZE, s.micro_batch_size)
        trial.suggest_categorical(keys.ACCUMULATION_STEPS, s.accumulation_steps)
        if s.lr_multiplier is not None:
            trial.suggest_float(
                keys.LR_MULTIPLIER, s.lr_multiplier.low, s.lr_multiplier.high, log=True
            )

    return define


def run(space_fn: Any, storage: str | None, trials: int) -> float:
    """Seconds per trial for ``trials`` suggest/complete rounds of one searcher."""
    searcher = OptunaSearch(
        space=space_fn,
        metric="t",
        mode="min",
        sampler=optuna.samplers.TPESampler(seed=0, multivariate=True),
        storage=optuna.storages.RDBStorage(storage) if storage else None,
    )
    start = time.perf_counter()
    for i in range(trials):
        config = searcher.suggest(f"trial_{i}")
        assert config is not None
        searcher.on_trial_complete(f"trial_{i}", {"t": float(config[keys.MICRO_BATCH_SIZE])})
    return (time.perf_counter() - start) / trials


def main(trials: int = TRIALS, repeats: int = REPEATS, out: Path = RESULTS) -> list[dict[str, Any]]:
    """Run the comparison, write ``out`` and return its rows."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = raybatch.load_space("digits_cnn_sgd")
    at = measured_at()
    rows = []
    for storage_kind in ("memory", "sqlite"):
        times: dict[str, list[float]] = {"plain_optuna": [], "raybatch_space": []}
        for _ in range(repeats):
            # Interleaved, so drift on a noisy machine hits both sides alike.
            for name, fn in (
                ("plain_optuna", plain_space(space)),
                ("raybatch_space", optuna_space(space)),
            ):
                with tempfile.TemporaryDirectory() as tmp:
                    url = f"sqlite:///{tmp}/optuna.db" if storage_kind == "sqlite" else None
                    times[name].append(run(fn, url, trials))
        plain, ours = (statistics.median(times[k]) for k in ("plain_optuna", "raybatch_space"))
        rows.append(
            {
                "storage": storage_kind,
                "trials": trials,
                "repeats": repeats,
                "plain_optuna_s_per_trial": plain,
                "raybatch_space_s_per_trial": ours,
                "ratio": ours / plain,
            }
        )
    write_result(
        out,
        {
            "benchmark": "space_overhead",
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "python": platform.python_version(),
            "optuna": optuna.__version__,
            "rows": rows,
        },
        at,
    )
    for r in rows:
        print(
            f"{r['storage']:>6}: plain {r['plain_optuna_s_per_trial'] * 1e3:7.2f} ms/trial,"
            f" raybatch {r['raybatch_space_s_per_trial'] * 1e3:7.2f} ms/trial,"
            f" ratio {r['ratio']:.2f}"
        )
    return rows


if __name__ == "__main__":
    main()
