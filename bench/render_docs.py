"""Regenerate ``docs/benchmarks.md`` from the result files in ``bench/results/``.

Every number in the page comes from a results file written by a benchmark script; nothing is
typed by hand. Run: .venv/bin/python bench/render_docs.py (``make bench`` does, last).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
DOCS = Path(__file__).parent.parent / "docs" / "benchmarks.md"


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _search_efficiency(data: dict[str, Any]) -> list[str]:
    rows = data["rows"]
    out = [
        "## Search efficiency on the simulated workload family",
        "",
        "`bench/search_efficiency.py` (model: `bench/simulator.py`), median and 90th percentile"
        f" over {data['seeds']} seeds. Regret = true time to target of the config the strategy"
        " would pick / the true optimum. GPU seconds: simulated compute spent, finder steps and"
        " OOMs included. Pre-screened configs cost no GPU time and no trial.",
        "",
    ]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == workload]
        opt = mine[0]
        m, a, mult = opt["optimum_at"]
        out += [
            f"### {workload}",
            "",
            f"True optimum: {opt['optimum_s']:.1f} s at micro {m} x accumulation {a}, LR"
            f" multiplier {mult:.2f}.",
            "",
            "| strategy | trials | median regret | p90 regret | GPU s (median) | OOM crashes |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in mine:
            if r["strategy"] == "max_batch" and r["budget"] != min(x["budget"] for x in mine):
                continue
            out.append(
                f"| {r['strategy']} | {r['trials']} | {r['median_regret']:.3f} |"
                f" {r['p90_regret']:.3f} | {r['gpu_seconds']:.0f} | {r['oom_crashes']} |"
            )
        out.append("")
    out += _targets(rows)
    return out


def _targets(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 6's targets for raybatch, each stated as met or not with its figures."""

    def cell(workload: str, strategy: str, budget: int) -> dict[str, Any]:
        return next(
            r for r in rows
            if (r["workload"], r["strategy"], r["budget"]) == (workload, strategy, budget)
        )  # fmt: skip

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    budgets = sorted({r["budget"] for r in rows})
    lines = ["### Targets", ""]
    for budget, bound in ((20, 1.10), (40, 1.05)):
        if budget not in budgets:
            continue
        figures = {w: cell(w, "raybatch", budget)["median_regret"] for w in workloads}
        met = [w for w, v in figures.items() if v <= bound]
        detail = ", ".join(f"{w} {v:.3f}" for w, v in figures.items())
        lines.append(
            f"- median regret <= {bound:.2f} within {budget} trials: met on {len(met)} of"
            f" {len(workloads)} workloads ({detail})."
        )
    ratios = []
    for w in workloads:
        for b in budgets:
            ratios.append(
                cell(w, "raybatch", b)["gpu_seconds"] / cell(w, "random", b)["gpu_seconds"]
            )
    lines.append(
        f"- compute vs random search at equal trials: raybatch spends {min(ratios):.2f}x to"
        f" {max(ratios):.2f}x of random search's GPU seconds (target: at most 0.5x)."
    )
    crashes = sum(r["oom_crashes"] for r in rows if r["strategy"] == "raybatch")
    lines += [f"- OOM crashes suffered by raybatch: {crashes} (target: 0).", ""]
    return lines


def _trace_cost(data: dict[str, Any]) -> list[str]:
    out = [
        "## Cost of the zero-GPU pre-screen",
        "",
        f"`bench/trace_cost.py` on {data['machine']}, torch {data['torch']}.",
        "",
        "| workload | median s per traced config | max | configs in space |"
        " whole space screened (s) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, r in data["workloads"].items():
        out.append(
            f"| {name} | {r['median_s_per_trace']:.3f} | {r['max_s_per_trace']:.3f} |"
            f" {r['configs_in_space']} | {r['screen_whole_space_s']:.2f} |"
        )
    return [*out, ""]


def _space_overhead(data: dict[str, Any]) -> list[str]:
    out = [
        "## Searcher overhead of the coupled space",
        "",
        "`bench/space_overhead.py`: seconds per suggest/complete round of Ray Tune's"
        " `OptunaSearch`, plain knobs vs raybatch's define-by-run (which records the derived"
        " recipe in the study).",
        "",
        "| storage | plain (ms/trial) | raybatch (ms/trial) | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in data["rows"]:
        out.append(
            f"| {r['storage']} | {r['plain_optuna_s_per_trial'] * 1e3:.2f} |"
            f" {r['raybatch_space_s_per_trial'] * 1e3:.2f} | {r['ratio']:.2f} |"
        )
    return [*out, ""]


def _plugin_overhead(data: dict[str, Any]) -> list[str]:
    verdict = "met" if data["ratio"] <= 1.2 else "not met"
    return [
        "## Overhead of the plugin in Ray Tune",
        "",
        f"`bench/plugin_overhead.py`: {data['trials']} trivial trials, plain `tune.Tuner` (random"
        " search, FIFO) vs raybatch's searcher (TPE in SQLite, pre-screen) and capping scheduler,"
        f" alternating, {data['repeats']} runs each.",
        "",
        f"Median wall-clock: plain {data['plain_median_s']:.1f} s, raybatch"
        f" {data['raybatch_median_s']:.1f} s, ratio {data['ratio']:.2f}"
        f" (target <= 1.2: {verdict}).",
        "",
    ]


def _digits_sweep(data: dict[str, Any]) -> list[str]:
    out = [
        "## Real training: digits, time to target across batch recipes",
        "",
        f"`bench/digits_batch_sweep.py`: raybatch's trial loop on {data['machine']}, target"
        f" accuracy {data['target']}, cap {data['max_time_s']:g} s, median over seeds.",
        "",
        "| micro | accumulation | effective | lr | reached | median time to target (s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in data["rows"]:
        t = r["median_time_to_target_s"]
        out.append(
            f"| {r['micro_batch_size']} | {r['accumulation_steps']} |"
            f" {r['effective_batch_size']} | {r['lr']:.4g} | {r['reached']} |"
            f" {'-' if t is None else f'{t:.3f}'} |"
        )
    return [*out, ""]


def render() -> str:
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`bench/render_docs.py`) from `bench/results/*.json`.",
        "",
    ]
    for name, section in (
        ("search_efficiency", _search_efficiency),
        ("digits_batch_sweep", _digits_sweep),
        ("trace_cost", _trace_cost),
        ("space_overhead", _space_overhead),
        ("plugin_overhead", _plugin_overhead),
    ):
        data = _load(name)
        if data is not None:
            lines += section(data)
    missing = [n for n in ("gpu_memory_accuracy", "gpu_trial_timing") if _load(n) is None]
    if missing:
        lines += [
            "## GPU verification",
            "",
            f"Not run yet: {', '.join(f'`bench/{n}.py`' for n in missing)} need an NVIDIA GPU.",
            "",
        ]
    return "\n".join(lines)


def main(out: Path = DOCS) -> str:
    text = render()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


if __name__ == "__main__":
    main()
