"""Statistics the benchmarks share: an interval for a ratio of medians of paired runs."""

from __future__ import annotations

import random
import statistics


def ratio_ci95(pairs: list[tuple[float, float]], rounds: int = 2000) -> list[float]:
    """95% bootstrap interval of median(first) / median(second), resampling runs in pairs.

    Paired because the benchmarks interleave their two sides run by run: drift on a shared
    machine hits both members of a pair, and resampling them together keeps that cancelling.
    """
    rng = random.Random(0)
    ratios = []
    for _ in range(rounds):
        sample = [rng.choice(pairs) for _ in pairs]
        ratios.append(
            statistics.median(a for a, _ in sample) / statistics.median(b for _, b in sample)
        )
    ratios.sort()
    return [ratios[int(0.025 * rounds)], ratios[int(0.975 * rounds) - 1]]
