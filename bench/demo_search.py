"""The README's demo, run as a user runs it: ``make demo``'s exact command through the CLI.

The README shows what the demo prints and explains its verdict with figures from the run
(wall time, the confirmation runs of the winner and of the largest batch, their throughput and
samples to target). Those figures come from this file's result, rendered into the README by
``bench/render_docs.py``, never typed by hand.

Run: .venv/bin/python bench/demo_search.py  (writes bench/results/demo_search.json)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import measured_at, write_result

from raybatch import keys
from raybatch.results.rows import TrialRow, stored_rows
from raybatch.run.rundir import read_run

RESULTS = Path(__file__).parent / "results" / "demo_search.json"
ARGS = ["raybatch.examples.tabular:workload", "--target", "accuracy>=0.87", "--trials", "12",
        "--max-time-per-trial", "20"]  # fmt: skip
"""What ``make demo`` passes to ``raybatch search`` (the Makefile's line, less the run dir)."""


def _runs(rows: list[TrialRow], knobs: dict[str, Any]) -> list[dict[str, float | None]]:
    """The runs that judged one recipe (its search run and its confirmation runs, as the
    selection reads them): time, samples to target and throughput."""
    return [
        {"time_s": r.time_to_target_s, "samples": r.samples_to_target,
         "throughput": r.throughput}
        for r in rows
        if r.phase in (keys.PHASE_SEARCH, keys.PHASE_CONFIRMATION) and r.to_target
        and all(float(r.knob_dict()[k]) == float(v) for k, v in knobs.items())
    ]  # fmt: skip


def _first_status_line(lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines) if line.split()[:2] == ["status", "count"])


def main(args: list[str] = ARGS, out: Path = RESULTS) -> dict[str, Any]:
    at = measured_at()
    run_dir = Path(tempfile.mkdtemp(prefix="demo-")) / "run"
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "raybatch", "search", *args, "--run-dir", str(run_dir)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    wall = time.perf_counter() - start
    lines = proc.stdout.strip().splitlines()
    best = json.loads((run_dir / "best_config.json").read_text())
    rows = stored_rows(run_dir, read_run(run_dir).space)
    winner = {k: best["config"][k] for k in keys.RAW_KNOBS}
    data = {
        "benchmark": "demo_search",
        "command": "raybatch search "
        + " ".join(f'"{a}"' if ">" in a or "<" in a else a for a in args),
        "wall_s": wall,
        # From the status table on: what the search prints after Ray's own output.
        "output": [
            line
            for line in lines[_first_status_line(lines) :]
            if not line.startswith(("best config:", "report:"))
        ],
        # Every line the command printed, its progress on stderr included (the target: 40).
        "printed_lines": len(proc.stdout.splitlines()) + len(proc.stderr.splitlines()),
        "winner": {"knobs": winner, "runs": _runs(rows, winner)},
        "compared": best["provenance"].get("compared", {}),
        "search_cost": best["provenance"].get("search_cost"),
    }
    write_result(out, data, at)
    print("\n".join(data["output"]))
    return data


if __name__ == "__main__":
    main()
