"""One search run, end to end: Optuna on Ray Tune, and the run directory it leaves.

- ``options``: :class:`SearchOptions`, how a search runs (validated on construction);
- ``seeding``: the plan before TPE (the largest batch at an LR sweep, the reference, then a
  ladder of batches at the best LR); ``prior``: the time model that chooses the ladder
  (gradient noise scale and step times), ``prediction``: measuring it for a search and
  writing its predictions into the rows;
- ``searcher``: :class:`~raybatch.run.searcher.RaybatchSearcher`, TPE with the memory
  pre-screen, and ``study``: the Optuna study it owns (the one place that opens it);
- ``scheduler``: adaptive capping, at every level of the metric; ``failfast``: stopping on
  a repeated failure; ``cluster``: connecting to Ray;
- ``driver``: :func:`search`, :func:`resume` and re-analysis of a finished run;
- ``confirmation``: the re-runs on paired fresh seeds and the race of the two best;
- ``rundir``: the run directory's files (its rows and the winner's selection live below, in
  :mod:`raybatch.results`, which the report reads too).
"""
