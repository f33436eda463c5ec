"""What a search measured, below the search, the run and the report: the typed rows (:mod:`.rows`,
``trials.csv``) and the one rule that picks the winner from them (:mod:`.selection`).

Nothing here imports :mod:`raybatch.tuning`, :mod:`raybatch.run` or :mod:`raybatch.report`;
they import this.
"""
