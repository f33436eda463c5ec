"""The time model, in one room below the search: what predicts a recipe's time to target.

- ``model``: :class:`~raybatch.timemodel.model.TimeModel`, time to target from the gradient
  noise scale (McCandlish et al. 2018) and measured step times, up to a constant;
- ``measure``: measuring it inside a trial the searcher asks, once that trial reaches the
  target (its own device, its trained weights; the trial's training batches);
- ``prediction``: the search's record of it: the run directory's ``prior.json``, the note
  saying where it was measured, and each row's ``predicted_time_s``.

The trial's wrapper runs the measurement and the search's plan and driver read the rest; the
room imports neither (only the trial's batches, below the wrapper).
"""
