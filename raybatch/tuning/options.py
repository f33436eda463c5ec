"""How a search runs: everything but the workload, the space and the target."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from raybatch.cluster.placement import GPUS_PER_TRIAL_ALLOWED, gpus_per_trial_ok
from raybatch.errors import Issue, OptionError
from raybatch.memory.sizes import parse_size
from raybatch.status import HANG_GRACE_S, INDIFFERENCE_ZONE


@dataclass(frozen=True)
class SearchOptions:
    """How a search runs (everything but the workload, space and target).

    Attributes:
        trials: Trials to launch (pre-screened configs are extra and cost nothing).
        max_time_s: Cap on each trial's training time (evaluation excluded); censored and
            capped trials score 10x this (:attr:`TrialSettings.penalty
            <raybatch.trial.settings.TrialSettings.penalty>`, as the trials' settings hold it).
        max_samples: Cap on each trial's training samples (``None``: none): a trial past it is
            censored, as at the time cap. Unlike the time cap, it does not depend on how fast
            the machine is (a busy machine reaches the time cap sooner in samples).
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
        zone: The indifference zone at the rungs (:mod:`raybatch.tuning.rungs`): at each rung
            a trial goes on while it is at most ``1 + zone`` times slower than the best curve
            to its level, or in the top 1/3 there; ``None``: no rungs, only the final time
            caps. It is the regret the search accepts, and the verdict names it.
        pause: A trial behind at a rung below the top is paused, not stopped, and goes on
            when the rung passes it later (:mod:`raybatch.tuning.promotion`); ``False``: stopped.
        prior: Measure the time model (gradient noise scale, step times) inside the first
            trial that reaches the target, and let it choose the batches the plan tries after
            the largest batch's LR sweep.
        probe_margin: On GPUs, launch a config the memory estimate puts over the budget by at
            most this fraction, for the trial's real probe step to decide.
        confirm_top: The search's best recipes that may enter the confirmation's race: the
            two best race on paired seeds; the next enters when one misses the target (0: no
            confirmation). The only recipe that reached stands on its search run (with 1, the
            one candidate is run once more). See :mod:`raybatch.tuning.confirmation`.
        confirm_seeds: At most this many fresh seeds (race rounds: the two run side by side
            where the search had two slots, the later capped at ``slack`` x the first to
            reach; one at a time, the leader first, on one); no round at all where the
            search's runs show one ahead by more than the indifference zone, and two agreeing
            pairs (the search's run and one round) or a pair within the zone end it sooner.
        eval_every_samples: Sample-mark spacing, a fixed grid (default: training-time marks,
            and at least one evaluation an epoch).
        max_failures: Ray retries of a trial whose worker died.
        gpu_model: On a cluster that mixes GPU models, the one every trial runs on (Ray's
            ``accelerator_type``, e.g. ``A100``): times to target measured on different GPUs
            cannot be ranked against each other, so a mixed cluster without it is refused.
        hang_grace_s: Seconds past ``max_time_s`` without a report after which a running
            trial counts as hung (stuck in a step) and is stopped by the driver as
            ``censored``; it covers an evaluation and its report, which the trial's clock
            excludes. Before its first report a trial has
            :data:`~raybatch.status.HANG_STARTUP_S` more (its start-up: model, data, probe).

    Example::

        import raybatch
        from raybatch.examples.digits import workload

        options = raybatch.SearchOptions(trials=30, max_time_s=120, seed=1)
        raybatch.search(workload, "digits_cnn_sgd", "accuracy>=0.97", "runs/digits", options)
        best = raybatch.load_best("runs/digits")
    """

    trials: int = 20
    max_time_s: float = 60.0
    max_samples: int | None = None
    memory_budget: str | int | None = None
    gpus_per_trial: str | float | None = None
    cpus_per_trial: float = 1.0
    max_concurrent: int | None = None
    address: str | None = None
    seed: int = 0
    prescreen: bool = True
    capping: bool = True
    slack: float = 1.2
    zone: float | None = INDIFFERENCE_ZONE
    pause: bool = True
    prior: bool = True
    probe_margin: float = 0.2
    confirm_top: int = 2
    confirm_seeds: int = 1
    eval_every_samples: int | None = None
    max_failures: int = 2
    hang_grace_s: float = HANG_GRACE_S
    gpu_model: str | None = None

    def __post_init__(self) -> None:
        """Refuse values no search can run with, every one at once, naming the field.

        Here and not in the CLI, so that ``raybatch.search(..., SearchOptions(trials=0))``
        fails before Ray starts exactly as ``raybatch search --trials 0`` does.
        """
        issues = [Issue(name, message) for name, message in _problems(self)]
        if issues:
            raise OptionError(issues)

    @property
    def confirms(self) -> bool:
        """Whether the search ends with a confirmation (then its runs judge the winner)."""
        return self.confirm_top > 0 and self.confirm_seeds > 0

    @property
    def memory_budget_bytes(self) -> int | None:
        """The explicit memory budget in bytes (``None``: none given)."""
        return None if self.memory_budget is None else parse_size(self.memory_budget)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def _problems(o: SearchOptions) -> list[tuple[str, str]]:
    """``(field, what is wrong)`` for each invalid option."""
    found: list[tuple[str, str]] = []

    def need(name: str, ok: bool, allowed: str) -> None:
        if not ok:
            found.append((name, f"must be {allowed}, got {getattr(o, name)!r}"))

    need("trials", _is_int(o.trials) and o.trials >= 1, "an integer >= 1")
    need("max_time_s", _is_number(o.max_time_s) and o.max_time_s > 0, "a positive number")
    need("max_samples", _none_or(o.max_samples, 1), "an integer >= 1 or None")
    gpus = o.gpus_per_trial
    need("gpus_per_trial", gpus is None or gpus_per_trial_ok(gpus), GPUS_PER_TRIAL_ALLOWED)
    need("cpus_per_trial", _is_number(o.cpus_per_trial) and o.cpus_per_trial > 0, "> 0")
    need("max_concurrent", _none_or(o.max_concurrent, 1), "an integer >= 1 or None")
    need("slack", _is_number(o.slack) and o.slack >= 1, "a number >= 1")
    zone = o.zone
    need("zone", zone is None or (_is_number(zone) and zone >= 0), "None or >= 0")
    margin = o.probe_margin
    need("probe_margin", _is_number(margin) and 0 <= margin <= 1, "a number in [0, 1]")
    need("confirm_top", _is_int(o.confirm_top) and o.confirm_top >= 0, "an integer >= 0")
    need("confirm_seeds", _is_int(o.confirm_seeds) and o.confirm_seeds >= 0, "an integer >= 0")
    need("eval_every_samples", _none_or(o.eval_every_samples, 1), "an integer >= 1 or None")
    need(
        "max_failures",
        _is_int(o.max_failures) and o.max_failures >= -1,
        "an integer >= -1 (-1: retry forever, as in Ray)",
    )
    need("hang_grace_s", _is_number(o.hang_grace_s) and o.hang_grace_s > 0, "a positive number")
    model = o.gpu_model
    need("gpu_model", model is None or (isinstance(model, str) and model.strip() != ""),
         "None or a GPU model name such as 'A100'")  # fmt: skip
    if o.memory_budget is not None:
        try:
            parse_size(o.memory_budget)
        except OptionError as exc:
            found.extend((i.field, i.message) for i in exc.issues)
    return found


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _none_or(value: Any, least: int) -> bool:
    return value is None or (_is_int(value) and value >= least)
