"""One recipe, measured: a Ray Tune trial of one recipe, from its config to its last report.

- ``wrapper``: the trainable Ray Tune runs (:func:`trainable`) and :func:`run_trial`, which
  sets a trial up (device, memory gate, probe) and hands it to the loop;
- ``loop``: raybatch's own training loop (accumulation, warmup, AMP, DDP, evaluation marks);
- ``reporting``: :class:`~raybatch.trial.reporting.TrialReporter`, the trial's progress,
  target check and statuses, reported to Ray Tune, with its parts: ``clock`` (training time),
  ``cadence`` (when an evaluation or a heartbeat is due), ``limits`` (why a trial stops),
  ``tally`` (what it counted and read) and ``channel`` (where its reports go);
- ``with_resources``: ``tune.with_resources`` for a trainable, from the settings it carries;
- ``gpu_monitor``: GPU utilisation sampled during a trial (NVML).

The search's time model, measured inside a trial, lives in :mod:`raybatch.timemodel`.
"""
