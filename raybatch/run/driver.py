"""The search end to end, and the run directory that holds everything it produced.

``raybatch.search(...)`` (and ``raybatch search``) runs, in one run directory: the search (Ray
Tune with :class:`~raybatch.tuning.searcher.RaybatchSearcher`: the plan,
:mod:`raybatch.tuning.plan`, then Optuna TPE, pre-screened for memory; and
:class:`~raybatch.tuning.scheduler.CappingScheduler`, which pauses or stops a trial behind at a
rung, over :func:`raybatch.trainable` trials); the confirmation, a race of the two best recipes
on paired seeds (:mod:`raybatch.tuning.confirmation`); and the record (``trials.csv``, the
winner with the search's cost, the report: :mod:`raybatch.run.rundir`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raybatch.cluster.connect import init_ray
from raybatch.cluster.gpu_budget import search_budget, search_estimator
from raybatch.cluster.hardware import gpu_request, one_gpu_model, read_cluster
from raybatch.errors import (
    Issue,
    NothingFitsError,
    RaybatchError,
    RunDirError,
    TrialsFailedError,
    WorkloadError,
)
from raybatch.export import write_best
from raybatch.keys import KnobPoint
from raybatch.memory.estimator import MemoryEstimator
from raybatch.metric import Target, resolve_target
from raybatch.provenance import Provenance
from raybatch.report import write_report
from raybatch.results.outcome import SearchResult
from raybatch.results.rows import TRIALS_CSV, TrialRow
from raybatch.results.selection import choose_winner
from raybatch.run.datafit import check_batches_fit_data
from raybatch.run.diskfull import disk_full_said
from raybatch.run.failfast import FailFast, ray_errors_to
from raybatch.run.heartbeat import Heartbeat
from raybatch.run.lock import RunLock
from raybatch.run.record import analyze_run, rebuild_report, stored_result, write_rows
from raybatch.run.rundir import (
    LOG_FILE,
    OPTUNA_DB,
    RUN_FILE,
    STUDY_NAME,
    forget_run_files,
    read_run,
    write_run_files,
)
from raybatch.run.signals import interrupted_while, interruptible, sigint_given_back
from raybatch.run.tune_state import (
    TUNER_FILE,
    KeepWhole,
    repair_state,
    restored_parts,
    save_on_change,
)
from raybatch.space.infer import not_searched
from raybatch.space.presets import load_space
from raybatch.space.search_space import SearchSpace
from raybatch.timemodel.prediction import time_model_found, write_predictions
from raybatch.trial.settings import parts_of
from raybatch.trial.with_resources import with_resources
from raybatch.trial.wrapper import trainable
from raybatch.tuning.confirmation import DECIDED_BY_THE_SEARCH, ONLY_ONE_REACHED
from raybatch.tuning.gates import for_settings
from raybatch.tuning.options import SearchOptions
from raybatch.tuning.phases import SearchThenRace, prescreened_rows, search_rows
from raybatch.tuning.plan import search_plan
from raybatch.tuning.progress import Progress, printed, ray_quiet, say_start
from raybatch.tuning.progress import log as progress
from raybatch.tuning.rungs import RungRule, guess_of_b
from raybatch.tuning.scheduler import CappingScheduler
from raybatch.tuning.searcher import RaybatchSearcher
from raybatch.tuning.seeding import nothing_fits
from raybatch.tuning.study import SearchStudy
from raybatch.tuning.study_file import check_study_file, close_unrun, runs_recorded, workload_ran
from raybatch.tuning.untold import TellUntold
from raybatch.tuning.warm import REUSE_ACTORS, pending_trials
from raybatch.version import check_format
from raybatch.workload import Workload, absolute_reference, load_workload

if TYPE_CHECKING:
    from raybatch.memory.estimator import MemoryEstimator


def search(
    workload: Workload,
    space: SearchSpace | str | Path,
    target: Target | float | str,
    run_dir: str | Path,
    options: SearchOptions | None = None,
    workload_ref: str | None = None,
    verbose: int = 1,
) -> SearchResult:
    """Find the recipe that reaches ``target`` fastest; everything lands in ``run_dir``.

    Args:
        workload: The workload to train.
        space: The coupled batch-size space, or a preset's name or a space file's path.
        target: The validation metric to reach: a :class:`Target`, text (``loss<=0.35``) or
            a number (the workload's first metric, in its direction); checked against the
            workload's :attr:`~raybatch.Workload.metrics` before anything starts.
        run_dir: Where the run lives (created).
        options: See :class:`SearchOptions`.
        workload_ref: How to import the workload again (``path.py:NAME``) for ``resume``.
        verbose: 0: silent; 1: raybatch's progress lines (the default); 2: Ray Tune's live
            table and lines too.
    """
    options, target = options or SearchOptions(), resolve_target(target, workload.metrics)
    space = space if isinstance(space, SearchSpace) else load_space(space)
    path = Path(run_dir)
    if (path / RUN_FILE).exists():
        why = "exists: this directory holds a run; use resume, or another dir"
        raise RunDirError([Issue(RUN_FILE, why)], str(path))
    check_batches_fit_data(workload, space)  # before Ray starts: a batch the data cannot fill
    # A cluster that does not answer fails in seconds, before the run directory is written.
    if options.address is not None:
        init_ray(options.address)
    ref = absolute_reference(workload_ref) if workload_ref else f"<object {workload.name}>"
    with RunLock(path, "search"):
        if (path / RUN_FILE).exists():  # another search started here since the check above
            raise RunDirError(
                [Issue(RUN_FILE, "exists: another search started in this directory")], str(path)
            )
        write_run_files(path, ref, space, target, options)
        with (
            printed(verbose >= 1),
            ray_quiet(verbose < 2),
            interruptible(path),
            disk_full_said(path, path / OPTUNA_DB),
        ):
            return _execute(path, workload, space, target, options, resume=False,
                            verbose=verbose)  # fmt: skip


def resume(run_dir: str | Path, verbose: int = 1) -> SearchResult:
    """Continue an interrupted search: completed trials are kept, never re-run.

    A finished run (its ``trials.csv`` written) is left alone: its stored result is returned,
    with a note, and nothing runs. To search again, start a new search in another directory.

    Raises:
        RunLockedError: Another driver is running in this run directory.
        RunDirError: Not a run directory, its search never started, or a file it needs is
            damaged (named, with what survives).
    """
    run = read_run(run_dir)
    path, ref, space, target, options = run.path, run.workload, run.space, run.target, run.options
    with RunLock(path, "resume") as lock:
        if (path / TRIALS_CSV).is_file():
            return _finished(path)
        check_format(run.format, str(path / RUN_FILE))  # Tune's pickles: this raybatch's only
        check_study_file(path / OPTUNA_DB, path)
        repaired = repair_state(path / "tune" / "search", path)
        try:
            workload = load_workload(ref)
        except WorkloadError as exc:  # its file moved since, or its module is gone
            why = f"{exc} (the workload the search started with, as stored here)"
            raise RunDirError([Issue(f"{RUN_FILE}: workload", why)], str(path)) from None
        notes = [*([lock.taken_over] if lock.taken_over else []), *repaired]
        with (
            printed(verbose >= 1),
            ray_quiet(verbose < 2),
            interruptible(path),
            disk_full_said(path, path / OPTUNA_DB),
        ):
            done = runs_recorded(path / OPTUNA_DB)
            progress.info(f"resuming {path}: {done} run(s) had ended and are kept, never run"
                          f" again; the search has {options.trials} trials")  # fmt: skip
            return _execute(path, workload, space, target, options, resume=True,
                            verbose=verbose, notes=notes)  # fmt: skip


def _finished(path: Path) -> SearchResult:
    """A finished run's result, read back from its files; nothing runs again."""
    result = stored_result(path)
    result.notes.append(
        "this run's search had finished: nothing was run again; to search again, start"
        " `raybatch search` with another --run-dir"
    )
    return result


def _progress(options: SearchOptions, sessions: list[float], slots: int | None) -> Progress:
    """The search's progress lines (the cost so far counted within the driver's sessions)."""
    return Progress("trial", options.trials, sessions=sessions, slots=slots)


def _quiet_tune() -> None:
    """Ray Tune settings a search needs, set once per process (a user's own values win)."""
    # Save Ray Tune's experiment state at every step, not every few minutes: a driver killed
    # between two saves would otherwise forget trials that had finished, and re-run them.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")
    save_on_change()  # ...but only the steps that changed what a restore reads
    # Tune forces a save whenever a trial saved a checkpoint (num_to_keep=1), which is what a
    # resume needs, and warned of it at every such save: three lines each, the run's log full.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # A hung trial that the scheduler stops cannot answer the stop request; Ray Tune kills
    # its actor after this many seconds (default 600), and only then frees its resources.
    os.environ.setdefault("TUNE_FORCE_TRIAL_CLEANUP_S", "30")
    # Tracebacks of failed trials go to the run's log (FailFast writes them), not the terminal.
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
    # ...and a trial stopped before its first report is not worth a warning with its path.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    # An interrupted search says how to continue it (`raybatch resume RUN_DIR`); Ray Tune's own
    # "Resume experiment with: Tuner.restore(...)" beside it would name a second way, which
    # skips the confirmation and the record.
    logging.getLogger("ray.tune.tune").addFilter(_no_tune_restore_hint)


def _no_tune_restore_hint(record: logging.LogRecord) -> bool:
    return "Tuner.restore(" not in record.getMessage()


@dataclass
class _Plan:
    """What the search decides before its first trial: resources, budget, seeds, trainable."""

    gpus: str | float
    cuda: bool
    hardware: str
    budget: int | None
    estimator: MemoryEstimator | None
    baseline: KnobPoint
    reference: KnobPoint | None
    searcher: RaybatchSearcher
    trainable: Callable[[dict[str, Any]], Any]  # raybatch.trainable's: it carries the settings
    resourced: Any  # what tune.with_resources returns (a trainable Tune wraps)
    notes: list[str] = field(default_factory=list)
    in_flight: int = 1  # trials run at once: the cluster's room, or --max-concurrent under it
    tuned: Any = None  # what Tune holds: the search, then the race (SearchThenRace)
    sessions: list[float] = field(default_factory=list)  # when each driver session started


def _plan_or_forget(path: Path, resume: bool, workload: Workload, space: SearchSpace,
                    target: Target, options: SearchOptions) -> tuple[bool, _Plan]:  # fmt: skip
    """Ray up, then :func:`_plan`; a new search refused at either leaves no run (run it again)."""
    try:
        return init_ray(options.address), _plan(path, workload, space, target, options)
    except RaybatchError:
        if not resume:
            forget_run_files(path)
        raise


def _study_url(path: Path) -> str:
    """The run's Optuna storage, where the run directory is now."""
    return f"sqlite:///{(path / OPTUNA_DB).resolve()}"


def _plan(
    path: Path, workload: Workload, space: SearchSpace, target: Target, options: SearchOptions
) -> _Plan:
    view = read_cluster()
    notes: list[str] = list(view.warnings())
    gpus = gpu_request(view, options.gpus_per_trial, options.memory_budget, notes)
    cuda = gpus not in (0, 0.0)
    if cuda:
        view = one_gpu_model(view, options.gpu_model, notes)
    budget, context = search_budget(view, options, cuda, notes)
    estimator = search_estimator(view, options, cuda, workload, space, budget, notes)

    # Only a real probe can overrule the estimate: on CPUs the trial's gate is the estimate.
    margin = options.probe_margin if cuda and options.prescreen else 0.0
    if estimator is not None and budget is not None and options.prescreen:
        why = nothing_fits(space, estimator, budget, margin)
        if why is not None:
            raise NothingFitsError(f"{why}; nothing to search (a smaller model, or more memory)")
    searched, baseline, reference = search_plan(
        space, estimator, budget, margin, options.prior, target.mode, guess_of_b(options.max_time_s)
    )
    # The trials' settings, one frozen object the trainable carries: the searcher and the
    # resources below read what they need from it, as a plugin user's parts do.
    fn = trainable(
        workload, space, target, max_time_s=options.max_time_s, seed=options.seed,
        max_samples=options.max_samples,
        eval_every_samples=options.eval_every_samples, data_parallel_gpus=cuda,
        memory_budget=None if cuda else budget, gpu_budget_bytes=budget if cuda else None,
        gpu_model=options.gpu_model if cuda else None, cuda_context_bytes=context,
    )  # fmt: skip
    s = parts_of(fn).settings
    screen = estimator if options.prescreen else None
    gates, devices = for_settings(s, screen, margin, packed=cuda and gpus == "auto")
    searcher = RaybatchSearcher(
        space,
        penalty=s.penalty,
        study=SearchStudy(_study_url(path), STUDY_NAME, options.seed),
        plan=searched,
        gates=gates,
        devices=devices,
    )  # fmt: skip
    resourced = with_resources(fn, gpus, options.cpus_per_trial, estimator=estimator)
    hardware, room = view.describe(cuda), view.trials_at_once(gpus, options.cpus_per_trial)
    return _Plan(
        gpus, cuda, hardware, budget, estimator, baseline, reference, searcher, fn, resourced,
        notes, min(options.max_concurrent or room, room),
    )  # fmt: skip


def _search_tuner(
    path: Path,
    plan: _Plan,
    options: SearchOptions,
    resume: bool,
    verbose: int,
    watch: Any,
    scheduler: Any,
) -> Any:
    """The search's ``tune.Tuner``: a new one, or the interrupted one restored."""
    from ray import tune

    experiment = path.resolve() / "tune" / "search"
    if resume:
        tuner = tune.Tuner.restore(
            str(experiment), trainable=plan.resourced, resume_unfinished=True, resume_errored=True
        )
        # Tune restores the searcher and callbacks pickled when the search started, with the
        # paths of that run directory: pointed here, a copied or moved run resumes into itself.
        tuned, run_config, restored = restored_parts(tuner)
        if isinstance(restored, CappingScheduler):  # its new trials go here, not to the original
            restored.experiment = (str(experiment.parent), experiment.name)
            restored.slots = plan.in_flight  # this session's cluster
        searcher = tuned.search if isinstance(tuned, SearchThenRace) else tuned
        if not isinstance(searcher, RaybatchSearcher):
            why = "holds no raybatch searcher: this is not a raybatch search's experiment"
            raise RunDirError([Issue(f"tune/search/{TUNER_FILE}", why)], str(path))
        check_format(getattr(searcher, "run_format", None), str(path / "tune/search" / TUNER_FILE))
        searcher.record.relocate(_study_url(path))
        plan.searcher, plan.tuned = searcher, tuned  # those that run: read after the search
        run_config.callbacks = [
            watch if isinstance(c, FailFast) else c
            for c in run_config.callbacks or []
            if not isinstance(c, TellUntold | Progress | KeepWhole)
        ] + [TellUntold(tuned), _progress(options, plan.sessions, plan.searcher.record.slots()),
             KeepWhole(experiment)]  # fmt: skip
        if isinstance(run_config.stop, FailFast):
            run_config.stop = watch
        run_config.verbose = max(0, verbose - 1)  # this session's, not the first one's
        return tuner
    scheduler.experiment = (str(experiment.parent), experiment.name)
    # The race runs in this Tuner once the search's trials ended, on their warm processes.
    # Tune's max_concurrent_trials counts paused trials: the search's own limit does not.
    pausing, scheduler.slots = scheduler.pause, plan.in_flight
    plan.tuned = SearchThenRace.for_search(plan.searcher, options, plan.cuda, plan.in_flight,
                                           limit=plan.in_flight if pausing else None,
                                           mode=scheduler.mode)  # fmt: skip
    return tune.Tuner(
        plan.resourced,
        tune_config=tune.TuneConfig(
            search_alg=plan.tuned,
            scheduler=scheduler,
            num_samples=options.trials + 2 * len(plan.tuned.seeds),  # two runs a race round
            max_concurrent_trials=None if pausing else plan.in_flight,
            reuse_actors=REUSE_ACTORS,
        ),
        run_config=tune.RunConfig(
            storage_path=str(experiment.parent),
            name="search",
            failure_config=tune.FailureConfig(max_failures=options.max_failures),
            # A trial's reports carry its state (raybatch.trial.pause): the last one is enough.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            verbose=max(0, verbose - 1),  # Tune's table at 2 (--verbose) only
            callbacks=[
                watch,
                TellUntold(plan.tuned),
                _progress(options, plan.sessions, plan.searcher.record.slots()),
                KeepWhole(experiment),
            ],
            stop=watch,
        ),
    )


def _execute(
    path: Path,
    workload: Workload,
    space: SearchSpace,
    target: Target,
    options: SearchOptions,
    resume: bool,
    verbose: int,
    notes: list[str] | None = None,
) -> SearchResult:
    with Heartbeat() as beat:
        session = time.time()  # this driver's session: the cost's wall clock stops at its gaps
        _quiet_tune()
        beat.doing("starting the search: Ray, the workload, the memory estimate")
        started_ray, plan = _plan_or_forget(path, resume, workload, space, target, options)
        plan.sessions = plan.searcher.record.add_session(session, plan.in_flight)
        notes = plan.notes = [*(notes or []), *plan.notes]
        watch = FailFast(
            path / LOG_FILE, healthy=workload_ran(plan.searcher.record) if resume else 0
        )

        scheduler = CappingScheduler.for_trainable(
            plan.trainable, options.hang_grace_s, slack=options.slack, enabled=options.capping,
            rungs=RungRule(zone=options.zone), pause=options.pause,
        )  # fmt: skip
        tuner = _search_tuner(path, plan, options, resume, verbose, watch, scheduler)
        say_start(not_searched(workload, space), options.trials, plan.in_flight)
        pending = pending_trials(scheduler.pause, plan.in_flight)
        beat.doing(None)  # Tune's loop: the progress callback breaks its silences
        with ray_errors_to(path / LOG_FILE) as diverted, pending, sigint_given_back():
            results = tuner.fit()
            if watch.tripped is not None:
                _close_ghosts(
                    plan.searcher.record,
                    "ended when the search stopped early, every trial"
                    " failing the same way (tracebacks in search.log)",
                )
                if started_ray:  # trials still starting fail after the stop: to the log with them
                    diverted.shutdown_ray()
                raise TrialsFailedError(watch.summary())
        if diverted.tune_state_errors:
            notes.append(f"saving Ray Tune's experiment state failed {diverted.tune_state_errors}"
                         f" time(s) (tracebacks in {path / LOG_FILE}); resume may repeat the trials"
                         " that finished since the last save")  # fmt: skip
        phases = plan.tuned
        phases.ended_or_interrupted(plan.searcher.record.gave_up_reason(), path, notes)
        progress.info("the search has ended: choosing the winner, writing trials.csv,"
                      " best_config.yaml and report.html")  # fmt: skip
        beat.doing("writing up: the winner, trials.csv, best_config.yaml, report.html")
        # Every trial had ended and trials.csv (written last but the report) is not there yet:
        # the run has not finished, and resume writes it up, running no trial again.
        with interrupted_while(
            "writing the run up (every trial had ended; none runs again)",
            path,
            ", which writes trials.csv, best_config.yaml and report.html",
        ):
            return _write_up(path, results, plan, workload, space, target, options, scheduler)


def _write_up(path: Path, results: Any, plan: _Plan, workload: Workload, space: SearchSpace,
              target: Target, options: SearchOptions, scheduler: CappingScheduler
              ) -> SearchResult:  # fmt: skip
    """The winner chosen from the ended search's rows, and the run's files written."""
    notes = plan.notes
    rows = _rows_of(results, plan, options.seed, scheduler, notes)
    plan.baseline = {**plan.baseline, **(plan.searcher.record.baseline() or {})}  # as found
    if plan.tuned.only_one_reached:
        notes.append(ONLY_ONE_REACHED)
    elif plan.tuned.decided_by_the_search:
        notes.append(DECIDED_BY_THE_SEARCH.format(zone=plan.tuned.zone))
    # What the rows cannot say: the hardware, the workload's autocast, the loop's gradient
    # clipping (a search trains with raybatch's default loop: none), which exports carry; the
    # points the verdict compares with.
    prior = None
    model = time_model_found(plan.searcher.plan, path, options.prior, notes)
    if model is not None:
        rows, prior = write_predictions(rows, model, notes)
    measured_on = Provenance(
        device=plan.hardware, amp_dtype=workload.amp_dtype, amp_recorded=True,
        baseline_point=plan.baseline, reference_point=plan.reference, prior=prior,
    )  # fmt: skip
    best = choose_winner(target, rows, options.confirms, measured_on, plan.sessions,
                         plan.searcher.record.slots())  # fmt: skip
    if best is not None:
        write_best(path, best)
    # Written last but the report: a run with trials.csv has finished (resume leaves it alone).
    write_rows(path, rows, plan.searcher.record.study)
    result = SearchResult(path, rows, best, plan.baseline, plan.reference, notes, target)
    try:
        write_report(result, space, target, plan.estimator, plan.budget)
    except OSError as exc:  # the verdict stands on trials.csv; the report is drawn from it
        notes.append(f"the report could not be written ({exc.filename}: {exc.strerror or exc});"
                     f" `raybatch report {path}` writes it again")  # fmt: skip
    return result


def _rows_of(results: Any, plan: _Plan, seed: int, scheduler: CappingScheduler,
             notes: list[str]) -> list[TrialRow]:  # fmt: skip
    """Every row of the run: the search's trials, the pre-screened configs and the race's
    runs; the study's trials an interruption left open closed (no ghosts), said in a note."""
    # A resumed search's scheduler is Tune's restored copy: its rung stops are not seen here.
    rows = search_rows(results, plan.searcher.penalty, seed, scheduler)
    closed = plan.searcher.record.close_orphans({r.trial_id for r in rows})
    if closed:
        notes.append(f"{closed} Optuna trial(s) left running by an interruption were closed as"
                     " failed")  # fmt: skip
    close_unrun(plan.searcher.record)  # queued points the search ended before: no ghosts
    return [*rows, *prescreened_rows(plan.searcher.record), *plan.tuned.race_rows]


def _close_ghosts(record: SearchStudy, why: str) -> None:
    """A search stopped early: the trials it left open in the study (suggested, perhaps run,
    never told) are closed failed with ``why``, and the points it queued as never run: no
    RUNNING or WAITING trial is left."""
    record.close_orphans(set(), why)
    close_unrun(record)


__all__ = ["analyze_run", "rebuild_report", "resume", "search", "stored_result"]
