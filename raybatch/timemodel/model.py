"""The search's prior: a model of time to target from the gradient noise scale and throughput.

McCandlish et al. 2018 (arXiv:1812.06162) find that the optimizer steps to a given loss follow
``S(B) = S_min (1 + B_noise / B)`` for an effective batch ``B``; Pollux (Qiao et al., OSDI 2021)
multiplies that statistical efficiency with measured throughput. Up to the constant ``S_min``:

    time(recipe) ~ (1 + B_noise / B) x (accumulation x t_micro(micro) + t_optimizer)

``t_micro`` is timed per micro batch; ``B_noise`` is ``B_simple = tr(Sigma) / |G|^2``, from
squared gradient norms at a small batch ``s`` and a big one ``b`` (McCandlish, appendix A), each
averaged over many batches before the ratio is taken, as both are noisy:

    |G|^2 ~ (b |G_b|^2 - s |G_s|^2) / (b - s),    tr(Sigma) ~ (|G_s|^2 - |G_b|^2) / (1/s - 1/b)

It is a *prior*: it orders and seeds the search (:class:`raybatch.tuning.seeding.Ladder`) and is
shown beside what was measured (``predicted_time_s``); where it is wrong, TPE still searches.
It ignores the LR (the rule carries the LR that worked best at the largest batch) and
communication between data-parallel workers.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from raybatch import keys


@dataclass(frozen=True)
class NoiseScale:
    """A measured gradient noise scale ``B_simple`` with its spread.

    Attributes:
        b_simple: ``tr(Sigma) / |G|^2`` from the means of both estimates (samples).
        low: 10th percentile of a bootstrap over the measured batches.
        high: 90th percentile of the same bootstrap.
        small_batch: The small batch ``s`` the norms were measured at.
        big_batch: The big batch ``b``.
        batches: How many big batches (each ``b / s`` small ones) were measured.
    """

    b_simple: float
    low: float
    high: float
    small_batch: int
    big_batch: int
    batches: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _b_simple(small_sq: float, big_sq: float, s: int, b: int) -> float:
    g2 = (b * big_sq - s * small_sq) / (b - s)
    trace = (small_sq - big_sq) / (1 / s - 1 / b)
    if g2 <= 0:  # the signal is lost in the noise: the batch that pays off is huge
        return math.inf
    return max(trace / g2, 0.0)


def noise_scale(
    small_sq: Sequence[float], big_sq: Sequence[float], small: int, big: int, rounds: int = 400
) -> NoiseScale:
    """``B_simple`` from squared gradient norms, one pair per big batch.

    Args:
        small_sq: ``|G_s|^2`` per big batch (the mean over its small batches).
        big_sq: ``|G_b|^2`` per big batch.
        small: ``s``.
        big: ``b`` (> ``s``).
        rounds: Bootstrap rounds for the spread.

    Raises:
        ValueError: Fewer than two batches, mismatched lengths, or ``big <= small``.
    """
    if big <= small:
        raise ValueError(f"the big batch ({big}) must exceed the small one ({small})")
    if len(small_sq) != len(big_sq) or len(small_sq) < 2:
        raise ValueError("need the same number (>= 2) of small- and big-batch norms")
    pairs = list(zip(small_sq, big_sq, strict=True))
    estimate = _b_simple(statistics.fmean(small_sq), statistics.fmean(big_sq), small, big)
    rng = random.Random(0)
    draws = []
    for _ in range(rounds):
        sample = [rng.choice(pairs) for _ in pairs]
        draws.append(
            _b_simple(
                statistics.fmean(p[0] for p in sample),
                statistics.fmean(p[1] for p in sample),
                small,
                big,
            )
        )
    draws.sort()
    return NoiseScale(
        estimate, draws[int(0.1 * rounds)], draws[int(0.9 * rounds) - 1], small, big, len(pairs)
    )


class Batching(Protocol):
    """What the time model reads of a recipe: its batching. A :class:`TrialConfig` has it,
    and so has a :class:`~raybatch.results.rows.TrialRow`, whose recipe columns carry it."""

    @property
    def micro_batch_size(self) -> int: ...
    @property
    def accumulation_steps(self) -> int: ...
    @property
    def effective_batch_size(self) -> int: ...


@dataclass(frozen=True)
class TimeModel:
    """Relative time to target of a recipe: ``(1 + B_noise / B) x`` its optimizer step's time.

    Attributes:
        noise: The measured noise scale.
        micro_step_s: Seconds of one forward and backward pass, by micro batch size.
        optimizer_step_s: Seconds of one optimizer step (the same for every batch).
        cost_s: Device seconds the measurements took (charged to the search).
    """

    noise: NoiseScale
    micro_step_s: dict[int, float]
    optimizer_step_s: float = 0.0
    cost_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def micro_time(self, micro: int) -> float:
        """Measured, or interpolated log-log between the nearest measured micro batches."""
        if micro in self.micro_step_s:
            return self.micro_step_s[micro]
        sizes = sorted(self.micro_step_s)
        lower = max((m for m in sizes if m < micro), default=sizes[0])
        upper = min((m for m in sizes if m > micro), default=sizes[-1])
        if lower == upper:  # outside the measured range: per-sample time of the nearest
            return self.micro_step_s[lower] * micro / lower
        w = math.log(micro / lower) / math.log(upper / lower)
        t0, t1 = math.log(self.micro_step_s[lower]), math.log(self.micro_step_s[upper])
        return math.exp(t0 + w * (t1 - t0))

    def step_time(self, recipe: Batching) -> float:
        return recipe.accumulation_steps * self.micro_time(recipe.micro_batch_size) + (
            self.optimizer_step_s
        )

    def steps_factor(self, effective_batch: int) -> float:
        """``S(B) / S_min = 1 + B_noise / B``."""
        if math.isinf(self.noise.b_simple):
            return math.inf
        return 1 + self.noise.b_simple / effective_batch

    def predicted_time(self, recipe: Batching) -> float:
        """Time to target in units of ``S_min`` optimizer steps' seconds (relative)."""
        factor = self.steps_factor(recipe.effective_batch_size)
        if math.isinf(factor):  # no estimate: only throughput orders the recipes
            return self.step_time(recipe) / recipe.effective_batch_size
        return factor * self.step_time(recipe)

    def best_effective_batch(self, recipes: Sequence[Batching]) -> int:
        """The effective batch of the recipe predicted fastest among ``recipes``."""
        return min(recipes, key=self.predicted_time).effective_batch_size

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimeModel:
        """The model :meth:`to_dict` wrote (a resumed search reads it instead of measuring)."""
        return cls(
            NoiseScale(**data["noise_scale"]),
            {int(k): float(v) for k, v in data["micro_step_s"].items()},
            float(data["optimizer_step_s"]),
            float(data["cost_s"]),
            list(data.get("notes", [])),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "noise_scale": self.noise.to_dict(),
            "micro_step_s": {str(k): v for k, v in sorted(self.micro_step_s.items())},
            "optimizer_step_s": self.optimizer_step_s,
            "cost_s": self.cost_s,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class MeasuredTimeModel:
    """A time model and the trial that measured it: what the searcher's plan keeps, read by
    the ladder and the closing notes; a dict only where it is written (the searcher's
    checkpoint, ``prior.json``).

    Attributes:
        model: The measured model.
        trial_id: The Tune trial that measured it.
    """

    model: TimeModel
    trial_id: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MeasuredTimeModel:
        """The record :meth:`to_dict` wrote (the model's fields and ``trial_id``)."""
        trial_id = data.get(keys.TRIAL_ID)
        return cls(TimeModel.from_dict(data), None if trial_id is None else str(trial_id))

    def to_dict(self) -> dict[str, Any]:
        return {**self.model.to_dict(), keys.TRIAL_ID: self.trial_id}


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); ``None`` for fewer than 3 pairs."""
    if len(a) != len(b) or len(a) < 3:
        return None

    def ranks(values: Sequence[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var else None
