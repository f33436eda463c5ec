"""The search's machinery: which recipe runs next, and which trial goes on.

- ``searcher``: :class:`~raybatch.tuning.searcher.RaybatchSearcher`, Optuna's TPE composed
  with the ``plan`` (``seeding``'s points: the largest batch at an LR sweep and the reference,
  the ``opening``; then a ladder of batches ranked by :mod:`raybatch.timemodel`), the ``gates``
  every suggestion passes before launch, the ``screen`` that asks Optuna until one passes, and
  its ``launches``; ``study``: the Optuna study it owns (``sessions``: when each driver session
  of the run began, kept in it);
- ``scheduler``: :class:`~raybatch.tuning.scheduler.CappingScheduler`, capping on the
  equal-time ``rungs``, pausing a trial behind (``promotion``: which paused trial goes on),
  with its guard against hung trials (``hang``), slots kept warm (``warm``) and trials Tune
  ended untold (``untold``);
- ``confirmation``: the race of the two best recipes (``race_record``: its runs), run after
  the search in one Tune experiment (``phases``); ``progress``: what the search says;
- ``options``: :class:`SearchOptions`, how a search runs.
"""
