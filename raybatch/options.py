"""How a search runs: everything but the workload, the space and the target."""

from __future__ import annotations

from dataclasses import dataclass

from raybatch.status import PAR_FACTOR


@dataclass(frozen=True)
class SearchOptions:
    """How a search runs (everything but the workload, space and target).

    Attributes:
        trials: Trials to launch (pre-screened configs are extra and cost nothing).
        max_time_s: Time cap per trial; censored and capped trials score 10x this.
        memory_budget: Per-GPU budget for the pre-screen (default: NVML on a GPU machine;
            none on a CPU machine, where trials run on CPUs).
        gpus_per_trial: ``"auto"`` (a fraction from the estimate), a number, or 0.
        cpus_per_trial: CPUs each trial holds.
        max_concurrent: Trials at once (default: as many as resources allow).
        address: Ray cluster to connect to (default: start a local Ray).
        seed: Sampler seed; trial seeds in the search are all this (comparable trials).
        prescreen: Screen suggestions for memory before launching them.
        capping: Stop trials that cannot beat the incumbent (slack x best time).
        slack: The capping slack.
        confirm_top: Candidates re-run after the search (one at a time when trials run on
            CPUs, which contend for memory bandwidth; side by side on GPUs).
        confirm_seeds: Fresh seeds per candidate.
        eval_every_samples: Sample-mark spacing (default: about a quarter epoch).
        max_failures: Ray retries of a trial whose worker died.
        hang_grace_s: Seconds past ``max_time_s`` after which a trial still running counts as
            hung (stuck in a step) and is stopped by the driver as ``censored``; it covers
            start-up, the probe and a last evaluation, which the trial's clock excludes.
    """

    trials: int = 20
    max_time_s: float = 60.0
    memory_budget: str | int | None = None
    gpus_per_trial: str | float | None = None
    cpus_per_trial: float = 1.0
    max_concurrent: int | None = None
    address: str | None = None
    seed: int = 0
    prescreen: bool = True
    capping: bool = True
    slack: float = 1.2
    confirm_top: int = 3
    confirm_seeds: int = 3
    eval_every_samples: int | None = None
    max_failures: int = 2
    hang_grace_s: float = 300.0

    @property
    def penalty(self) -> float:
        return PAR_FACTOR * self.max_time_s
