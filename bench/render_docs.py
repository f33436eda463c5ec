"""Regenerate ``docs/benchmarks.md`` from the result files in ``bench/results/``.

Every number in the page comes from a results file written by a benchmark script; nothing is
typed by hand. Run: .venv/bin/python bench/render_docs.py (``make bench`` does, last).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
DOCS = Path(__file__).parent.parent / "docs" / "benchmarks.md"
README = Path(__file__).parent.parent / "README.md"
START, END = "<!-- benchmarks:start -->", "<!-- benchmarks:end -->"
DEMO_START, DEMO_END = "<!-- demo:start -->", "<!-- demo:end -->"
TRACE_START, TRACE_END = "<!-- trace:start -->", "<!-- trace:end -->"


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def measured(data: dict[str, Any]) -> str:
    """What code a result describes: its commit and whether the tree was clean, or that the
    file predates that record."""
    at = data.get("measured_at")
    if not at or not at.get("commit"):
        return "Code measured: not recorded (the result predates the commit record)."
    tree = {True: "clean tree", False: "uncommitted changes in the tree", None: "tree unknown"}
    return f"Code measured: commit `{at['commit'][:10]}` ({tree[at.get('clean')]}), {at['date']}."


def _short(data: dict[str, Any] | None) -> str:
    """A README bullet's tag: the commit its figures were measured at."""
    at = (data or {}).get("measured_at") or {}
    if not at.get("commit"):
        return " [commit not recorded]"
    return f" [`{at['commit'][:7]}`{'' if at.get('clean') else ', dirty tree'}]"


def _search_efficiency(data: dict[str, Any]) -> list[str]:
    rows = data["rows"]
    out = [
        "## Search efficiency on the simulated workload family",
        "",
        "`bench/search_efficiency.py` (model: `bench/simulator.py`), median and 90th percentile"
        f" over {data['seeds']} seeds. Regret = true time to target of the config the strategy"
        " exports / the true optimum. Compute in *trainings*: simulated GPU seconds spent /"
        " the optimum's time to target -- finder steps, OOMs, raybatch's prior measurement and"
        f" every strategy's confirmation ({data['confirmation']}) included. Pre-screened configs"
        " cost no GPU time and no trial. `to 1.05`: the median compute of the shortest prefix"
        " of a run whose confirmed pick has regret <= 1.05 (- where fewer than half the seeds"
        " get there). The pre-screen sees a memory estimate off by each member's error and the"
        " prior a noise scale off by the member's factor; two members do not follow the"
        " model the prior assumes.",
        "",
        "![regret against compute](search_efficiency.png)",
        "",
        "| member | estimate error | noise scale measured x | best LR multiplier (rule = 1)"
        " | follows the model |",
        "| --- | ---: | ---: | ---: | --- |",
        *(
            f"| {name} | {m['estimator_error']:+.0%} | {m['noise_scale_error']:g} |"
            f" {m['best_lr_multiplier']:g} | {'yes' if m['follows_model'] else 'no'} |"
            for name, m in data["members"].items()
        ),
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
            "| slots | strategy | trials | median regret | p90 regret | trainings (median) |"
            " to 1.05 | OOM crashes (median / p90) |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in mine:
            first = min(x["budget"] for x in mine)
            if r["strategy"].startswith("max_batch") and r["budget"] != first:
                continue
            to = r["compute_to_regret_105"]
            out.append(
                f"| {r.get('slots', 2)} | {r['strategy']} | {r['trials']} |"
                f" {r['median_regret']:.3f} |"
                f" {r['p90_regret']:.3f} | {r['compute_trainings']:.1f} |"
                f" {'-' if to is None else format(to, '.1f')} | {r['oom_median']:g} /"
                f" {r['oom_p90']:g} |"
            )
        out.append("")
    for slots in sorted({r.get("slots", 2) for r in rows}):
        out += _targets([r for r in rows if r.get("slots", 2) == slots], slots)
    return out


def _cell(rows: list[dict[str, Any]], workload: str, strategy: str, budget: int
          ) -> dict[str, Any]:  # fmt: skip
    return next(
        r
        for r in rows
        if (r["workload"], r["strategy"], r["budget"]) == (workload, strategy, budget)
    )


COMPUTE_MEDIAN_TARGET, COMPUTE_WORST_TARGET = 4, 8
"""Trainings of the optimum to reach regret <= 1.05: the median member's and the worst's."""


def _targets(rows: list[dict[str, Any]], slots: int = 2) -> list[str]:
    """The search's targets for raybatch at ``slots`` trials at once, each stated as met or
    not with its figures."""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    budgets = sorted({r["budget"] for r in rows})
    lines = [f"### Targets, {slots} slot(s)", ""]
    for budget, bound in ((12, 1.05), (20, 1.05), (40, 1.02)):
        if budget not in budgets:
            continue
        figures = {w: _cell(rows, w, "raybatch", budget)["median_regret"] for w in workloads}
        worst = max(figures.items(), key=lambda kv: kv[1])
        verdict = "met" if worst[1] <= bound else "NOT met"
        detail = ", ".join(f"{w} {v:.3f}" for w, v in figures.items())
        lines.append(
            f"- worst member's median regret <= {bound:.2f} within {budget} trials: {verdict}"
            f" (worst {worst[0]} {worst[1]:.3f}; {detail})."
        )
    to = {w: _cell(rows, w, "raybatch", budgets[0])["compute_to_regret_105"] for w in workloads}
    values = [math.inf if v is None else v for v in to.values()]
    median, worst_to = statistics.median(values), max(values)
    detail = ", ".join(f"{w} {'never' if v is None else format(v, '.1f')}" for w, v in to.items())
    lines.append(
        f"- compute to regret <= 1.05 (every device second, confirmation included, in trainings"
        f" of the grid's optimum): median over members at most {COMPUTE_MEDIAN_TARGET}:"
        f" {'met' if median <= COMPUTE_MEDIAN_TARGET else 'NOT met'} ({median:.1f}); worst"
        f" member at most {COMPUTE_WORST_TARGET}:"
        f" {'met' if worst_to <= COMPUTE_WORST_TARGET else 'NOT met'} ({worst_to:.1f});"
        f" {detail}."
    )
    worse = _worse_at_equal_compute(rows)
    lines.append(
        "- no worse than any peer at equal compute (raybatch's best regret over its budgets that"
        " cost no more than the peer's, against the peer's; within 0.01):"
        + (" met on every member." if not worse else " NOT met: " + "; ".join(worse) + ".")
    )
    ours = [r for r in rows if r["strategy"] == "raybatch"]
    worst_oom = max(ours, key=lambda r: r["oom_p90"])
    lines += [
        f"- OOM crashes per raybatch search: median at most {max(r['oom_median'] for r in ours):g},"
        f" 90th percentile at most {worst_oom['oom_p90']:g} ({worst_oom['workload']}, estimate"
        f" error {worst_oom['estimator_error']:+.0%}): an estimate that under-predicts admits"
        " configs that run out of memory, and each one teaches the searcher to avoid as large"
        " a config.",
        "",
    ]
    return lines


def _worse_at_equal_compute(rows: list[dict[str, Any]]) -> list[str]:
    """Cells where a peer's regret beats raybatch's at no more compute than the peer spent.

    A peer budget that cost less than raybatch's smallest budget has no raybatch point to
    compare at that compute; it is listed when its regret is better than raybatch's smallest
    budget's (the honest reading: that peer got there cheaper).
    """
    out = []
    peers = [s for s in dict.fromkeys(r["strategy"] for r in rows) if not s.startswith("raybatch")]
    for w in dict.fromkeys(r["workload"] for r in rows):
        ours = sorted((r for r in rows if (r["workload"], r["strategy"]) == (w, "raybatch")),
                      key=lambda r: r["compute_trainings"])  # fmt: skip
        for peer in peers:
            for p in (r for r in rows if (r["workload"], r["strategy"]) == (w, peer)):
                affordable = [r for r in ours if r["compute_trainings"] <= p["compute_trainings"]]
                mine = min(affordable or ours[:1], key=lambda r: r["median_regret"])
                if mine["median_regret"] > p["median_regret"] + 0.01:
                    out.append(
                        f"{w}: {peer} at {p['budget']} trials ({p['compute_trainings']:.1f}"
                        f" trainings) {p['median_regret']:.3f} vs raybatch"
                        f" {mine['median_regret']:.3f} ({mine['compute_trainings']:.1f})"
                    )
                    break
    return out


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
    verdict = "met" if data["target_met"] else "not met"
    low, high = data["ratio_ci95"]
    return [
        "## Overhead of the plugin in Ray Tune",
        "",
        f"`bench/plugin_overhead.py`: {data['trials']} trivial trials, plain `tune.Tuner` (random"
        " search, FIFO) vs raybatch's searcher (TPE in SQLite, pre-screen) and capping scheduler,"
        f" alternating, {data['repeats']} runs each.",
        "",
        f"Median wall-clock: plain {data['plain_median_s']:.1f} s, raybatch"
        f" {data['raybatch_median_s']:.1f} s; ratio {data['ratio']:.2f}, the median over the"
        f" {data['repeats']} alternating pairs of raybatch / plain (95% interval over pairs"
        f" {low:.2f}-{high:.2f}; target <= {data['target_ratio']:.2f}: {verdict}).",
        "",
    ]


def _loop_overhead(data: dict[str, Any]) -> list[str]:
    out = [
        "## Overhead of raybatch's training loop",
        "",
        "`bench/loop_overhead.py`: the same recipes run by raybatch's trial loop and by a plain"
        " hand-written PyTorch loop (shuffled index into the tensors, whole validation set in one"
        " batch at the same sample marks), from the same initial weights and data order,"
        f" interleaved, {data['seeds']} seeds per recipe, {data['threads']} torch thread, torch"
        f" {data['torch']}. Training time to target, evaluation excluded (the search's objective)."
        " A pair is one recipe on one seed run both ways; the ratio is the median over pairs of"
        " ours / plain, with a 95% bootstrap interval over pairs.",
        "",
        "| workload | recipe (micro x accumulation @ LR x) | same samples to target | pairs"
        " | ratio | 95% interval | <= " + f"{data['target_ratio']:.2f}" + " |",
        "| --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for name, w in data["workloads"].items():
        same = f"{w['same_samples_to_target']} of {len(w['runs'])}"
        per = w.get("recipes", {})
        for recipe, r in [*per.items(), ("all", w)]:
            low, high = r["ratio_ci95"]
            pairs = r.get("pairs", w["reached_by_both"])
            out.append(
                f"| {name} | {recipe} | {same if recipe == 'all' else ''} | {pairs}"
                f" | {r['ratio']:.3f} | {low:.3f}-{high:.3f} |"
                f" {'met' if r['ratio'] <= data['target_ratio'] else 'not met'} |"
            )
    if "overall" in data:
        o = data["overall"]
        out.append(
            f"| every workload | all | | {o['pairs']} | {o['ratio']:.3f} |"
            f" {o['ratio_ci95'][0]:.3f}-{o['ratio_ci95'][1]:.3f} |"
            f" {'met' if o['ratio'] <= data['target_ratio'] else 'not met'} |"
        )
    return [*out, ""]


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


def _real_training(data: dict[str, Any]) -> list[str]:
    out = [
        "## Real training: the confirmed winners vs the max-batch heuristic vs the reference",
        "",
        f"`bench/real_training.py`: {data['searches']} independent raybatch searches per"
        " workload; the max batch at the rule's LR and at its best LR from a sweep (0.5, 1, 2,"
        f" 4x); every recipe re-run {data['reruns']} times, interleaved, fresh seeds,"
        f" {data['machine']}, cap {data['max_time_s']:g} s of training. Ratio = the recipe's"
        " median training time to target / the winners' (> 1: the winners are faster), with a"
        " bootstrap 95% interval; a missed target counts as 10x the cap.",
        "",
        "| workload | recipe | micro x accum | LR x rule | reached | median (s) | runs (min-max)"
        " | ratio to winners | 95% interval |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, w in data["workloads"].items():
        for recipe, r in w["recipes"].items():
            t = r["median_time_to_target_s"]
            times = [x["time_to_target_s"] for x in r["runs"] if x["time_to_target_s"] is not None]
            spread = f"{min(times):.3f}-{max(times):.3f}" if times else "-"
            c = w["compared"].get(recipe)
            ratio = "-" if c is None else f"{c['ratio']:.2f}"
            interval = "-" if c is None else (
                f"{c['ratio_ci95'][0]:.2f}-{c['ratio_ci95'][1]:.2f}"
                + (" (noise)" if c["within_noise"] else "")
            )  # fmt: skip
            out.append(
                f"| {name} | {recipe} | {r['micro_batch_size']} x {r['accumulation_steps']} |"
                f" {r['lr_multiplier']:.2f} | {r['reached']}/{len(r['runs'])} |"
                f" {'-' if t is None else f'{t:.3f}'} | {spread} | {ratio} | {interval} |"
            )
    out.append("")
    for name, w in data["workloads"].items():
        walls = [s["search_wall_s"] for s in w["searches"]]
        device = [s.get("cost_trainings_device") for s in w["searches"]]
        train = [s.get("cost_trainings_train") for s in w["searches"]]
        cost = (f"; cost {min(device):.0f}-{max(device):.0f} trainings of {_unit(w)},"
                f" every device second ({min(train):.0f}-{max(train):.0f} in training seconds"
                " alone)" if None not in device + train else "")  # fmt: skip
        old = [s.get("compute_trainings") for s in w["searches"]]
        if None in device and None not in old:  # a record from before device seconds counted
            cost = (
                f"; compute {min(old):.0f}-{max(old):.0f} trainings of the winner"
                " (training seconds only: measured before every device second counted)"
            )
        spread = w.get("rerun_spread")
        if spread is not None:
            cost += f"; the grid best's run-to-run spread {spread:.0%}"
        out.append(
            f"- {name} (space `{w['space']}`, target {w['target']}): searches took"
            f" {min(walls):.0f}-{max(walls):.0f} s each, confirmation included{cost}; the max"
            f" batch's best LR multiplier in the sweep was"
            f" {_multiplier(w['max_batch_lr_sweep']['best_multiplier'])}. {verdicts(name, w)}"
        )
    return [*out, "", *_real_targets(data), ""]


def _multiplier(best: float | None) -> str:
    return "none (no LR of the sweep reached the target)" if best is None else f"{best:g}"


def _said(c: dict[str, Any] | None, what: str) -> str:
    if c is None:
        return f"{what}: not measured"
    low, high = c["ratio_ci95"]
    figure = f"{c['ratio']:.2f}x ({low:.2f}-{high:.2f})"
    if c["within_noise"]:
        return f"within noise of {what}, {figure}"
    return f"{'beat' if c['ratio'] > 1 else 'LOST to'} {what}, {figure}"


def verdicts(name: str, w: dict[str, Any]) -> str:
    """What the result file says for one case, in one sentence: whether the winners beat the
    largest batch at the rule's LR and at its best swept LR, lost, or are within noise."""
    c = w["compared"]
    return (
        f"The winners {_said(c.get('max_batch'), 'the largest batch at the rule LR')};"
        f" {_said(c.get('max_batch_tuned'), 'the largest batch at its best swept LR')}."
    )


GRID_BEST_WITHIN = 1.10
"""The winners' median time to target within this factor of the grid's best recipe's."""
COST_TARGET, COST_WORST = 5, 8
"""What a search costs the user (slots x wall clock, less one process start per slot), in
trainings of the fastest recipe measured: the median search's at most, and the worst's."""


def _unit(w: dict[str, Any]) -> str:
    """The case's unit of cost as the page says it: the fastest recipe its reruns measured
    (a record from before it was chosen so: the grid's best)."""
    recipe = w.get("cost_unit_recipe")
    if recipe is None:
        return "the grid's best"
    return f"the fastest recipe measured ({recipe}, {w['cost_unit_s']:.2f} s)"


def _units(real: dict[str, Any]) -> str:
    """The real cases' unit of cost, as the pages say it: the fastest recipe measured where every
    case recorded which it was, else (an older record) the grid's best."""
    cases = real["workloads"].values()
    named = all(w.get("cost_unit_recipe") for w in cases)
    return "the fastest recipe measured" if named else "the grid's best"


def _within(grid: dict[str, Any]) -> str:
    """The winners against the grid's best, judged on the interval: the winners' time over
    the grid best's is 1 / the recorded ratio, its interval's upper end 1 / the ratio's low."""
    point, upper = 1 / grid["ratio"], 1 / grid["ratio_ci95"][0]
    verdict = (
        "met"
        if upper <= GRID_BEST_WITHIN
        else "NOT met"
        if point > GRID_BEST_WITHIN
        else "not shown (the interval is wider)"
    )
    return (f"winners vs the grid's best {point:.2f}x, 95% interval up to {upper:.2f}x (target:"
            f" within {GRID_BEST_WITHIN:.2f}x): {verdict}")  # fmt: skip


def _paid(w: dict[str, Any]) -> list[float] | None:
    """Each search's slots x wall clock less one process start per slot, in trainings of the
    grid's best (``None`` for a record made before it was measured)."""
    paid = [s.get("cost_trainings_wall_warm") for s in w["searches"]]
    return None if None in paid or not paid else [float(p) for p in paid]


def _real_targets(data: dict[str, Any]) -> list[str]:
    """The real-training targets, met or not, with the figures, verdicts from intervals: the
    winners within 1.10x of the grid's best, never slower than the largest batch at its best
    swept LR, and a search costing the user (slots x wall clock, less one process start per
    slot) at most 5 trainings of the fastest recipe measured (median search), 8 the worst."""
    lines = ["### Targets", ""]
    for name, w in data["workloads"].items():
        c = w["compared"]
        grid, tuned = c.get("grid_best"), c.get("max_batch_tuned")
        parts = []
        if grid is not None:
            parts.append(_within(grid))
        if tuned is not None:
            low, high = tuned["ratio_ci95"]
            ok = high >= 1.0
            parts.append(f"vs the largest batch at its best swept LR {tuned['ratio']:.2f}x"
                         f" ({low:.2f}-{high:.2f}; target: never slower):"
                         f" {'met' if ok else 'NOT met'}")  # fmt: skip
        elif "max_batch_tuned" not in w["recipes"]:
            parts.append("the largest batch reached the target at no LR of its sweep: no tuned"
                         " baseline to compare with")  # fmt: skip
        paid = _paid(w)
        if paid is not None:
            median, worst = statistics.median(paid), max(paid)
            ok = median <= COST_TARGET and worst <= COST_WORST
            startup = [s.get("startup_s") or 0.0 for s in w["searches"]]
            parts.append(f"what a search cost the user, slots x wall clock less one process start"
                         f" per slot, {min(paid):.1f}-{max(paid):.1f} trainings of {_unit(w)}"
                         f" (median {median:.1f}; target median <= {COST_TARGET}, worst <="
                         f" {COST_WORST}): {'met' if ok else 'NOT met'}; the start-ups left out"
                         f" {min(startup):.1f}-{max(startup):.1f} s")  # fmt: skip
        agreement = w.get("grid_rung_rank_agreement")
        if agreement:
            said = ", ".join(f"{k} {'-' if v is None else format(v, '.2f')}"
                             for k, v in agreement.items())  # fmt: skip
            parts.append(f"the grid's rank at each rung against its final rank (Spearman):"
                         f" {said}")  # fmt: skip
        if w.get("can_tell_10_percent") is False:
            parts.append("this case cannot tell 10 % (its best trains under 3 s or varies more"
                         " than 10 % run to run)")  # fmt: skip
        if parts:
            lines.append(f"- {name}: " + "; ".join(parts) + ".")
    return lines


def _noise_scale(data: dict[str, Any]) -> list[str]:
    out = [
        "## The time model against a grid",
        "",
        "`bench/real_training.py` also writes `bench/results/noise_scale.json`: each search's"
        " measured gradient noise scale (McCandlish et al. 2018, B_simple, with its bootstrap"
        " 80% interval), the effective batch the time model predicted fastest, the best of a"
        f" grid (every micro batch at LR x {', '.join(f'{x:g}' for x in data['grid_lrs'])},"
        f" {data['grid_runs']} runs each), and the Spearman correlation between predicted and"
        " measured time to target over each search's trials that reached the target.",
        "",
        "| workload | noise scale (80% interval) | predicted best | grid's best | within 2x |"
        " Spearman |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, w in data["workloads"].items():
        scales = ", ".join(
            "-" if n is None else f"{n['b_simple']:.0f} ({n['low']:.0f}-{n['high']:.0f})"
            for n in w["noise_scale"]
        )
        rho = ", ".join("-" if r is None else f"{r:.2f}" for r in w["spearman"])
        within = sum(bool(x) for x in w["predicted_within_2x"])
        predicted = ", ".join(str(p) for p in w["predicted_best_effective_batch"])
        out.append(
            f"| {name} | {scales} | {predicted}"
            f" | {w['measured_best_effective_batch']} ({w['measured_best']}) |"
            f" {within} of {len(w['predicted_within_2x'])} | {rho} |"
        )
    return [*out, ""]


def _rule_text(name: str, rule: dict[str, Any]) -> str:
    return f"`{name}` zone {rule['zone']}, hedge {rule['hedge']}, eta {rule.get('eta', 3.0):g}"


def _rung_replay(data: dict[str, Any]) -> list[str]:
    rules = data["settings"]["rules"]
    out = [
        "## The rung rule on real curves",
        "",
        "`bench/rung_replay.py` replays the real benchmark's grid (every micro batch at each LR,"
        " one run each, its measured curve) through the shipped capping scheduler on the"
        f" simulated clock, {data['settings']['slots']} slots: {data['settings']['draws']} draws"
        f" of {data['settings']['trials']} recipes, the plan's opening then recipes drawn from"
        " the rest of the grid; only the rule's settings vary. Cost: the training seconds the"
        " trials held, in trainings of the grid's best (no start-up nor evaluation), and in"
        " brackets the part of it before the search's first reach, while `B` is a guess. Regret:"
        " the fastest recipe that reached against the fastest drawn, each by its one grid run"
        ' (median, 90th percentile); "stopped": the draws where the fastest drawn did not'
        " reach. Rules: " + "; ".join(_rule_text(n, r) for n, r in rules.items()) + ".",
        "",
        "| workload | " + " | ".join(f"`{n}`: cost, regret (p90), stopped" for n in rules) + " |",
        "| --- |" + " --- |" * len(rules),
    ]
    for name, by_rule in data["cases"].items():
        cells = [
            f"{c['median_cost_trainings']:.1f}"
            + (
                f" [{c['median_before_reach_trainings']:.1f}]"
                if "median_before_reach_trainings" in c
                else ""
            )
            + f", {c['median_regret']:.2f}"
            f" ({c['p90_regret']:.2f}), {c['fastest_drawn_stopped']:.0%}"
            for c in by_rule.values()
        ]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*out, ""]


def _near_ties(data: dict[str, Any]) -> list[str]:
    named = all(c.get("unit_recipe") for c in data["cases"].values())
    unit = "the fastest recipe measured" if named else "the grid's best"
    out = [
        "## Where a real search's training goes",
        "",
        "`bench/near_ties.py`, from the real benchmark's committed searches (no run of its own):"
        " each search's training split by how far each of its trials trained against B, the"
        " search's own fastest time to target (up to each trial's last evaluation). Past B/3:"
        " trials the rungs could not tell from the best by the last rung below B, or that"
        " reached. Floors: the training if every trial but the fastest had stopped at B/3 (or"
        " B/9) at the latest, whatever its curve, which no rung rule goes under. Confirmation:"
        " the training the rows hold beyond the trials' curves (the race's runs, and training"
        " past a trial's last evaluation); other: what the slots held beyond training"
        " (evaluation, start-up beyond one process per slot, gaps). Medians of the searches, in"
        f" trainings of {unit}; paid: slots x wall clock less one process start per slot.",
        "",
        "| workload | trials past B/3 | their share | training | floor at B/3 | floor at B/9"
        " | confirmation | other | paid |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, case in data["cases"].items():
        m = case["median"]
        if not m:
            out.append(f"| {name} | no search reached |" + " |" * 7)
            continue
        out.append(
            f"| {name} | {m['past_last_rung']:g} of {data['settings']['trials']}"
            f" | {m['past_last_rung_share']:.0%} | {m['train_trainings']:.1f}"
            f" | {m['floor_stopped_at_b_over_eta']:.1f} | {m['floor_stopped_at_b_over_eta2']:.1f}"
            f" | {m['race_trainings']:.1f} | {m['other_trainings']:.1f}"
            f" | {m['cost_trainings_wall_warm']:.1f} |"
        )
    return [*out, ""]


def _prescreen_cost(data: dict[str, Any]) -> list[str]:
    out = [
        "## Pre-screen cost: landing on the largest batch that fits",
        "",
        "`bench/prescreen_cost.py`, on each simulated member with its own memory-estimate error"
        " (`estimate_error`): the trace's answer used alone; raybatch's procedure (the largest"
        " micro batch of the space the estimate admits within the probe margin of"
        f" {data.get('probe_margin', 0.2):.0%}, confirmed by the trial's one-step probe, the next"
        " smaller micro batch after an OOM); Lightning's finder in power and binsearch modes"
        f" ({data['steps_per_try']} steps per try, an OOM try fails on its first step);"
        f" accelerate's x{data['shrink']} shrink-and-restart loop (from 4x what fits). Device"
        " seconds from the simulator's step time and OOM cost (a restart: process and CUDA"
        " start-up). `exact` is the true largest micro batch, `grid` the largest of the space's"
        f" micro batches ({', '.join(map(str, data.get('space_micro_batches', [])))}) that fits:"
        " the best a search over that space can land on.",
        "",
        "| workload | estimate error | strategy | found | exact | grid | found / exact |"
        " fits | device steps | OOMs | restarts | device seconds |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in data["rows"]:
        if "exact_on_grid" not in r:  # the CPU case, below
            continue
        out.append(
            f"| {r['workload']} | {r['estimate_error']:+.0%} | {r['strategy']} | {r['found']}"
            f" | {r['exact']} | {r['exact_on_grid']} | {r['found_fraction']:.2f} |"
            f" {'yes' if r['lands_fitting'] else '**OOM**'} | {r['device_steps']} |"
            f" {r['ooms']} | {r['restarts']} | {r['device_seconds']:.2f} |"
        )
    cpu = [r for r in data["rows"] if "exact_on_grid" not in r]
    if cpu:
        out += [
            "",
            "On this CPU, digits (real steps and restarts timed, a restart rebuilding model and"
            " optimizer in-process). A CPU cannot run out of memory the way a GPU does, so the"
            " budget is emulated from the traced model: the trace is measured against itself"
            " here, and its `found` and OOMs are true by construction; only the seconds are"
            " measurements.",
            "",
            "| strategy | found | device steps | OOMs | restarts | device seconds | CPU trace s |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in cpu:
            trace_s = r.get("cpu_trace_s")
            out.append(
                f"| {r['strategy']} | {r['found']} | {r['device_steps']} | {r['ooms']} |"
                f" {r['restarts']} | {r['device_seconds']:.3f} |"
                f" {'-' if trace_s is None else f'{trace_s:.3f}'} |"
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
        ("real_training", _real_training),
        ("noise_scale", _noise_scale),
        ("rung_replay", _rung_replay),
        ("near_ties", _near_ties),
        ("loop_overhead", _loop_overhead),
        ("digits_batch_sweep", _digits_sweep),
        ("prescreen_cost", _prescreen_cost),
        ("trace_cost", _trace_cost),
        ("space_overhead", _space_overhead),
        ("plugin_overhead", _plugin_overhead),
    ):
        data = _load(name)
        if data is not None:
            body = section(data)
            lines += [*body[:2], measured(data), "", *body[2:]]
    gpu_files = (
        "gpu_memory_accuracy",
        "gpu_trial_timing",
        "gpu_check",
        "gpu_memory_history",
        "gpu_recipe_times",
    )
    for name in gpu_files:
        data = _load(name)
        if data is not None:
            lines += _gpu_section(name, data)  # it says what code it measured
    missing = [n for n in gpu_files if _load(n) is None]
    if missing:
        lines += [
            "## GPU verification",
            "",
            "Code measured: none yet.",
            "",
            f"Not run yet: {', '.join(f'`bench/{n}.py`' for n in missing)}"
            f" {'needs' if len(missing) == 1 else 'need'} an NVIDIA GPU.",
            "",
        ]
    return "\n".join(lines)


def _gpu_section(name: str, data: dict[str, Any]) -> list[str]:
    """A GPU verification's figures: every number and verdict at its top two levels."""
    lines = [
        f"## GPU verification: `bench/{name}.py`",
        "",
        measured(data),
        "",
        f"On {data['device']}, torch {data['torch']}, {data['date']};"
        f" the full record is `bench/results/{name}.json`.",
        "",
    ]
    targets = data.get("targets", {})
    if targets:
        missed = [name for name, t in targets.items() if not t["met"]]
        lines += [
            f"Targets: {len(targets) - len(missed)} of {len(targets)} met"
            + (f"; missed: {', '.join(missed)}." if missed else "."),
            "",
        ]
        lines += [
            f"- {'met' if t['met'] else '**missed**'}: {name} = {_figure(t['measured'])}"
            f" (target {t['target']})"
            for name, t in targets.items()
        ]
        lines.append("")
    for key, value in data.items():
        if key in ("benchmark", "device", "torch", "date", "targets", "measured_at"):
            continue
        if isinstance(value, dict):
            for inner, item in value.items():
                if isinstance(item, int | float | bool | str) or item is None:
                    lines.append(f"- {key}.{inner}: {item}")
        elif isinstance(value, int | float | bool | str):
            lines.append(f"- {key}: {value}")
    return [*lines, ""]


def _figure(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _tally(workloads: dict[str, Any], recipe: str) -> str:
    """``beat in N, within noise in M, lost in K`` of the cases against ``recipe``."""
    counts = {"beat": [], "within noise of": [], "lost to": []}
    for name, w in workloads.items():
        c = w["compared"].get(recipe)
        if c is not None:
            verdict = (
                "within noise of" if c["within_noise"] else "beat" if c["ratio"] > 1 else "lost to"
            )
            counts[verdict].append(name)
    return ", ".join(f"{verdict} it in {len(names)} ({', '.join(names)})"
                     for verdict, names in counts.items() if names)  # fmt: skip


def headline() -> str:
    """The README's figures, one small table from the same result files as the page: whether
    the search keeps its promise on real training, what it costs, and the simulated family;
    every other figure is on the benchmarks page."""
    rows = ["| Question | Measured | Target | At |", "| --- | --- | --- | --- |"]
    real = _load("real_training")
    if real is not None:
        w = real["workloads"]
        rows.append(
            f"| Faster than the largest batch that fits? (real training, {len(w)} cases x"
            f" {real['searches']} searches) | at the rule's LR: {_tally(w, 'max_batch')}; at its"
            f" best swept LR: {_tally(w, 'max_batch_tuned')} | faster, or within noise"
            f" | {_short(real).strip()} |"
        )
        near = [f"{name} {1 / c['ratio']:.2f}x" for name, c in
                ((n, x["compared"].get("grid_best")) for n, x in w.items()) if c]  # fmt: skip
        rows.append(
            "| Winners' time against a grid's best recipe (real; < 1: faster) | "
            + ", ".join(near)
            + f" | <= {GRID_BEST_WITHIN:.2f}x | {_short(real).strip()} |"
        )
        cost = _real_cost(real)
        if cost:
            spans = cost.split(": ", 1)[1].rstrip(".")
            rows.append(
                "| What a search costs the user (real, slots x wall clock less one process start"
                f" per slot, in trainings of {_units(real)}) |"
                f" {spans} | median <= {COST_TARGET},"
                f" worst <= {COST_WORST} | {_short(real).strip()} |"
            )
    search = _load("search_efficiency")
    if search is not None:
        for slots in sorted({r.get("slots", 2) for r in search["rows"]}):
            mine = [r for r in search["rows"] if r["strategy"] == "raybatch"
                    and r.get("slots", 2) == slots]  # fmt: skip
            at = 12 if any(r["budget"] == 12 for r in mine) else 20
            ours = [r for r in mine if r["budget"] == at]
            worst = max(ours, key=lambda r: r["median_regret"])
            to = [math.inf if r["compute_to_regret_105"] is None else r["compute_to_regret_105"]
                  for r in ours]  # fmt: skip
            rows.append(
                f"| Simulated family ({len(ours)} members x {search['seeds']} seeds, the shipped"
                f" search, {slots} slot(s)): regret at {at} trials; compute to regret 1.05 |"
                f" worst median regret {worst['median_regret']:.3f}; median"
                f" {statistics.median(to):.1f}, worst {max(to):.1f} trainings of the optimum |"
                f" <= 1.05; median {COMPUTE_MEDIAN_TARGET}, worst {COMPUTE_WORST_TARGET} |"
                f" {_short(search).strip()} |"
            )
    return "\n".join(rows)


def _real_cost(real: dict[str, Any]) -> str:
    """What each case's searches cost the user (slots x wall clock, less one process start per
    slot), in trainings of its fastest recipe measured; before that was measured, every device
    second."""
    spans = []
    for name, w in real["workloads"].items():
        paid = _paid(w)
        device = [s.get("cost_trainings_device") for s in w["searches"]]
        if paid is not None:
            spans.append(f"{name} {min(paid):.1f}-{max(paid):.1f}")
        elif None not in device and device:
            spans.append(f"{name} {min(device):.0f}-{max(device):.0f} (device seconds)")
        else:
            return ""
    return (" Each search cost the user, slots x wall clock less one process start per slot, in"
            f" trainings of {_units(real)} (target median <= {COST_TARGET}, worst <="
            f" {COST_WORST}): " + "; ".join(spans) + ".")  # fmt: skip


def _span(runs: list[dict[str, float]], key: str, spec: str, scale: float = 1.0) -> str:
    values = [r[key] / scale for r in runs]
    return f"{format(min(values), spec)}-{format(max(values), spec)}" if values else "-"


def _printed(data: dict[str, Any]) -> str:
    lines = data.get("printed_lines")
    if lines is None:
        return ""
    met = "met" if lines <= 40 else "NOT met"
    return f" ({lines} lines in all, its progress included; target at most 40: {met})"


def demo() -> str:
    """The README's demo: what ``make demo``'s command printed here, and its figures."""
    data = _load("demo_search")
    if data is None:
        return "(run `bench/demo_search.py` to fill this in)"
    win = data["winner"]
    minutes, seconds = divmod(round(data["wall_s"]), 60)
    times = _span(win["runs"], "time_s", ".2f")
    cost = data.get("search_cost") or {}
    tuned = (data.get("compared") or {}).get("max_batch_tuned") or {}
    against = ""
    if tuned.get("ratio") is not None and not tuned.get("is_winner"):
        bound = "at least " if tuned.get("bound") == "at_least" else ""
        against = (
            f" The largest batch at its best swept LR ({tuned['recipe']}) was"
            f" {bound}{tuned['ratio']:.2f}x the winner's time in its search run."
        )
    return "\n".join([
        "```console",
        f"$ {data['command']} --run-dir runs/tabular",
        "...its progress on stderr: a line per phase and per trial...",
        *data["output"],
        "best config: runs/tabular/best_config.yaml",
        "report:      runs/tabular/report.html",
        "```",
        "",
        f"(That is what the demo's command printed here{_printed(data)}, in {minutes} min"
        f" {seconds} s on 2 cores"
        " (`bench/demo_search.py`, `bench/results/demo_search.json`). The winner's runs (its"
        f" search run and any confirmation run) took {times} s of training to the target."
        + against
        + (f" The search cost the user {cost['trainings_wall']:.1f} trainings of the recipe it"
           f" found, {cost['slots']} slot(s) x {cost['wall_s']:.0f} s of wall clock"
           f" ({cost['trainings_wall_warm']:.1f} less one process start per slot); its runs"
           f" held their devices for {cost['trainings']:.1f} ({cost['trainings_train']:.1f} in"
           " training seconds alone)."
           if cost.get("trainings_wall") is not None else
           f" The search cost {cost['trainings']:.1f} trainings of the recipe it found, every"
           f" device second counted ({cost['trainings_train']:.1f} in training seconds alone)."
           if cost else "")
        + " Timings on a shared 2-core machine vary by tens of percent between runs, which is"
        " why a winner within the zone of its runner-up is raced on a fresh seed.)",
    ])  # fmt: skip


def rendered_blocks(text: str) -> str:
    """``text`` (the README or a docs page) with each generated block it holds rendered afresh:
    the benchmark headline, the demo and the trace cost. A page without markers is unchanged."""
    blocks = (
        (START, END, lambda: f"\n{headline()}\n"),
        (DEMO_START, DEMO_END, lambda: f"\n{demo()}\n"),
        (TRACE_START, TRACE_END, trace_times),
    )
    for start, end, body in blocks:
        if start in text:
            head, rest = text.split(start, 1)
            _, tail = rest.split(end, 1)
            text = f"{head}{start}{body()}{end}{tail}"
    return text


def rendered_pages(readme: Path = README, docs: Path = DOCS) -> dict[Path, str]:
    """The README and every page beside ``docs`` (the benchmarks page), each as it should read
    with its generated blocks rendered afresh (a page without one reads as it does)."""
    pages = [readme, *sorted(p for p in docs.parent.glob("*.md") if p != docs)]
    return {page: rendered_blocks(page.read_text()) for page in pages}


def trace_times() -> str:
    """The README's sentence on what one trace costs, from ``trace_cost.json``."""
    data = _load("trace_cost")
    if data is None:
        return "(run `bench/trace_cost.py`)"
    w = data["workloads"]
    return (
        f"{w['digits_cnn']['median_s_per_trace']:.2f} s for the digits example and"
        f" {w['resnet18_224']['median_s_per_trace']:.2f} s for a ResNet-18 at\n224x224"
    )


def main(out: Path = DOCS, readme: Path = README) -> str:
    text = render()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    for page, rendered in rendered_pages(readme, out).items():
        page.write_text(rendered)
    return text


if __name__ == "__main__":
    main()
