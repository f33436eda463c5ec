"""What is searched, and what is derived from it.

- ``search_space``: :class:`SearchSpace`, the raw knobs that are searched and the derivation
  of every recipe from them (LR, weight decay, warmup);
- ``rules``: the scaling rules (linear, sqrt, none) and optimizer families;
- ``config``: :class:`TrialConfig`, one derived recipe;
- ``presets``: the bundled spaces, by name;
- ``tune_space``: the same space as Ray Tune and Optuna see it;
- ``_yaml``: reading space files with line numbers for errors.
"""
