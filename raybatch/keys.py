"""The names of the keys of a trial's config dict.

One module defines them so the space, the Ray/Optuna adapters, the trial wrapper, the
results table and the exported best config all spell them the same way. The values are
part of the public contract: ``raybatch space --json`` prints them, Ray Tune passes them to
every trial, and ``best_config.yaml`` stores them.
"""

from __future__ import annotations

from typing import Final, TypedDict

# Raw knobs: what the searcher samples.
MICRO_BATCH_SIZE: Final = "micro_batch_size"
ACCUMULATION_STEPS: Final = "accumulation_steps"
WORLD_SIZE: Final = "world_size"
LR_MULTIPLIER: Final = "lr_multiplier"
WEIGHT_DECAY_MULTIPLIER: Final = "weight_decay_multiplier"

RAW_KNOBS: Final = (
    MICRO_BATCH_SIZE,
    ACCUMULATION_STEPS,
    WORLD_SIZE,
    LR_MULTIPLIER,
    WEIGHT_DECAY_MULTIPLIER,
)


class KnobPoint(TypedDict, total=False):
    """A point of the search as its raw knobs: the largest batch that fits, the reference, the
    plan's opening and ladder points. A knob left out takes its default (accumulation and world
    size 1, multipliers 1.0) or is a constant of the space. A dict, typed, because that is what
    Optuna's ``enqueue_trial`` and ``best_config.yaml`` take as they are."""

    micro_batch_size: int
    accumulation_steps: int
    world_size: int
    lr_multiplier: float
    weight_decay_multiplier: float


def knob_items(point: KnobPoint) -> list[tuple[str, float]]:
    """A point's knobs as ``(name, value)`` pairs, for comparing points knob by knob."""
    return [(name, float(point[name])) for name in RAW_KNOBS if name in point]


# Derived values: computed from the raw knobs by the space's rules, never searched.
EFFECTIVE_BATCH_SIZE: Final = "effective_batch_size"
LR: Final = "lr"
WEIGHT_DECAY: Final = "weight_decay"
LR_SCALE: Final = "lr_scale"
WARMUP_SAMPLES: Final = "warmup_samples"
WARMUP_STEPS: Final = "warmup_steps"

# Provenance: which rules and which reference recipe the values were derived from.
SPACE: Final = "space"
LR_RULE: Final = "lr_rule"
WEIGHT_DECAY_RULE: Final = "weight_decay_rule"
OPTIMIZER: Final = "optimizer"
OPTIMIZER_KWARGS: Final = "optimizer_kwargs"
REFERENCE_BATCH_SIZE: Final = "reference_batch_size"
REFERENCE_LR: Final = "reference_lr"
REFERENCE_WEIGHT_DECAY: Final = "reference_weight_decay"

# Metrics a trial reports to Ray Tune at every evaluation (see raybatch.trial.reporting).
STATUS: Final = "status"
REASON: Final = "reason"
METRIC: Final = "metric"
ELAPSED_S: Final = "elapsed_s"
TRAIN_S: Final = "train_s"
"""Training time so far: ``elapsed_s`` less ``eval_s``; the clock of the caps."""
EVAL_S: Final = "eval_s"
"""Time spent evaluating so far (raybatch's measuring device, not the user's training)."""
EVAL_WHOLE: Final = "eval_whole"
"""Whether the last evaluation read the whole validation set (False: the fixed early subset,
far from the target; :mod:`raybatch.trial.validation`)."""
WARMING_UP: Final = "warming_up"
"""Whether the trial's LR was still below its peak (its warmup) at its last evaluation: before
any trial has reached the target, a rung does not judge it before its warmup has ended
(:class:`~raybatch.tuning.scheduler.CappingScheduler`); ``None`` where the loop does not say (a
loop of the user's own): judged as warm."""
HEARTBEAT: Final = "heartbeat"
"""True on a report sent between evaluation marks (training time only, no new evaluation):
the final cap may act on it, the levels of the metric are judged at evaluations only."""
HELD_S: Final = "held_s"
"""Wall seconds the trial has held its device(s) so far, from the moment its function began:
start-up, data loading, the memory probe, training and evaluation. What a search costs."""
STARTED_AT: Final = "started_at"
"""When the trial began holding its device(s), in seconds since the epoch (the wall clock, to
place every trial and run of a search on one time line: slots x wall clock is what a search
costs the user)."""
STARTUP_S: Final = "startup_s"
"""Seconds of its process's start-up charged to the trial (imports, unpickling the workload):
the first trial a process runs has them, a later one none."""
SAMPLES_SEEN: Final = "samples_seen"
STEPS: Final = "steps"
EVAL_MARK: Final = "eval_mark"
"""The samples at the last evaluation's mark: on a fixed grid (a cadence the user gave), the
grid mark passed; beside training-time marks, the samples seen at that evaluation."""
TIME_TO_TARGET_S: Final = "time_to_target_s"
"""The objective: training time (evaluations excluded) until the target was first met."""
ELAPSED_TO_TARGET_S: Final = "elapsed_to_target_s"
"""Training and evaluation time until the target was met: what the objective counted before it
left evaluation out, kept in ``trials.csv`` for comparison."""
SAMPLES_TO_TARGET: Final = "samples_to_target"
THROUGHPUT: Final = "throughput"
DATA_WAIT_FRACTION: Final = "data_wait_fraction"
PEAK_MEMORY_BYTES: Final = "peak_memory_bytes"
GPU_UTILIZATION: Final = "gpu_utilization"
OBJECTIVE: Final = "objective"
LOSS: Final = "loss"
VALIDATION_PREFIX: Final = "val_"
"""Every validation metric ``evaluate`` returned is reported as ``val_<name>``."""
ERROR_TRACEBACK: Final = "error_traceback"
"""Only in the final report of an ``error`` trial: the traceback, for the run's log."""
WORKERS_PLACED: Final = "workers_placed"
"""In the first report of a data-parallel trial: its workers are placed and their memory gates
passed (the scheduler's hang clock runs from that report, not from the wait for GPUs)."""
SEED: Final = "seed"
MEET_LEVEL: Final = "meet_level"
"""In a confirmation run's config and row: the level its two recipes meet at, the target
metric's value the leader's search run had at half its time to target; the run trains to that
level instead of the target (:mod:`raybatch.tuning.confirmation`). Empty: a run to the target."""
ALONE: Final = "alone"
"""In a trial's config: run on a whole GPU, never packed (confirmation runs, and the retry of a
trial that ran out of memory while packed)."""
MEASURE_TIME_MODEL: Final = "measure_time_model"
"""In a trial's config: once it reaches the target, measure the search's time model on its
trained model (:mod:`raybatch.timemodel.measure`); the searcher asks every trial until one has."""
RUNG_MARKS: Final = "rung_marks"
"""In a trial's config: training times (seconds) at which it also evaluates, the equal-time
rungs tied to the fastest time to target when it was launched (:mod:`raybatch.tuning.rungs`): a
rung judges a trial at its first evaluation past it, and the geometric marks alone lie up to
``sqrt(3)`` apart, so a trial paused there trained up to 73 % past the rung."""
TIME_MODEL: Final = "time_model"
"""In the final report of a trial asked to measure it: the time model, as JSON text
(:meth:`raybatch.timemodel.model.TimeModel.to_dict`)."""
TIME_MODEL_ERROR: Final = "time_model_error"
"""Instead, why it could not be measured (the trial itself still reached the target)."""
GPU_SHARE: Final = "gpu_share"
"""The fraction of a GPU Ray assigned to the trial (``1/k`` when packed ``k`` to a GPU)."""
GPU_NAME: Final = "gpu_name"
"""The model of the GPU a trial ran on, as CUDA names it (``None`` on CPU)."""
GPU_ID: Final = "gpu_id"
"""The GPU a trial ran on, as Ray names it on its node: an index, or a UUID where
``CUDA_VISIBLE_DEVICES`` names GPUs so (``None`` on CPU)."""
NODE_IP: Final = "node_ip"
"""The node a trial ran on (Ray Tune adds it to every result)."""
PEAK_RESERVED_BYTES: Final = "peak_reserved_bytes"
"""Peak of the CUDA caching allocator's *reserved* memory (what an OOM is about);
:data:`PEAK_MEMORY_BYTES` is the peak *allocated*, comparable with the trace's prediction."""
PROBE_RESERVED_BYTES: Final = "probe_reserved_bytes"
"""Reserved peak of the trial's real probe step (CUDA): calibrates the search's estimator."""
PREDICTED_TIME_S: Final = "predicted_time_s"
"""In ``trials.csv``: the time to target the search's prior (:mod:`raybatch.timemodel.model`)
predicts for the row's recipe, scaled by one constant fitted to the search's measured times."""
PREDICTED_BYTES: Final = "predicted_bytes"
"""The memory estimate's predicted peak of a recipe (``raybatch estimate``, ``raybatch check``,
the searcher's pre-screened records)."""
TUNE_TRIAL_ID: Final = "tune_trial_id"
"""The Ray Tune trial that runs an Optuna trial (an Optuna user attribute, and the searcher's
record of trials that ran out of memory)."""
GPU_UTILIZATION_SCOPE: Final = "gpu_utilization_scope"
"""``process`` (NVML's per-process utilisation of the trial's own process) or ``device`` (the
whole GPU's, neighbours included, where NVML does not give per-process figures)."""

# Columns of a result row (``trials.csv``) that say where the row comes from.
PHASE: Final = "phase"
"""Which part of the search produced the row: one of :data:`PHASES`."""
PHASE_SEARCH: Final = "search"
PHASE_PRESCREEN: Final = "prescreen"
PHASE_CONFIRMATION: Final = "confirmation"
PHASES: Final = (PHASE_SEARCH, PHASE_PRESCREEN, PHASE_CONFIRMATION)
TRIAL_ID: Final = "trial_id"
"""The Ray Tune trial id (``optuna_N`` for a pre-screened config, which never ran)."""
CANDIDATE: Final = "candidate"
"""In a confirmation row: the index of the recipe it re-runs among those confirmed."""
