"""What the cluster has and where a trial runs: GPUs, their memory, and each trial's share.

- ``connect``: a local Ray, or a cluster at an address that must answer (``orphans``: nothing
  of a local Ray outlives a driver killed outright);
- ``hardware``: the nodes, CPUs and GPUs as the search sees them, read through ``nvml`` on
  each GPU node; ``budget``: one GPU's memory budget; ``context``: one trial's CUDA context;
- ``gpu_budget``: what the search's GPUs show at its start (the context measured, the top of
  the batch range measured by real steps); ``preflight``: ``raybatch check``;
- ``resources``: each trial's CPUs and GPU share; ``placement``: the device a trial's process
  takes, and the cap on a packed trial's allocator; ``process_age``: the start-up a reused
  process charges its first trial.

Nothing here imports the search, the trials or the run: they stand on it.
"""
