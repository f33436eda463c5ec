"""What a finished search returns: :class:`SearchResult`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raybatch.export import BestConfig
from raybatch.results.rows import TrialRow


@dataclass
class SearchResult:
    """What a finished search leaves: its directory, its rows and the winner (if any)."""

    run_dir: Path
    rows: list[TrialRow]
    best: BestConfig | None
    baseline: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


__all__ = ["SearchResult"]
