"""The report of a search: one HTML page beside its PNG plots (matplotlib, headless).

Plots: time to target vs effective batch (coloured by accumulation, marker by status);
predicted memory vs micro batch with the budget line; the optimisation history (best so far);
the time model's predicted time to target against the measured one;
and the winner against the max-batch baseline and the reference recipe (medians as bars, every
confirmation run as a dot, so overlapping runs show). A one-line verdict
says what was found in plain language.
"""

from __future__ import annotations

import html
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raybatch import keys
from raybatch.export import BEST_YAML
from raybatch.keys import KnobPoint, knob_items
from raybatch.memory.sizes import format_bytes
from raybatch.metric import Target
from raybatch.provenance import Comparison
from raybatch.results.cost import search_cost
from raybatch.results.outcome import no_winner_reason
from raybatch.results.rows import TrialRow, plain_text, status_counts
from raybatch.results.selection import runs_point, select_winner
from raybatch.space.search_space import SearchSpace

if TYPE_CHECKING:
    from raybatch.memory.estimator import MemoryEstimator
    from raybatch.results.outcome import SearchResult

REPORT = "report.html"
MARKERS = {"reached": "o", "censored": "x", "capped": "^", "diverged": "D",
           "infeasible_memory": "s", "prescreened_out": "P", "error": "*"}  # fmt: skip
"""A trial stopped before the target is drawn at the time it trained: its time to target is
at least that, so the capped one points up."""


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on clusters or CI
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out: Path) -> None:
    """Write a figure as PNG and free it (pyplot keeps every open figure otherwise)."""
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    _plt().close(fig)


def _plot_time_vs_batch(rows: list[TrialRow], out: Path, winner: list[TrialRow]) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.0, 4.0))
    accumulations = sorted({r.accumulation_steps for r in rows})
    colors = plt.cm.viridis([i / max(len(accumulations) - 1, 1) for i in range(len(accumulations))])
    for status, marker in MARKERS.items():
        for acc, color in zip(accumulations, colors, strict=True):
            pts = [r for r in rows if r.status == status and r.accumulation_steps == acc]
            if not pts:
                continue
            ys = [r.time_to_target_s or r.train_s or 0.0 for r in pts]
            ax.scatter([r.effective_batch_size for r in pts], ys, marker=marker,
                       color=color, label=f"{status}, accum {acc}")  # fmt: skip
    _mark_winner(ax, [(r.effective_batch_size, r.time_to_target_s) for r in winner])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("effective batch size")
    ax.set_ylabel("training time to target (s)")
    ax.set_title("search trials; one stopped before the target: the time it trained (at least)",
                 fontsize=8)  # fmt: skip
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside, not on, points
    _save(fig, out)


def _mark_winner(ax: Any, points: list[tuple[float, float | None]]) -> None:
    """The winner's runs that reached, as a ring around their points: the one a reader looks
    for first."""
    shown = [(x, y) for x, y in points if y is not None]
    if shown:
        ax.scatter([x for x, _ in shown], [y for _, y in shown], s=160, facecolors="none",
                   edgecolors="red", linewidths=1.5, label="winner", zorder=4)  # fmt: skip


def _plain_log_ticks(ax: Any) -> None:
    """Log axes labelled at 1, 2 and 5 of each decade, as plain numbers: every minor tick
    labelled overlapped on a narrow range, and decades alone left a range within one decade
    with no label at all."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    plain = FuncFormatter(lambda value, _: f"{value:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(plain)
        axis.set_minor_locator(LogLocator(subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0)))
        axis.set_minor_formatter(FuncFormatter(lambda value, _: ""))


def _plot_memory(space: SearchSpace, estimator: MemoryEstimator | None, budget: int | None,
                 out: Path) -> bool:  # fmt: skip
    if estimator is None:
        return False
    plt = _plt()
    sizes = sorted(space.search.micro_batch_size)
    grid = sorted(
        {*sizes, *range(min(sizes), max(sizes) + 1, max((max(sizes) - min(sizes)) // 32, 1))}
    )
    model = estimator.model_for()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(grid, [model.predict(b) / 2**20 for b in grid], label="predicted peak")
    ax.scatter(sizes, [model.predict(b) / 2**20 for b in sizes], label="space's micro batches")
    if budget is not None:
        ax.axhline(
            budget / 2**20, color="red", linestyle="--", label=f"budget {format_bytes(budget)}"
        )
    ax.set_xlabel("micro batch size")
    ax.set_ylabel("MiB")
    ax.legend(fontsize=8)
    _save(fig, out)
    return True


def _plot_history(rows: list[TrialRow], out: Path) -> None:
    plt = _plt()
    objective = [r.objective for r in rows if r.phase == keys.PHASE_SEARCH]
    best, current = [], float("inf")
    for v in objective:
        current = min(current, v if v is not None else float("inf"))
        best.append(current)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(range(1, len(objective) + 1), [v if v is not None else float("nan") for v in objective],
            "o", alpha=0.5, label="trial objective")  # fmt: skip
    ax.step(range(1, len(best) + 1), best, where="post", label="best so far")
    ax.set_yscale("log")
    ax.set_xlabel("trial")
    ax.set_ylabel("objective (s, PAR-10 if not reached)")
    ax.legend(fontsize=8, loc="center right")  # the penalties line the top
    _save(fig, out)


def _plot_predicted(rows: list[TrialRow], out: Path, winner: list[TrialRow]) -> bool:
    """The time model's prediction against the measured time to target, one dot per search
    trial that reached the target (the diagonal: a perfect prior)."""
    pts = [
        (p, t)
        for r in rows
        if r.phase == keys.PHASE_SEARCH
        and (p := r.predicted_time_s) is not None
        and (t := r.time_to_target_s) is not None
    ]
    if len(pts) < 2:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.8, 4.0))
    ax.scatter([p for p, _ in pts], [t for _, t in pts], color="tab:blue")
    low = min(min(p, t) for p, t in pts)
    high = max(max(p, t) for p, t in pts)
    ax.plot([low, high], [low, high], color="grey", linestyle="--", label="prediction = measured")
    _mark_winner(ax, [(p, r.time_to_target_s) for r in winner if r.phase == keys.PHASE_SEARCH
                      and (p := r.predicted_time_s) is not None])  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax)
    ax.set_xlabel("predicted time to target (s, time model)")
    ax.set_ylabel("measured training time to target (s)")
    ax.legend(fontsize=8)
    _save(fig, out)
    return True


def _compared_points(result: SearchResult) -> list[tuple[str, KnobPoint | None]]:
    """The recipes the verdict compares the winner with, as the table and the bars name them:
    the largest batch at its best swept LR (where it is neither the winner nor the rule's
    LR), at the rule's LR, and the reference."""
    tuned = None
    if result.best is not None:
        compared = (result.best.provenance.compared or {}).get("max_batch_tuned")
        at_rule = result.baseline or KnobPoint()
        if compared and not compared.is_winner and not runs_point(compared.knobs, at_rule):
            tuned = compared.knobs
    points: list[tuple[str, KnobPoint | None]] = [
        ("max batch, best LR", tuned),
        ("max batch", result.baseline),
    ]
    return [*[p for p in points if p[1] is not None], ("reference", result.reference)]


def _matching(rows: list[TrialRow], knobs: KnobPoint | None) -> list[TrialRow]:
    if knobs is None:
        return []

    # Prefer the confirmation runs to the target (the same seeds and conditions as the
    # winner's); a run to the race's meeting level has no time to target to show.
    same = [r for r in rows if _is_point(r.knob_dict(), knobs)]
    confirmed = [r for r in same if r.phase == keys.PHASE_CONFIRMATION and r.meet_level is None]
    return confirmed or [r for r in same if r.phase == keys.PHASE_SEARCH]


def _is_point(knobs: KnobPoint, point: KnobPoint) -> bool:
    """A seeded point (integer knobs at the rule's LR), or a whole recipe's raw knobs."""
    if keys.LR_MULTIPLIER not in point:
        return runs_point(knobs, point)
    mine = dict(knob_items(knobs))
    return all(math.isclose(mine[k], v, rel_tol=1e-9) for k, v in knob_items(point))


@dataclass(frozen=True)
class _Summary:
    """One recipe's runs in the report's comparison: medians of those that reached, and the
    most any trained where none did."""

    label: str
    reached: str  # "k of n"
    effective: int
    time: float | None
    times: list[float]  # every run's time to target: a median alone hides overlaps
    trained: float  # stopped before the target in every run: its time is at least this
    samples: float | None
    throughput: float | None
    eval: float | None
    elapsed: float | None


def _summary(rows: list[TrialRow]) -> _Summary | None:
    rows = [r for r in rows if r.meet_level is None]  # a meeting run's time is to its level
    reached = [r for r in rows if r.to_target]
    if not rows:
        return None
    times = [r.time_to_target_s for r in reached if r.time_to_target_s is not None]
    evals = [r.eval_s for r in reached if r.eval_s is not None]
    elapsed = [r.elapsed_to_target_s for r in reached if r.elapsed_to_target_s is not None]
    samples = [r.samples_to_target for r in reached if r.samples_to_target is not None]
    # A trial that never reported (hung, failed at start) has no throughput.
    rates = [r.throughput for r in rows if r.throughput is not None]
    first = rows[0]
    return _Summary(
        label=(f"{first.micro_batch_size} x {first.accumulation_steps} at"
               f" {first.lr_multiplier:.3g}x (lr {first.lr:.3g})"),
        reached=f"{len(times)} of {len(rows)}",
        effective=first.effective_batch_size,
        time=statistics.median(times) if times else None,
        times=times,
        trained=max((r.train_s or 0.0 for r in rows), default=0.0),
        samples=statistics.median(samples) if samples else None,
        throughput=statistics.median(rates) if rates else None,
        eval=statistics.median(evals) if evals else None,
        elapsed=statistics.median(elapsed) if elapsed else None,
    )  # fmt: skip


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _plot_comparison(entries: dict[str, _Summary], out: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(10.4, 3.2))
    names = list(entries)
    colors = ["tab:green", "tab:orange", "tab:red", "tab:blue"]
    for ax, key, label in zip(axes, ("time", "samples", "throughput"),
                              ("training time to target (s)", "samples to target", "samples / s"),
                              strict=True):  # fmt: skip
        for i, name in enumerate(names):
            value = getattr(entries[name], key)
            if value is not None:
                ax.bar(i, value, color=colors[i % len(colors)])
            elif key == "time":  # never reached: at least the time it trained, hatched
                trained = entries[name].trained
                ax.bar(i, trained, color="white", edgecolor=colors[i % 4], hatch="//")
                ax.annotate("not reached:\ntrained", (i, trained), ha="center", va="bottom",
                            fontsize=6)  # fmt: skip
            else:
                ax.annotate("not\nreached", (i, 0), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(names)), [n.replace(", ", ",\n") for n in names])
        ax.set_title(label, fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        ax.margins(y=0.15)  # room for the notes above the bars
    # A median alone hides whether two recipes' runs overlap: draw every run that reached.
    for i, name in enumerate(names):
        runs = entries[name].times
        axes[0].scatter([i] * len(runs), runs, color="black", s=12, zorder=3)
    _save(fig, out)


_COMPARED = (
    ("max_batch_tuned", "the largest batch that fits at its best swept LR"),
    ("max_batch", "the largest batch that fits at the rule's LR"),
    ("reference", "the reference recipe"),
)


def _ratio_text(compared: Comparison) -> str:
    ratio, bound = compared.ratio, compared.bound
    if compared.is_winner:
        return "is the winner itself"
    if ratio is None:
        return f"ended {compared.status} in the search"
    if bound == "at_least" and ratio >= 1:
        return f"at least {ratio:.2f}x slower (stopped before the target)"
    if bound == "at_least":  # stopped sooner than the winner reached: it proves no order
        return (f"no comparison: stopped before the target after {ratio:.2f}x the winner's time,"
                " which says neither slower nor faster")  # fmt: skip
    if bound == "paired":
        pairs = f"{compared.wins} of {compared.pairs} pairs won by the winner"
        if compared.within_noise:
            return f"within noise (paired ratio {ratio:.2f}; {pairs})"
        return f"{ratio:.2f}x slower seed by seed ({pairs})"
    if ratio >= 1:
        return f"{ratio:.2f}x slower"
    return f"{1 / ratio:.2f}x faster on the search's run (it lost the confirmation)"


NOT_CONFIRMED = (
    "Not confirmed on a fresh seed: the winner stands on its search run (the search's seed);"
    " no confirmation ran, or the search's runs decided it."
)


def _same_recipe(a: Any, b: Any) -> bool:
    return all(getattr(a, k) == getattr(b, k) for k in keys.RAW_KNOBS)


def _spent_without_a_winner(rows: list[TrialRow]) -> str:
    """What a search that found nothing cost, in seconds (no recipe's training to count it in):
    a failed search says its price too."""
    cost = search_cost(rows, 1.0)  # pre-screened configs never ran: not among its runs
    if not cost.runs:
        return ""
    paid = (
        ""
        if cost.wall_s is None or cost.slots is None
        else f"; {cost.slots} slot(s) x {cost.wall_s:.1f} s of wall clock, first start to last end"
    )
    return f"\nIt spent {cost.device_s:.1f} device-seconds in {cost.runs} run(s){paid}."


def verdict(result: SearchResult, target: Target | None = None) -> str:
    """Plain-language lines: the winner with its LR and how often it reached the target, the
    runner-up seed by seed (or "within noise"), the simple alternatives (the largest batch at
    its best swept LR and at the rule's, the reference), and what the search cost: what the
    CLI prints at a search's end, for ``print(raybatch.verdict(result))`` after
    :func:`raybatch.search`. ``target``: the result's own by default."""
    target = target if target is not None else result.target
    if target is None:
        raise ValueError("verdict: this SearchResult carries no target; pass target=")
    if result.best is None:
        spent = _spent_without_a_winner(result.rows)
        if not any(r.reached for r in result.rows if r.phase == keys.PHASE_SEARCH):
            why = no_winner_reason(result.rows, target)
            return (f"No trial of the search reached {target}: there was nothing to confirm.\n"
                    f"{why[0].upper()}{why[1:]}.{spent}")  # fmt: skip
        return f"No recipe reached {target} in every run that judged it.{spent}"
    c = result.best.config
    p = result.best.provenance
    runs = p.time_to_target_s_runs or []
    lines = [
        f"Winner: micro batch {c.micro_batch_size} x {c.accumulation_steps} accumulation"
        f" (effective {c.effective_batch_size}) at {c.lr_multiplier:.3g}x the rule's LR"
        f" (lr {c.lr:.4g}) reaches {target} in {p.median_time_to_target_s or 0.0:.2f} s of"
        f" training (median; it reached the target in {len(runs)} of {len(runs)} runs)."
    ]
    confirmed = [r for r in result.rows
                 if r.phase == keys.PHASE_CONFIRMATION and _same_recipe(r.config, c)]  # fmt: skip
    if not confirmed:
        lines.append(NOT_CONFIRMED)
    elif all(r.meet_level is not None for r in confirmed):
        level = confirmed[0].meet_level
        lines.append(f"Its time is its search run's: on a fresh seed it met the runner-up at"
                     f" {level:.4g}, the level it had at half that time, and trained no"
                     f" further.")  # fmt: skip
    runner = p.runner_up
    if runner:
        knobs = runner.knobs
        name = (f"{knobs.get('micro_batch_size')} x {knobs.get('accumulation_steps', 1)} at"
                f" {knobs.get('lr_multiplier', 1.0):.3g}x")  # fmt: skip
        if runner.within_noise:
            how = (f"within noise of it (paired ratio {runner.paired_ratio:.2f}, inside the"
                   f" {runner.indifference:.0%} indifference zone)")  # fmt: skip
        else:
            how = f"{runner.paired_ratio:.2f}x faster than it seed by seed"
        lines.append(f"Runner-up {name}: the winner is {how}, {runner.wins} of"
                     f" {runner.pairs} pairs won.")  # fmt: skip
    for key, name in _COMPARED:
        compared = (p.compared or {}).get(key)
        if compared is not None:
            lines.append(f"Against {name}, {compared.recipe}: {_ratio_text(compared)}.")
    if p.search_cost is not None:
        said = p.search_cost.sentence()
        lines.append(f"{said[0].upper()}{said[1:]}.")
    return "\n".join(lines)


def write_report(
    result: SearchResult,
    space: SearchSpace,
    target: Target,
    estimator: MemoryEstimator | None,
    budget: int | None,
) -> Path:
    run_dir = result.run_dir
    rows = result.rows
    confirmed = any(r.phase == keys.PHASE_CONFIRMATION for r in rows)
    winner = select_winner(rows, confirmed) if result.best is not None else None
    ran = winner.runs if winner is not None else []
    searched = [r for r in rows if r.phase != keys.PHASE_CONFIRMATION]
    _plot_time_vs_batch(searched, run_dir / "time_vs_batch.png", [r for r in ran if r in searched])
    has_memory = _plot_memory(space, estimator, budget, run_dir / "memory.png")
    _plot_history(rows, run_dir / "history.png")
    has_prior = _plot_predicted(rows, run_dir / "predicted.png", ran)
    entries: dict[str, _Summary] = {}
    if winner is not None and (summary := _summary(winner.runs)) is not None:
        entries["winner"] = summary
    for name, knobs in _compared_points(result):
        if (summary := _summary(_matching(rows, knobs))) is not None:
            entries[name] = summary
    if entries:
        _plot_comparison(entries, run_dir / "comparison.png")
    counts = status_counts(rows)
    table = "".join(
        f"<tr><td>{html.escape(n)}</td><td>{e.label}</td><td>{e.effective}</td>"
        f"<td>{e.reached}</td>"
        f"<td>{_cell(e.time, '.3f')}</td><td>{_cell(e.eval, '.3f')}</td>"
        f"<td>{_cell(e.elapsed, '.3f')}</td><td>{_cell(e.samples, '.0f')}</td>"
        f"<td>{_cell(e.throughput, '.0f')}</td></tr>"
        for n, e in entries.items()
    )
    images = ["time_vs_batch.png", *(["memory.png"] if has_memory else []), "history.png",
              *(["predicted.png"] if has_prior else []),
              *(["comparison.png"] if entries else [])]  # fmt: skip
    notes = "".join(f"<li>{html.escape(plain_text(n))}</li>" for n in result.notes)
    winner_link = (
        f'; the winner: <a href="{BEST_YAML}">{BEST_YAML}</a>'
        if result.best is not None and (run_dir / BEST_YAML).is_file()
        else "; no winner, so no best_config.yaml"
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>raybatch: {html.escape(space.name)}</title>
<style>body{{font-family:sans-serif;max-width:60rem;margin:2rem auto}}td,th{{padding:.2rem .6rem}}
img{{max-width:100%}}</style>
</head><body>
<h1>raybatch search: {html.escape(space.name)}</h1>
<p><b>{"<br>".join(html.escape(line) for line in verdict(result, target).splitlines())}</b></p>
<p>Trials by status: {html.escape(", ".join(f"{k} {v}" for k, v in sorted(counts.items())))}.
Budget: {format_bytes(budget) if budget else "none (CPU run, no pre-screen)"}.</p>
<p>Times to target count training only (waiting for data included): evaluation is raybatch's
measuring device, not part of your training, so its time is shown apart.</p>
<table border="1"><tr><th></th><th>micro x accum at LR</th><th>effective</th><th>reached</th>
<th>training time to target (s)</th><th>evaluation (s)</th><th>with evaluation (s)</th>
<th>samples to target</th><th>samples/s</th></tr>{table}</table>
<ul>{notes}</ul>
{"".join(f'<p><img src="{i}" alt="{i}"></p>' for i in images)}
<p>Every trial: <a href="trials.csv">trials.csv</a>{winner_link};
the study, from the run directory: <code>optuna-dashboard sqlite:///optuna.db</code>.</p>
</body></html>
"""
    out = run_dir / REPORT
    out.write_text(page)
    return out
