"""What a finished search returns: :class:`SearchResult`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raybatch import keys
from raybatch.export import BestConfig
from raybatch.keys import KnobPoint
from raybatch.metric import Target
from raybatch.results.rows import TrialRow
from raybatch.status import TrialStatus


@dataclass
class SearchResult:
    """What a finished search leaves: its directory, its rows and the winner (if any), and the
    target it searched for (what :func:`raybatch.verdict` says the winner reaches)."""

    run_dir: Path
    rows: list[TrialRow]
    best: BestConfig | None
    baseline: KnobPoint | None = None
    reference: KnobPoint | None = None
    notes: list[str] = field(default_factory=list)
    target: Target | None = None


_ENDED = {
    TrialStatus.DIVERGED: "diverged",
    TrialStatus.CENSORED: "ran out of time",
    TrialStatus.CAPPED: "were capped",
    TrialStatus.INFEASIBLE_MEMORY: "ran out of memory",
    TrialStatus.ERROR: "failed",
    TrialStatus.LOST_AT_INTERRUPTION: "were lost at an interruption",
}


def no_winner_reason(rows: list[TrialRow], target: Any) -> str:
    """Why a search found no recipe, in one line: how its trials ended and the commonest
    reason (``all 4 trials diverged: loss is nan at step 1``)."""
    search = [r for r in rows if r.phase == keys.PHASE_SEARCH]
    if not search:
        screened = [r for r in rows if r.phase == keys.PHASE_PRESCREEN]
        if screened:
            return (f"no trial ran: all {len(screened)} suggestions were kept out before launch"
                    f" ({screened[-1].reason})")  # fmt: skip
        return "no trial ran"
    if any(r.reached for r in search):
        return (f"no recipe reached {target}, or the race's meeting level, in every"
                " confirmation run")  # fmt: skip
    counts = Counter(r.status for r in search)
    reasons = Counter(r.reason for r in search if r.reason)
    why = f": {reasons.most_common(1)[0][0]}" if reasons else ""
    if len(counts) == 1:
        status = search[0].status
        ended = _ENDED.get(status, status.value).removeprefix("were ")
        trials = "its one trial" if len(search) == 1 else f"all {len(search)} trials"
        return f"{trials} {ended}{why}"
    how = ", ".join(f"{n} {_ENDED.get(s, s.value)}" for s, n in counts.most_common())
    return f"none of the {len(search)} trials reached {target} ({how}){why}"


__all__ = ["SearchResult", "no_winner_reason"]
