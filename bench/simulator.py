"""A simulated family of training workloads, for benchmarking search strategies by the hundred.

Each member obeys the empirical large-batch model of McCandlish et al. 2018 ("An Empirical
Model of Large-Batch Training"): optimizer steps to target ``S(B) = S_min (1 + B_noise / B)``
for an effective batch ``B``; an LR-quality penalty that grows with the LR multiplier's
distance from the member's best, from the first step away (no free band); divergence above a
critical LR scale; a step time in micro batch and accumulation following Pollux's form (Qiao
et al. 2021), ``T(b) = (T_c^g + (t_n b)^g)^(1/g)`` per micro step, which saturates at small
batches as GPUs do; a linear memory model with a budget (an OOM costs the time a real one
costs: start-up and the failed step); and multiplicative log-normal timing noise. What a trial
costs besides its training (start-up in a warm process, each evaluation) and the noise are set
from real runs (:class:`Member`). Ground truth comes from evaluating the whole grid without
noise.

The family is built not to flatter raybatch: the memory estimate the pre-screen sees is off by
a per-member factor (over-predicting rejects configs that fit, under-predicting admits some
that run out of memory); on two members the scaling rule's LR is far from the best (3.5x too
low on one, 3x too high on the other), and on the second neither seeded starting point
(reference recipe, max batch) is near the optimum. The gradient noise scale raybatch's prior
measures is off by a per-member factor of up to 2x either way, and its measurement is charged;
two members do *not* follow McCandlish's model, so a wrong prior is tested: on one the steps
rise again past a batch, on the other the best LR moves with the batch faster than the rule.

**Trajectories.** Every trial is evaluated where raybatch's loop evaluates, by its own
:class:`raybatch.trial.cadence.Cadence`: at training-time marks, at least once an epoch, and
near the target at most 15 % apart (:data:`raybatch.trial.cadence.NEAR_MARK_RATIO`).
Its progress at a mark is the fraction of its samples to target done, read through a curve
``p ** shape`` whose shape depends on the recipe (a recipe with a larger LR scale warms up
longer and starts slower, then catches up), with evaluation noise; the target is met when the
progress reaches 1. Schedulers that judge trials early (level capping, ASHA, Hyperband) see
these intermediate values, so a slow starter that would have won can be wrongly stopped.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import raybatch
from raybatch.memory.model import EstimateSource
from raybatch.memory.prescreen import PrescreenResult
from raybatch.timemodel.model import NoiseScale, TimeModel
from raybatch.trial.cadence import BACKSTOP_EVALS_PER_EPOCH, Cadence, time_marks
from raybatch.trial.validation import NEAR_PROGRESS

MICRO = [8, 16, 32, 64, 128, 256, 512]
ACCUMULATION = [1, 2, 4, 8, 16]
LR_MULTIPLIER = (0.25, 8.0)


def sim_space() -> raybatch.SearchSpace:
    """The coupled space all members are searched in (linear rule around batch 256)."""
    return raybatch.SearchSpace.from_dict(
        {
            "name": "simulated",
            "reference": {"batch_size": 256, "lr": 0.1, "optimizer": "sgd"},
            "rules": {"lr": "linear", "weight_decay": "none"},
            "search": {
                "micro_batch_size": MICRO,
                "accumulation_steps": ACCUMULATION,
                "lr_multiplier": {"low": LR_MULTIPLIER[0], "high": LR_MULTIPLIER[1]},
            },
            "warmup": {"samples_per_scale": 1000},
            "limits": {"max_accumulation_steps": 16},
        }
    )


@dataclass(frozen=True)
class Member:
    """One simulated workload on one simulated GPU.

    Attributes:
        name: What makes this member interesting.
        s_min: Optimizer steps to target at an infinite batch.
        b_noise: The gradient noise scale: batches well above it stop saving steps.
        best_multiplier: The LR multiplier (on the linear rule) that trains best.
        critical_scale: LR scale (lr / reference lr) above which training diverges.
        t_c: Per-micro-step fixed time (kernel launches, small-batch floor), seconds.
        t_n: Per-sample compute time, seconds.
        gamma: Pollux's overlap exponent (1: none, larger: compute and overhead overlap).
        t_opt: Optimizer-step time, seconds.
        mem_fixed: Bytes independent of the batch (weights, optimizer state, context).
        mem_per_sample: Activation bytes per sample of micro batch.
        budget: The GPU memory budget.
        oom_cost_s: What an out-of-memory trial costs (start-up and the failed step).
        startup_s: What every trial holds its device for before its clock starts (data, the
            model, the memory probe, Tune's hand-over in a warm process), as a fraction of the
            optimum's time to target: charged, never part of the time to target. 0.15, as
            measured on a real search of the bundled tabular example (12 trials on two warm
            slots: 0.1-0.3 s a trial and the gap to the next, its best training 1 s).
        eval_s: What one evaluation holds the device for, as such a fraction (charged, off
            the clock): 0.01, measured alike (0.15-0.25 s over 12-20 evaluations a trial).
        noise: Sigma of the multiplicative log-normal timing noise (0.10: the real cases'
            run-to-run spread is 4-34 %, ``bench/results/real_training.json``).
        max_time_s: A trial's time cap.
        estimate_error: Relative error of the memory estimate the pre-screen uses (+0.1:
            predicts 10% more than the truth).
        noise_scale_error: Factor on ``b_noise`` in what the prior's measurement finds.
        lr_batch_exponent: The best multiplier moves as ``(B / 256) ** exponent`` (0: the rule
            is right about how the LR scales; off the model otherwise).
        steps_rise_past: Past this effective batch the steps to target rise again, by
            ``1 + (B / steps_rise_past) ** 2`` (off the model; ``None``: never).
    """

    name: str
    s_min: float
    b_noise: float
    best_multiplier: float
    critical_scale: float
    t_c: float
    t_n: float
    gamma: float
    t_opt: float
    mem_fixed: float
    mem_per_sample: float
    budget: float
    oom_cost_s: float = 20.0
    startup_s: float = 0.15
    eval_s: float = 0.01
    noise: float = 0.10
    max_time_s: float = 600.0
    estimate_error: float = 0.0
    noise_scale_error: float = 1.0
    lr_batch_exponent: float = 0.0
    steps_rise_past: float | None = None

    def memory(self, micro: int) -> float:
        return self.mem_fixed + self.mem_per_sample * micro

    def fits(self, micro: int) -> bool:
        return self.memory(micro) <= self.budget

    def step_time(self, micro: int, accumulation: int) -> float:
        micro_step = (self.t_c**self.gamma + (self.t_n * micro) ** self.gamma) ** (1 / self.gamma)
        return accumulation * micro_step + self.t_opt

    def diverges(self, micro: int, accumulation: int, multiplier: float) -> bool:
        return (micro * accumulation / 256) * multiplier > self.critical_scale

    def steps(self, micro: int, accumulation: int, multiplier: float) -> float:
        """Optimizer steps to target, noise-free."""
        batch = micro * accumulation
        steps = self.s_min * (1 + self.b_noise / batch)
        if self.steps_rise_past is not None:
            steps *= 1 + (batch / self.steps_rise_past) ** 2
        best = self.best_multiplier * (batch / 256) ** self.lr_batch_exponent
        # No free band: every step away from the best LR costs (1.4x at 2x off, 5x at 4x).
        off = abs(math.log(multiplier / best))
        return steps * math.exp(0.85 * off**2)

    def true_time(self, micro: int, accumulation: int, multiplier: float) -> float:
        """Noise-free time to target (inf when it cannot train: OOM or divergence)."""
        if not self.fits(micro) or self.diverges(micro, accumulation, multiplier):
            return math.inf
        return self.steps(micro, accumulation, multiplier) * self.step_time(micro, accumulation)

    def epoch_samples(self) -> float:
        """The task's epoch: an eighth of the samples the reference batch (256) needs at its
        best LR -- the task trains to its target in about 8 epochs at the reference batch, as
        the bundled examples do in a few. A property of the task, not of the optimum."""
        best = self.best_multiplier * (256 / 256) ** self.lr_batch_exponent
        return self.steps(256, 1, best) * 256 / 8

    def mark_samples(self) -> float:
        """The most samples between two evaluations: an epoch, as raybatch's default sample
        marks are beside its time marks (:data:`~raybatch.trial.cadence.
        BACKSTOP_EVALS_PER_EPOCH`)."""
        return self.epoch_samples() / BACKSTOP_EVALS_PER_EPOCH

    def held_before_training(self) -> float:
        """What a trial holds its device for before its clock starts (start-up, data, the
        probe): :attr:`startup_s` x the optimum's time to target."""
        return self.startup_s * _optimum(self)[0]

    def eval_cost(self) -> float:
        """What one evaluation mark holds the device for: :attr:`eval_s` x the optimum's time
        to target."""
        return self.eval_s * _optimum(self)[0]

    def shape(self, micro: int, accumulation: int, multiplier: float) -> float:
        """The progress curve's exponent: a larger LR scale (longer warmup) starts slower."""
        scale = micro * accumulation / 256 * multiplier
        return 1.0 + 0.25 * math.log2(max(scale, 1.0))

    def run(
        self, micro: int, accumulation: int, multiplier: float, rng: random.Random,
        cap_s: float | None = None, stop: Any = None, rung_marks: Sequence[float] = (),
        level: float | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """One trial: its status, measured time to target, the device seconds it held (its
        start-up and evaluations too), its training seconds, and the marks it reported
        (``(train_s, progress)``; progress 1 is the target).

        ``stop(train_s, progress)`` is asked at each mark (a scheduler's early stop); ``True``
        ends the trial there as ``capped``. ``cap_s`` stops it once its time passes the cap.
        ``rung_marks``: training times it also evaluates at, as the searcher asks a trial to
        (:data:`~raybatch.keys.RUNG_MARKS`). ``level``: the progress it trains to instead of
        the target (a confirmation run's meeting level, :data:`~raybatch.keys.MEET_LEVEL`).
        """
        if not self.fits(micro):
            return {"status": "oom", "time": None, "cost": self.oom_cost_s, "train": 0.0,
                    "marks": []}  # fmt: skip
        if self.diverges(micro, accumulation, multiplier):
            train = 20 * self.step_time(micro, accumulation)  # stopped at once on NaN
            return {"status": "diverged", "time": None, "cost": self.held_before_training() + train,
                    "train": train, "marks": []}  # fmt: skip
        speed = rng.lognormvariate(0, self.noise)  # this run's timing noise
        # Start-up (first-step allocations, kernel selection) lands on the first marks.
        startup = rng.uniform(0, 0.05) * _optimum(self)[0]
        batch = micro * accumulation
        per_sample = self.step_time(micro, accumulation) / batch * speed
        needed = self.steps(micro, accumulation, multiplier) * batch
        shape = self.shape(micro, accumulation, multiplier)
        goal = needed if level is None else needed * min(level, 1.0) ** (1 / shape)
        limit = self.max_time_s if cap_s is None else min(cap_s, self.max_time_s)
        marks: list[tuple[float, float]] = []
        # The product's own cadence: its training-time marks, its sample marks a backstop
        # beside them (counted from the last evaluation), its near-target marks.
        cadence = Cadence(
            max(1, round(self.mark_samples())),
            self.max_time_s,
            eval_at_s=[t for t in [*time_marks(self.max_time_s), *rung_marks] if t > startup],
        )

        def held(train: float) -> float:
            return self.held_before_training() + train + len(marks) * self.eval_cost()

        while True:
            at_sample_mark = cadence.next_mark * per_sample + startup
            if cadence.eval_at_s and cadence.eval_at_s[0] < at_sample_mark:
                t = cadence.eval_at_s[0]
                samples = (t - startup) / per_sample
            else:
                samples, t = cadence.next_mark, at_sample_mark
            if t > limit:
                status = "capped" if cap_s is not None and cap_s < self.max_time_s else "censored"
                return {"status": status, "time": None, "cost": held(limit), "train": limit,
                        "marks": marks}  # fmt: skip
            if samples >= goal:
                marks.append((t, 1.0 if level is None else level))
                return {"status": "reached", "time": t, "cost": held(t), "train": t,
                        "marks": marks}  # fmt: skip
            progress = (samples / needed) ** shape * (1 + rng.gauss(0, 0.02))
            marks.append((t, min(progress, 0.999)))
            cadence.passed(int(samples))
            first = marks[0][1]
            if first >= 1 or (marks[-1][1] - first) / (1 - first) >= NEAR_PROGRESS:
                cadence.near_target()  # as the product's loop: the next 15 % later at most
            cadence.trained(t)
            if stop is not None and stop(t, marks[-1][1]):
                return {"status": "capped", "time": None, "cost": held(t), "train": t,
                        "marks": marks}  # fmt: skip

    def measured_noise_scale(self) -> float:
        """What the prior's gradient-noise measurement finds (off by ``noise_scale_error``)."""
        return self.b_noise * self.noise_scale_error

    def measure_cost_s(self, micro: int) -> float:
        """What measuring the time model adds to the trial at ``micro`` that measures it once it
        reaches the target, as :mod:`raybatch.timemodel.measure` does: 16 big batches of 8
        passes at the smallest micro batch, 3 passes (one to warm up, 2 timed) per smaller
        micro batch, 4 optimizer steps; no start-up (the trial's process has it)."""
        noise = 16 * 8 * self.step_time(MICRO[0], 1)
        timing = sum(3 * self.step_time(m, 1) for m in MICRO if m < micro)
        return noise + timing + 4 * self.t_opt

    def optimum(self) -> tuple[float, tuple[int, int, float]]:
        """The true best time over the grid (multipliers on a fine log grid) and where."""
        best = (math.inf, (0, 0, 1.0))
        low, high = (math.log(v) for v in LR_MULTIPLIER)
        multipliers = [math.exp(low + (high - low) * i / 80) for i in range(81)]
        for m in MICRO:
            for a in ACCUMULATION:
                for mult in multipliers:
                    t = self.true_time(m, a, mult)
                    if t < best[0]:
                        best = (t, (m, a, mult))
        return best

    def max_fitting_micro(self) -> int:
        return max((m for m in MICRO if self.fits(m)), default=MICRO[0])


@functools.cache
def _optimum(member: Member) -> tuple[float, tuple[int, int, float]]:
    return member.optimum()


MIB = 2**20

MEMBERS = [
    Member(  # gradient noise is small: small batches already train well; max batch wastes steps
        "small_noise_scale", s_min=3000, b_noise=96, best_multiplier=1.0, critical_scale=8,
        t_c=4e-3, t_n=6e-5, gamma=2.0, t_opt=2e-3, mem_fixed=2000 * MIB,
        mem_per_sample=40 * MIB, budget=24000 * MIB, estimate_error=0.10, noise_scale_error=2.0,
    ),
    Member(  # large noise scale but heavy activations: the best batch needs accumulation; the
        # estimate under-predicts, so the pre-screen admits micro 128, which runs out of memory
        "needs_accumulation", s_min=1500, b_noise=6000, best_multiplier=0.8, critical_scale=48,
        t_c=3e-3, t_n=2e-4, gamma=2.0, t_opt=4e-3, mem_fixed=4000 * MIB,
        mem_per_sample=300 * MIB, budget=40000 * MIB, max_time_s=8000.0, estimate_error=-0.15,
        noise_scale_error=0.5,
    ),
    Member(  # everything favours the largest batch that fits: the heuristic is right here; the
        # estimate over-predicts, so the pre-screen wrongly rejects that batch (512)
        "max_batch_optimal", s_min=2000, b_noise=40000, best_multiplier=1.0, critical_scale=64,
        t_c=2e-3, t_n=1e-5, gamma=1.5, t_opt=1e-4, mem_fixed=1000 * MIB,
        mem_per_sample=10 * MIB, budget=6500 * MIB, max_time_s=5000.0, estimate_error=0.15,
        noise_scale_error=1.5,
    ),
    Member(  # an older GPU: higher per-step floor, slower compute, 16 GiB
        "slow_hardware", s_min=2500, b_noise=150, best_multiplier=1.2, critical_scale=24,
        t_c=1.2e-2, t_n=3e-4, gamma=1.5, t_opt=6e-3, mem_fixed=3000 * MIB,
        mem_per_sample=60 * MIB, budget=24000 * MIB, max_time_s=5000.0, estimate_error=-0.10,
        noise_scale_error=0.7,
    ),
    Member(  # the scaling rule's LR is 3.5x too low everywhere (cf. a real task where it was 4x)
        "rule_lr_too_low", s_min=2000, b_noise=2000, best_multiplier=3.5, critical_scale=40,
        t_c=3e-3, t_n=4e-5, gamma=2.0, t_opt=2e-3, mem_fixed=2000 * MIB,
        mem_per_sample=30 * MIB, budget=24000 * MIB, max_time_s=5000.0, estimate_error=-0.05,
        noise_scale_error=1.3,
    ),
    Member(  # small noise scale and an LR 3x too high: neither seed (256 x 1 and max batch, both
        # at the rule's LR) is near the optimum, a small batch at a third of the LR
        "seeds_far_from_optimum", s_min=2500, b_noise=48, best_multiplier=0.33,
        critical_scale=12, t_c=1e-3, t_n=2e-5, gamma=2.0, t_opt=1e-3, mem_fixed=2000 * MIB,
        mem_per_sample=20 * MIB, budget=24000 * MIB, max_time_s=5000.0, estimate_error=0.05,
        noise_scale_error=0.5,
    ),
    Member(  # off the model: the steps rise again past a batch of about 512 (the noise scale
        # says a large batch pays; it does not), so the prior points too high
        "steps_rise_past_batch", s_min=2000, b_noise=4000, best_multiplier=1.0,
        critical_scale=40, t_c=3e-3, t_n=3e-5, gamma=2.0, t_opt=2e-3, mem_fixed=2000 * MIB,
        mem_per_sample=20 * MIB, budget=24000 * MIB, max_time_s=5000.0, estimate_error=0.08,
        steps_rise_past=512.0,
    ),
    Member(  # off the model: the best LR follows sqrt(batch) while the rule is linear, so the
        # multiplier that is best at the largest batch is 3-4x too high at small ones
        "lr_moves_with_batch", s_min=2000, b_noise=600, best_multiplier=1.0, critical_scale=40,
        t_c=3e-3, t_n=3e-5, gamma=2.0, t_opt=2e-3, mem_fixed=2000 * MIB,
        mem_per_sample=20 * MIB, budget=24000 * MIB, max_time_s=5000.0, estimate_error=-0.08,
        noise_scale_error=0.6, lr_batch_exponent=-0.5,
    ),
]  # fmt: skip


class SimulatedEstimator:
    """The pre-screen for a member: its linear memory model, off by the member's
    ``estimate_error``, against the budget."""

    def __init__(self, member: Member) -> None:
        self.member = member

    def prescreen(self, recipe: raybatch.TrialConfig, budget_bytes: int) -> PrescreenResult:
        predicted = self.predict(recipe)
        fits = predicted <= budget_bytes
        return PrescreenResult(
            recipe.micro_batch_size, fits, predicted, None, budget_bytes, EstimateSource.TRACE,
            f"simulated: {predicted} vs {budget_bytes}",
        )  # fmt: skip

    def predict(self, recipe: raybatch.TrialConfig) -> int:
        truth = self.member.memory(recipe.micro_batch_size)
        return int(truth * (1 + self.member.estimate_error))

    def measured(self, recipe: raybatch.TrialConfig, budget_bytes: int) -> None:
        """No device to take real steps on: the estimate alone decides (a CPU search)."""
        return None

    def fits(self, recipe: raybatch.TrialConfig, budget_bytes: int, margin: float = 0.0) -> bool:
        return self.predict(recipe) <= budget_bytes * (1 + margin)


def simulated_time_model(member: Member) -> TimeModel:
    """The prior raybatch would measure on this member: the noise scale off by the member's
    ``noise_scale_error``, step times as the simulated GPU runs them."""
    b = member.measured_noise_scale()
    noise = NoiseScale(b, b, b, MICRO[0], 8 * MICRO[0], 32)
    micro_s = {m: member.step_time(m, 1) - member.t_opt for m in MICRO if member.fits(m)}
    return TimeModel(noise, micro_s, member.t_opt)
