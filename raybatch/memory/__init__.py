"""Predict a training step's peak GPU memory without a GPU, and screen configs against a budget.

Three layers, cheapest first (``docs/memory.md``):

1. :func:`~raybatch.memory.trace.trace_step` runs one steady-state step under
   ``FakeTensorMode`` and counts every storage it allocates, by category. It uses its own
   dispatch tracker, not PyTorch's ``MemTracker``, which refuses a module called twice in one
   context (two accumulation micro steps) and files optimizer temporaries as optimizer state.
2. :class:`~raybatch.memory.model.LinearMemoryModel` is fitted on traces at two micro batches,
   so any size, and the largest under a budget, is arithmetic; a third trace checks the fit.
3. :mod:`raybatch.memory.probe`: one real step on the trial's GPU calibrates the model.

The trace counts what CUDA allocates: warm optimizer state, gradients alive through the next
micro step's forward under accumulation, 512-byte allocator blocks, ``foreach`` optimizers,
a cuBLAS workspace per thread of the step, attention and dropout as CUDA's kernels keep them
(:mod:`~raybatch.memory.kernels`), DDP's gradient buckets and prefetched batches. It leaves out
the CUDA context (:mod:`raybatch.cluster.budget` subtracts it), cuDNN's benchmark workspaces
and allocator fragmentation, which the headroom and the probe's calibration cover.
"""
