"""One search run, end to end: the driver, and the run directory it leaves.

- ``driver``: :func:`search`, :func:`resume` and re-analysis of a finished run: the search of
  :mod:`raybatch.tuning` on the cluster of :mod:`raybatch.cluster`, over the trials of
  :mod:`raybatch.trial`;
- ``rundir``: the run directory's files (its rows and the winner's selection live below, in
  :mod:`raybatch.results`, which the report reads too); ``record``: a finished run read back
  from its files alone; ``tune_state``: Ray Tune's saved state, made safe to restore; ``lock``:
  one driver per run directory; ``diskfull``: a full disk, said in one line;
- ``datafit``: the space's batches against the workload's data, before anything starts;
  ``failfast``: stopping on a repeated failure; ``signals``: SIGTERM taken as Ctrl-C;
  ``heartbeat``: a line that breaks a silence outside Tune's loop.
"""
