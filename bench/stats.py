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


def paired_ratio(
    pairs: list[tuple[float, float]], rounds: int = 2000
) -> dict[str, float | list[float]]:
    """Median of the per-pair ratios a/b, with a 95% bootstrap interval over pairs.

    Each pair is one recipe on one seed, run both ways: the ratio within a pair compares like
    with like, where a ratio of pooled medians compares whichever runs fall in the middle of
    each pool (with recipes whose times cluster apart, two different recipes).
    """
    ratios = [a / b for a, b in pairs]
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choice(ratios) for _ in ratios) for _ in range(rounds))
    return {
        "ratio": statistics.median(ratios),
        "ratio_ci95": [medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]],
        "pairs": len(ratios),
    }
