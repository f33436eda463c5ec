"""One search run, end to end: Optuna on Ray Tune, and the run directory it leaves.

- ``options``: :class:`SearchOptions`, how a search runs (validated on construction);
- ``seeding``: the plan's points (the largest batch at an LR sweep, the reference, then a
  ladder of batches at the best LR, ranked by the time model of :mod:`raybatch.timemodel`);
  ``plan``: the part of the searcher that runs them before TPE (``opening``: its first stage);
- ``searcher``: :class:`~raybatch.run.searcher.RaybatchSearcher`, TPE composed with the plan,
  the ``gates`` every suggestion passes before launch (placement, the memory budget, what ran
  out of memory) and the devices trials take, the ``screen`` that asks Optuna until a
  suggestion passes them, and its ``launches`` (which Tune trial runs which Optuna trial, and
  what waits to launch); ``study``: the Optuna study it owns (the one place that opens it);
- ``scheduler``: adaptive capping, at every level of the metric (``hang``: its guard against
  hung trials); ``failfast``: stopping on
  a repeated failure; ``cluster``: connecting to Ray;
- ``driver``: :func:`search`, :func:`resume` and re-analysis of a finished run;
- ``confirmation``: the re-runs on paired fresh seeds and the race of the two best;
  ``race_record``: its runs, in an Optuna study beside the search's;
- ``rundir``: the run directory's files (its rows and the winner's selection live below, in
  :mod:`raybatch.results`, which the report reads too).
"""
