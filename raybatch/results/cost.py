"""What a search cost: every second its trials held their devices, in trainings of a recipe.

A search is worth running only if it costs less than it saves over the user's next few
trainings, so its cost is said in the unit that compares: the time one training of the recipe
it found takes to reach the target. Every device second counts — a trial's start-up, data
loading, memory probe, training and evaluation (``held_s``, measured by the trial from the
moment its function begins), the time model's measurement, every confirmation run — not the
training seconds alone, which are reported beside it (in one real search the trials held their
slots for about 7.7x the seconds they trained).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from typing import Protocol

from raybatch import keys
from raybatch.provenance import SearchCost
from raybatch.results.rows import TrialRow


def held_seconds(row: TrialRow) -> float:
    """The device seconds a row's trial held: its own ``held_s`` (or, for a trial that never
    reported it, the longest clock it did report) times the devices it held -- every worker of
    a data-parallel trial, a packed trial's share of one GPU."""
    seconds = next((float(v) for v in (row.held_s, row.elapsed_s, row.train_s) if v is not None),
                   0.0)  # fmt: skip
    return device_seconds(seconds, row.world_size, row.gpu_share)


def device_seconds(seconds: float, world_size: int, gpu_share: float | None) -> float:
    """``seconds`` held by a trial, times the devices it held: every worker of a data-parallel
    trial, a packed trial's share of one GPU."""
    if world_size > 1:
        return seconds * world_size
    if gpu_share is not None and 0 < gpu_share < 1:
        return seconds * gpu_share
    return seconds


def search_cost(rows: list[TrialRow], unit_s: float, slots: int | None = None,
                sessions: Sequence[float] = ()) -> SearchCost:  # fmt: skip
    """The cost of the search whose rows are ``rows`` (pre-screened configs cost nothing: they
    never ran). Every device second is in them: the time model is measured inside a trial.
    Also what the user paid: ``slots`` (default: the most runs that held their devices at once,
    :func:`slots_used`) x the wall clock from the first run's start to the last one's end
    within each of the driver's ``sessions`` (:func:`wall_clock`), where the rows say when they
    ran.

    Raises:
        ValueError: ``unit_s`` is not a positive time.
    """
    if not unit_s > 0:
        raise ValueError(f"the unit of cost must be a positive time, got {unit_s!r}")
    ran = [r for r in rows if r.phase != keys.PHASE_PRESCREEN]
    device = sum(held_seconds(r) for r in ran)
    train = sum(float(r.train_s or 0.0) for r in ran)
    wall = wall_clock(ran, sessions)
    if wall is None:
        return SearchCost(device, train, unit_s, len(ran))
    # The search's slots where it says them, the most runs that overlapped where it does not or
    # it used fewer (a run paused and resumed reports one span, which can overlap more).
    used = slots_used(ran)
    slots = used if slots is None else min(slots, used)
    return SearchCost(device, train, unit_s, len(ran), wall, slots, slot_startups(ran, slots))


class Span(Protocol):
    """When a run began to hold its device and for how long (a row, or a run still in Tune)."""

    @property
    def started_at(self) -> float | None: ...

    @property
    def held_s(self) -> float | None: ...


def slots_used(rows: Sequence[Span]) -> int:
    """The most runs that held their devices at the same time (a data-parallel run is one):
    the slots the search kept busy, read from when each run started and how long it held."""
    events = sorted(
        (t, step)
        for r in rows
        if r.started_at is not None
        for t, step in ((r.started_at, 1), (r.started_at + (r.held_s or 0.0), -1))
    )  # an end and a start at the same moment: the end first (sorted: -1 before 1)
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return max(most, 1)


def wall_clock(rows: Sequence[Span], sessions: Sequence[float] = ()) -> float | None:
    """Seconds from the first run's start to the last one's end, of the runs that say when they
    started (``None`` where none does: rows written before that was recorded), summed over the
    driver's ``sessions`` (their starts, epoch seconds: the search, then each resume) where it
    was interrupted: the time a run lay interrupted, between its last run then and its resume,
    is not a cost (a run belongs to the last session that started before it ended). A run paused
    and resumed (:mod:`raybatch.tuning.promotion`) reports one span as long as all its processes
    held it, ending at its end: where it reaches back before its session began (resumed after
    an interruption), it counts from the session's start."""
    spans = [(r.started_at, r.started_at + (r.held_s or 0.0)) for r in rows
             if r.started_at is not None]  # fmt: skip
    if not spans:  # a run that failed before its first report says nothing: the others do
        return None
    starts = sorted(sessions)
    by_session: dict[int, list[tuple[float, float]]] = {}
    for start, end in spans:
        session = bisect.bisect_right(starts, end)
        begun = starts[session - 1] if session > 0 else start
        by_session.setdefault(session, []).append((max(start, begun), end))
    return sum(max(e for _, e in group) - min(s for s, _ in group)
               for group in by_session.values())  # fmt: skip


def slot_startups(rows: list[TrialRow], slots: int) -> float:
    """One process start per slot: what the first ``slots`` processes to start paid once, a
    fixed cost of the search that does not grow with training.

    A process's first run is charged its start-up (the import of raybatch, torch and the
    workload) and, before its clock starts, what only a process's first run pays: the first
    imports its training makes (``torch.optim`` imports ``torch._dynamo``, a second on these
    CPUs) and the data it builds (kept for the process's later runs). So the fixed cost is that
    first run's seconds before its clock (held less elapsed), less what a later run of the
    search spends there (the recipe's own set-up, its model built: the median over runs that
    were not first in their process), and never less than the start-up it was charged."""
    later = [_before_clock(r) for r in rows if not r.startup_s]
    own = statistics.median(later) if later else 0.0
    firsts = sorted((r.started_at or 0.0, r) for r in rows if r.startup_s)
    return sum(max(r.startup_s or 0.0, _before_clock(r) - own) for _, r in firsts[:slots])


def _before_clock(row: TrialRow) -> float:
    """A run's seconds held before its training clock started (and after it stopped)."""
    if row.held_s is None or row.elapsed_s is None:
        return row.startup_s or 0.0
    return max(row.held_s - row.elapsed_s, 0.0)


__all__ = [
    "Span",
    "device_seconds",
    "held_seconds",
    "search_cost",
    "slot_startups",
    "slots_used",
    "wall_clock",
]
