"""The search end to end, and the run directory that holds everything it produced.

``raybatch.search(...)`` (and ``raybatch search`` on the CLI) runs, in one run directory:

1. the search: Ray Tune with :class:`~raybatch.searcher.RaybatchSearcher` (Optuna TPE,
   pre-screened for memory, seeded with the reference recipe and the max-batch baseline) and
   :class:`~raybatch.scheduler.CappingScheduler`, over :func:`raybatch.trainable` trials;
2. confirmation: the ``confirm_top`` fastest candidates re-run with fresh seeds; the winner is
   the one with the lowest median time to target among those that reached it every time;
3. the record: ``trials.csv``, ``best_config.yaml``/``.json`` and the report.

Layout of a run directory::

    run.json            workload reference, target and options (what resume needs)
    space.yaml          the space used, as validated
    optuna.db           the Optuna study (optuna-dashboard sqlite:///RUN_DIR/optuna.db)
    tune/search/        Ray Tune's experiment (storage), resumable
    tune/confirm/       the confirmation runs
    trials.csv          one row per trial and per pre-screened config, with a status
    search.log          the traceback of every trial that failed
    best_config.yaml    the winner with provenance (also .json)
    report.html         the report, beside its PNGs
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raybatch import keys
from raybatch.budget import parse_size
from raybatch.cluster import init_ray
from raybatch.config import TrialConfig
from raybatch.errors import (
    Issue,
    RaybatchError,
    RunDirError,
    SearchInterrupted,
    TrialsFailedError,
)
from raybatch.export import BestConfig, write_best
from raybatch.metric import Target, resolve_target
from raybatch.space import SearchSpace
from raybatch.status import PAR_FACTOR, TrialStatus
from raybatch.workload import Workload, absolute_reference, load_workload

RUN_FILE = "run.json"
SPACE_FILE = "space.yaml"
OPTUNA_DB = "optuna.db"
TRIALS_CSV = "trials.csv"
LOG_FILE = "search.log"
STUDY_NAME = "raybatch"


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


@dataclass
class SearchResult:
    """What a finished search leaves: its directory, its rows and the winner (if any)."""

    run_dir: Path
    rows: list[dict[str, Any]]
    best: BestConfig | None
    baseline: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------- run directory


def _write_run_files(
    run_dir: Path,
    workload_ref: str,
    space: SearchSpace,
    target: Target,
    options: SearchOptions,
) -> None:
    """Create the run directory and its first files, or fail before any trial starts."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / SPACE_FILE).write_text(
            yaml.safe_dump(space.model_dump(mode="json"), sort_keys=False)
        )
        (run_dir / RUN_FILE).write_text(
            json.dumps(
                {
                    "workload": workload_ref,
                    "target": dataclasses.asdict(target),
                    "options": dataclasses.asdict(options),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                },
                indent=2,
            )
            + "\n"
        )
    except OSError as exc:  # read-only, disk full, a file where a directory should be...
        raise RunDirError(
            [Issue("(directory)", f"cannot write the run: {exc.strerror or exc}")], str(run_dir)
        ) from None


def read_run(run_dir: str | Path) -> tuple[Path, str, SearchSpace, Target, SearchOptions]:
    """The workload reference, space, target and options of an existing run directory.

    Raises:
        RunDirError: The directory is not a raybatch run (names the missing file).
    """
    path = Path(run_dir)
    for name in (RUN_FILE, SPACE_FILE):
        if not (path / name).is_file():
            raise RunDirError([Issue(name, "missing: not a raybatch run directory")], str(path))
    run = json.loads((path / RUN_FILE).read_text())
    space = SearchSpace.from_yaml(path / SPACE_FILE)
    return path, run["workload"], space, Target(**run["target"]), SearchOptions(**run["options"])


# ---------------------------------------------------------------------- seeds of the study


def _searched(space: SearchSpace, knobs: dict[str, Any]) -> dict[str, Any]:
    """Only the knobs Optuna samples (single-choice knobs are constants, not parameters)."""
    s = space.search
    out = {}
    for name, choices in (
        (keys.MICRO_BATCH_SIZE, s.micro_batch_size),
        (keys.ACCUMULATION_STEPS, s.accumulation_steps),
        (keys.WORLD_SIZE, s.world_size),
    ):
        if len(choices) > 1:
            out[name] = knobs[name]
    for name, rng in (
        (keys.LR_MULTIPLIER, s.lr_multiplier),
        (keys.WEIGHT_DECAY_MULTIPLIER, s.weight_decay_multiplier),
    ):
        if rng is not None and rng.low < rng.high:
            out[name] = min(max(knobs.get(name, 1.0), rng.low), rng.high)
    return out


def reference_point(space: SearchSpace) -> dict[str, Any] | None:
    """The reference recipe as raw knobs of the space (micro x accumulation = its batch)."""
    s = space.search
    batch = space.reference.batch_size
    for micro in sorted(s.micro_batch_size, reverse=True):
        if batch % micro == 0 and batch // micro in s.accumulation_steps and 1 in s.world_size:
            return {keys.MICRO_BATCH_SIZE: micro, keys.ACCUMULATION_STEPS: batch // micro,
                    keys.WORLD_SIZE: 1}  # fmt: skip
    return None


def _budget_check(estimator: Any, budget: int | None) -> Callable[[TrialConfig], bool]:
    """Whether a recipe's predicted peak fits the budget (everything fits without one)."""

    def fits(recipe: TrialConfig) -> bool:
        return estimator is None or budget is None or estimator.predict(recipe) <= budget

    return fits


def max_batch_point(space: SearchSpace, fits: Callable[[TrialConfig], bool]) -> dict[str, Any]:
    """The "largest batch that fits" baseline: biggest fitting micro batch, accumulation 1."""
    s = space.search
    world = 1 if 1 in s.world_size else min(s.world_size)
    accumulation = 1 if 1 in s.accumulation_steps else min(s.accumulation_steps)
    for micro in sorted(s.micro_batch_size, reverse=True):
        knobs = {keys.MICRO_BATCH_SIZE: micro, keys.ACCUMULATION_STEPS: accumulation,
                 keys.WORLD_SIZE: world}  # fmt: skip
        if fits(space.derive(**knobs)):
            return knobs
    return {keys.MICRO_BATCH_SIZE: min(s.micro_batch_size), keys.ACCUMULATION_STEPS: accumulation,
            keys.WORLD_SIZE: world}  # fmt: skip


# ---------------------------------------------------------------------- the search


def _machine_has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def search(
    workload: Workload,
    space: SearchSpace,
    target: Target | float | str,
    run_dir: str | Path,
    options: SearchOptions | None = None,
    workload_ref: str | None = None,
    verbose: int = 1,
) -> SearchResult:
    """Find the recipe that reaches ``target`` fastest; everything lands in ``run_dir``.

    Args:
        workload: The workload to train.
        space: The coupled batch-size space.
        target: The validation metric to reach: a :class:`Target`, text (``loss<=0.35``) or
            a number (the workload's first metric, in its direction); checked against the
            workload's :attr:`~raybatch.Workload.metrics` before anything starts.
        run_dir: Where the run lives (created).
        options: See :class:`SearchOptions`.
        workload_ref: How to import the workload again (``path.py:NAME``) for ``resume``.
        verbose: Ray Tune's verbosity (1: the live progress table).
    """
    options = options or SearchOptions()
    target = resolve_target(target, workload.metrics)
    path = Path(run_dir)
    if (path / RUN_FILE).exists():
        raise RunDirError(
            [Issue(RUN_FILE, "exists: this directory holds a run; use resume, or another dir")],
            str(path),
        )
    # A cluster that does not answer fails in seconds, before the run directory is written.
    if options.address is not None:
        init_ray(options.address)
    ref = absolute_reference(workload_ref) if workload_ref else f"<object {workload.name}>"
    _write_run_files(path, ref, space, target, options)
    return _execute(path, workload, space, target, options, resume=False, verbose=verbose)


def resume(run_dir: str | Path, verbose: int = 1) -> SearchResult:
    """Continue an interrupted search: completed trials are kept, never re-run.

    Raises:
        RunDirError: Not a run directory, or its search never started.
    """
    path, ref, space, target, options = read_run(run_dir)
    workload = load_workload(ref)
    return _execute(path, workload, space, target, options, resume=True, verbose=verbose)


def _execute(
    path: Path,
    workload: Workload,
    space: SearchSpace,
    target: Target,
    options: SearchOptions,
    resume: bool,
    verbose: int,
) -> SearchResult:
    from ray import tune

    from raybatch.budget import resolve_budget
    from raybatch.failfast import FailFast, ray_errors_to
    from raybatch.memory import MemoryEstimator
    from raybatch.resources import with_resources
    from raybatch.scheduler import CappingScheduler
    from raybatch.searcher import RaybatchSearcher
    from raybatch.trial import trainable

    # Save Ray Tune's experiment state at every step, not every few minutes: a driver killed
    # between two saves would otherwise forget trials that had finished, and re-run them.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")
    # A hung trial that the scheduler stops cannot answer the stop request; Ray Tune kills
    # its actor after this many seconds (default 600), and only then frees its resources.
    os.environ.setdefault("TUNE_FORCE_TRIAL_CLEANUP_S", "30")
    # Tracebacks of failed trials go to the run's log (FailFast writes them), not the terminal.
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
    # ...and a trial stopped before its first report is not worth a warning with its path.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    init_ray(options.address)
    cuda = _machine_has_cuda()
    gpus = options.gpus_per_trial if options.gpus_per_trial is not None else ("auto" if cuda else 0)
    budget: int | None = None
    if options.memory_budget is not None or cuda or gpus not in (0, 0.0):
        budget = resolve_budget(options.memory_budget).bytes
    estimator = None
    notes: list[str] = []
    micro = space.search.micro_batch_size
    if budget is not None:
        estimator = MemoryEstimator(
            workload, space.reference_config(), cuda=True, anchors=(min(micro), max(micro))
        )
    else:
        notes.append("no GPU memory budget on this machine: suggestions were not pre-screened")

    baseline = max_batch_point(space, _budget_check(estimator, budget))
    reference = reference_point(space)
    seeds = [_searched(space, p) for p in (reference, baseline) if p is not None]
    searcher = RaybatchSearcher(
        space,
        storage_url=f"sqlite:///{(path / OPTUNA_DB).resolve()}",
        study_name=STUDY_NAME,
        penalty=options.penalty,
        estimator=estimator if options.prescreen else None,
        budget_bytes=budget,
        points_to_evaluate=seeds,
        seed=options.seed,
    )
    settings = {
        "max_time_s": options.max_time_s,
        "eval_every_samples": options.eval_every_samples,
        "memory_budget": budget if not cuda else None,
        "seed": options.seed,
    }
    fn = trainable(workload, space, target, **settings)
    resourced = with_resources(fn, workload, space, gpus, options.cpus_per_trial, budget)
    storage = str((path / "tune").resolve())
    experiment = Path(storage) / "search"
    fail_fast = FailFast(path / LOG_FILE, healthy=_healthy_trials(path) if resume else 0)
    if resume:
        if not tune.Tuner.can_restore(str(experiment)):
            raise RunDirError([Issue("tune/search", "no Ray Tune experiment to resume")], str(path))
        tuner = tune.Tuner.restore(
            str(experiment), trainable=resourced, resume_unfinished=True, resume_errored=True
        )
    else:
        tuner = tune.Tuner(
            resourced,
            tune_config=tune.TuneConfig(
                search_alg=searcher,
                scheduler=CappingScheduler(
                    options.slack,
                    enabled=options.capping,
                    hang_after_s=options.max_time_s + options.hang_grace_s,
                ),
                num_samples=options.trials,
                max_concurrent_trials=options.max_concurrent,
            ),
            run_config=tune.RunConfig(
                storage_path=storage,
                name="search",
                failure_config=tune.FailureConfig(max_failures=options.max_failures),
                verbose=verbose,
                callbacks=[fail_fast],
                stop=fail_fast,
            ),
        )
    with ray_errors_to(path / LOG_FILE):
        results = tuner.fit()
    if fail_fast.tripped is not None:
        raise TrialsFailedError(fail_fast.summary())
    finished = results.num_terminated + results.num_errors
    if finished < options.trials:
        raise SearchInterrupted(
            f"search interrupted after {finished} of {options.trials} trials; the state is saved:"
            f" continue with `raybatch resume {path}`"
        )
    rows = _search_rows(space, results, options.penalty)
    closed = _reconcile_study(path, {r["trial_id"] for r in rows})
    if closed:
        notes.append(
            f"{closed} Optuna trial(s) left running by an interruption were closed as failed"
        )
    rows += _prescreened_rows(path)
    candidates = _candidates(rows, options.confirm_top)
    # The baseline and the reference are re-run beside the candidates, under the same
    # conditions, so the report compares like with like. One that was capped is re-run too:
    # capping stopped it for being slower than the incumbent, which is exactly the comparison
    # the verdict states, so it is measured to the end (uncapped) rather than assumed. One that
    # ran out of memory, hung, diverged or was censored at the time cap would only fail again
    # at full cost; the report shows its search status.
    rerun = (TrialStatus.REACHED.value, TrialStatus.CAPPED.value)
    compared = candidates + [
        r
        for r in _comparison_rows(rows, baseline, reference)
        if not _same_knobs(r, candidates) and r[keys.STATUS] in rerun
    ]
    # CPU trials running side by side share memory bandwidth and caches, which hurts large
    # batches more than small ones (on this 2-core machine it reordered digits' recipes); the
    # confirmation is a measurement, so on CPUs it runs one trial at a time.
    alone = 1 if gpus in (0, 0.0) else options.max_concurrent
    confirm_rows = _confirm(path, resourced, space, compared, options, verbose, alone)
    rows += confirm_rows
    best = _choose_winner(space, target, candidates, confirm_rows, rows, options)
    write_trials_csv(path / TRIALS_CSV, rows)
    if best is not None:
        write_best(path, best)
    else:
        notes.append("no candidate reached the target in every confirmation run")
    result = SearchResult(path, rows, best, baseline, reference, notes)
    from raybatch.report import write_report

    write_report(result, space, target, estimator, budget)
    return result


# ---------------------------------------------------------------------- rows


def _row(space: SearchSpace, config: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    recipe = space.derive_from(config).to_dict()
    recipe.pop(keys.OPTIMIZER_KWARGS, None)
    row = {**recipe}
    for key in (
        keys.STATUS, keys.TIME_TO_TARGET_S, keys.SAMPLES_TO_TARGET, keys.ELAPSED_S, keys.METRIC,
        keys.PEAK_MEMORY_BYTES, keys.THROUGHPUT, keys.DATA_WAIT_FRACTION, keys.OBJECTIVE,
        keys.REASON,
    ):  # fmt: skip
        row[key] = metrics.get(key)
    return row


def _search_rows(space: SearchSpace, results: Any, penalty: float) -> list[dict[str, Any]]:
    from raybatch.searcher import final_status

    rows = []
    for result in results:
        metrics = dict(result.metrics or {})
        status, value = final_status(metrics, result.error is not None, penalty)
        if status is TrialStatus.CAPPED:
            metrics[keys.REASON] = (
                f"capped at {metrics.get(keys.ELAPSED_S, 0):.3f} s: slower than the best time"
                " to target x slack"
            )
        if result.error is not None:
            metrics[keys.REASON] = f"{type(result.error).__name__}: {result.error}"
        metrics[keys.STATUS], metrics[keys.OBJECTIVE] = status.value, value
        row = _row(space, result.config, metrics)
        row["trial_id"] = metrics.get("trial_id", "")
        row["phase"] = "search"
        rows.append(row)
    return rows


def _prescreened_rows(path: Path) -> list[dict[str, Any]]:
    """Pre-screened-out configs, read back from the study (so they survive a resume)."""
    import optuna

    from raybatch.searcher import PRESCREENED_OUT, STATUS_ATTR

    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{path / OPTUNA_DB}")
    space = SearchSpace.from_yaml(path / SPACE_FILE)
    rows = []
    for t in study.trials:
        if t.user_attrs.get(STATUS_ATTR) != PRESCREENED_OUT:
            continue
        knobs = {**space.reference_config().to_dict(), **t.params}
        row = _row(
            space, knobs, {keys.STATUS: PRESCREENED_OUT, keys.REASON: t.user_attrs.get("reason")}
        )
        row[keys.PEAK_MEMORY_BYTES] = t.user_attrs.get("predicted_bytes")
        row["trial_id"] = f"optuna_{t.number}"
        row["phase"] = "prescreen"
        rows.append(row)
    return rows


def _healthy_trials(path: Path) -> int:
    """Trials of the study that ended in a status other than ``error`` (before a resume)."""
    import optuna

    from raybatch.searcher import STATUS_ATTR

    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{path / OPTUNA_DB}")
    ended = {s.value for s in TrialStatus if s.terminal and s is not TrialStatus.ERROR}
    return sum(
        1
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.user_attrs.get(STATUS_ATTR) in ended
    )


def _reconcile_study(path: Path, tune_trial_ids: set[str]) -> int:
    """Close study trials still RUNNING whose Tune trial is not among the finished ones."""
    import optuna

    from raybatch.searcher import STATUS_ATTR

    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{path / OPTUNA_DB}")
    closed = 0
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if t.user_attrs.get("tune_trial_id") not in tune_trial_ids:
            trial = optuna.trial.Trial(study, t._trial_id)
            trial.set_user_attr(STATUS_ATTR, "lost_at_interruption")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            closed += 1
    return closed


# ---------------------------------------------------------------------- confirmation


def _knobs(row: dict[str, Any]) -> tuple[float, ...]:
    return tuple(float(row[k]) for k in keys.RAW_KNOBS)


def _same_knobs(row: dict[str, Any], others: list[dict[str, Any]]) -> bool:
    return any(_knobs(row) == _knobs(o) for o in others)


def _comparison_rows(
    rows: list[dict[str, Any]], *points: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The search rows of the baseline and reference points (LR and WD multipliers 1)."""
    out: list[dict[str, Any]] = []
    for point in points:
        if point is None:
            continue
        for r in rows:
            if (
                r["phase"] == "search"
                and all(int(r[k]) == int(v) for k, v in point.items())
                and float(r[keys.LR_MULTIPLIER]) == 1.0
                and float(r[keys.WEIGHT_DECAY_MULTIPLIER]) == 1.0
                and not _same_knobs(r, out)
            ):
                out.append(r)
                break
    return out


def _candidates(rows: list[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    reached = [r for r in rows if r[keys.STATUS] == TrialStatus.REACHED.value]
    reached.sort(key=lambda r: r[keys.TIME_TO_TARGET_S])
    out, seen = [], set()
    for r in reached:
        knobs = tuple(r[k] for k in keys.RAW_KNOBS)
        if knobs not in seen:
            seen.add(knobs)
            out.append(r)
        if len(out) == top:
            break
    return out


class _Pick:
    """``tune.sample_from`` callable: one knob of the candidate a confirmation trial runs."""

    def __init__(self, candidates: list[dict[str, Any]], key: str) -> None:
        self.values = [c[key] for c in candidates]
        self.key = key

    def __call__(self, config: dict[str, Any]) -> Any:
        return self.values[config["candidate"]]


def _confirm(
    path: Path,
    resourced: Any,
    space: SearchSpace,
    candidates: list[dict[str, Any]],
    options: SearchOptions,
    verbose: int,
    max_concurrent: int | None,
) -> list[dict[str, Any]]:
    """Re-run each candidate with fresh seeds (no capping: every run must finish honestly)."""
    if not candidates or options.confirm_seeds <= 0:
        return []
    from ray import tune

    from raybatch.scheduler import CappingScheduler

    param_space: dict[str, Any] = {
        "candidate": tune.grid_search(list(range(len(candidates)))),
        keys.SEED: tune.grid_search([options.seed + 1 + i for i in range(options.confirm_seeds)]),
    }
    for key in keys.RAW_KNOBS:
        param_space[key] = tune.sample_from(_Pick(candidates, key))
    storage = str((path / "tune").resolve())
    tuner = tune.Tuner(
        resourced,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            max_concurrent_trials=max_concurrent,
            scheduler=CappingScheduler(
                enabled=False, hang_after_s=options.max_time_s + options.hang_grace_s
            ),
        ),
        run_config=tune.RunConfig(
            storage_path=storage,
            name=f"confirm-{time.strftime('%Y%m%d-%H%M%S')}",
            verbose=min(verbose, 1),
        ),
    )
    rows = []
    for result in list(tuner.fit()):  # type: ignore[call-overload]
        metrics = dict(result.metrics or {})
        row = _row(space, result.config, metrics)
        row["trial_id"] = metrics.get("trial_id", "")
        row["phase"] = "confirmation"
        row["candidate"] = result.config["candidate"]
        row[keys.SEED] = result.config[keys.SEED]
        rows.append(row)
    return rows


def _versions() -> dict[str, str]:
    import optuna
    import ray
    import torch

    import raybatch

    return {
        "raybatch": raybatch.__version__,
        "torch": str(torch.__version__),
        "ray": ray.__version__,
        "optuna": optuna.__version__,
        "python": platform.python_version(),
    }


def _device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return str(torch.cuda.get_device_name(0))
    return f"CPU ({platform.machine()})"


def _choose_winner(
    space: SearchSpace,
    target: Target,
    candidates: list[dict[str, Any]],
    confirm_rows: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    options: SearchOptions,
) -> BestConfig | None:
    """Lowest median time among candidates that reached the target in every confirmation run."""
    scored = []
    for index, candidate in enumerate(candidates):
        runs = [r for r in confirm_rows if r.get("candidate") == index]
        times = [r[keys.TIME_TO_TARGET_S] for r in runs if r[keys.STATUS] == "reached"]
        if not options.confirm_seeds:
            times, runs = [candidate[keys.TIME_TO_TARGET_S]], [candidate]
        if runs and len(times) == len(runs):
            scored.append((statistics.median(times), index, times, runs))
    if not scored:
        return None
    median, index, times, runs = min(scored)
    candidate = candidates[index]
    recipe = space.derive_from(candidate)
    peaks = [r[keys.PEAK_MEMORY_BYTES] for r in runs if r.get(keys.PEAK_MEMORY_BYTES)]
    provenance = {
        "median_time_to_target_s": median,
        "time_to_target_s_runs": times,
        "spread_s": max(times) - min(times),
        "samples_to_target": candidate[keys.SAMPLES_TO_TARGET],
        "peak_memory_bytes": max(peaks) if peaks else None,
        "device": _device_name(),
        "versions": _versions(),
        "trial_id": candidate["trial_id"],
        "space": space.name,
        "target": str(target),
        "search_trials": sum(1 for r in rows if r["phase"] == "search"),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    return BestConfig(recipe, provenance)


CSV_COLUMNS = (
    "phase", "trial_id", keys.STATUS, *keys.RAW_KNOBS, keys.EFFECTIVE_BATCH_SIZE, keys.LR,
    keys.WEIGHT_DECAY, keys.WARMUP_STEPS, keys.LR_SCALE, keys.TIME_TO_TARGET_S,
    keys.SAMPLES_TO_TARGET, keys.ELAPSED_S, keys.METRIC, keys.PEAK_MEMORY_BYTES, keys.THROUGHPUT,
    keys.DATA_WAIT_FRACTION, keys.OBJECTIVE, "candidate", keys.SEED, keys.REASON,
)  # fmt: skip


def write_trials_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k) for k in CSV_COLUMNS})


def read_trials_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


TEXT_COLUMNS = frozenset({"phase", "trial_id", keys.STATUS, keys.REASON})
"""Never numbers, even when they look like one (a Tune trial id such as ``00012e45``)."""


def _typed(row: dict[str, str]) -> dict[str, Any]:
    """A ``trials.csv`` row with its numbers as numbers again (empty cells become None)."""
    out: dict[str, Any] = {}
    for key, text in row.items():
        if text == "":
            out[key] = None
            continue
        if key in TEXT_COLUMNS:
            out[key] = text
            continue
        try:
            number = float(text)
        except ValueError:
            out[key] = text
            continue
        out[key] = int(number) if number.is_integer() and "." not in text else number
    return out


def _stored_rows(path: Path) -> list[dict[str, Any]]:
    """The typed rows of a finished run's ``trials.csv``.

    Raises:
        RunDirError: The search has not finished (no trials.csv).
    """
    if not (path / TRIALS_CSV).is_file():
        raise RunDirError([Issue(TRIALS_CSV, "missing: the search has not finished")], str(path))
    return [_typed(r) for r in read_trials_csv(path / TRIALS_CSV)]


def analyze_run(run_dir: str | Path) -> BestConfig | None:
    """The winner a finished run's stored trials give, chosen again from ``trials.csv`` alone.

    The same rule as at the end of the search (fastest candidates of the search phase; lowest
    median over their confirmation runs among those that reached the target every time), so
    ``best_config.yaml`` can be audited — and after a resume, checked — against the record.
    Only the provenance's ``created`` time differs from the file the search wrote.

    Raises:
        RunDirError: Not a run directory, or its search has not finished (no trials.csv).
    """
    path, _, space, target, options = read_run(run_dir)
    rows = _stored_rows(path)
    candidates = _candidates([r for r in rows if r["phase"] == "search"], options.confirm_top)
    confirm_rows = [r for r in rows if r["phase"] == "confirmation"]
    return _choose_winner(space, target, candidates, confirm_rows, rows, options)


def rebuild_report(run_dir: str | Path) -> Path:
    """Write the report of a finished run again, from its files alone.

    Raises:
        RunDirError: Not a run directory, or its search has not finished (no trials.csv).
    """
    from raybatch.export import BEST_YAML, load_best
    from raybatch.memory import MemoryEstimator
    from raybatch.report import write_report

    path, ref, space, target, options = read_run(run_dir)
    rows = _stored_rows(path)
    best = load_best(path) if (path / BEST_YAML).is_file() else None
    estimator, budget = None, options.memory_budget
    if budget is not None:
        try:
            workload = load_workload(ref)
        except RaybatchError:
            workload = None  # the report is still written, without the memory plot
        if workload is not None:
            micro = space.search.micro_batch_size
            estimator = MemoryEstimator(
                workload, space.reference_config(), anchors=(min(micro), max(micro))
            )
    budget_bytes = None if budget is None else parse_size(budget)
    baseline = max_batch_point(space, _budget_check(estimator, budget_bytes))
    result = SearchResult(path, rows, best, baseline, reference_point(space))
    return write_report(result, space, target, estimator, budget_bytes)
