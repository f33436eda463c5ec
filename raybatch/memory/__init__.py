"""Predict a training step's peak GPU memory without a GPU, and screen configs against a budget.

Layers, cheapest first (``DESIGN.md``, "Memory pre-screen"):

1. **Trace** (:func:`trace_step`): one steady-state training step of the workload — forward,
   loss, backward, optimizer step, under the workload's autocast dtype — runs under
   ``FakeTensorMode``, so no tensor holds real memory and no GPU is needed. A dispatch-mode
   tracker records every storage the step allocates and frees, and the peak of the live total,
   split into parameters, gradients, optimizer state, activations, temporaries and inputs.
   We use our own tracker rather than ``torch.distributed._tools.mem_tracker.MemTracker``
   because MemTracker refuses a module called twice in one context (two accumulation micro
   steps) and files optimizer temporaries under optimizer state.
2. **Linear model** (:class:`LinearMemoryModel`): traces at two micro-batch sizes give
   ``peak(b) = fixed + per_sample x b``; a third trace checks the assumption (the residual is
   reported). Predicting any size and the largest size under a budget are then arithmetic.
3. **Real probe** (:mod:`raybatch.memory.probe`): on the trial's GPU, one real step before the clock
   starts; its measured peak calibrates the model (ratio measured / predicted).

What the trace accounts for, so the prediction matches what CUDA allocates:

- a *steady-state* step: one warm-up step first materialises the optimizer state, so the
  measured step carries parameters + optimizer state through forward and backward, as every
  step after the first does;
- accumulation: activations per micro step do not grow with accumulation, but gradients are
  alive during the forward pass of every micro step after the first; the trace runs two micro
  steps when ``accumulation_steps > 1``;
- CUDA projection: sizes are rounded up to the caching allocator's 512-byte granularity,
  optimizers use the multi-tensor (``foreach``) path PyTorch picks on CUDA (its temporaries
  are larger than the CPU loop's), and :data:`CUDA_KERNEL_WORKSPACE_BYTES` is added for the
  cuBLAS workspace, which no dispatch-level trace can see;
- data parallelism (``world_size > 1``): per-GPU memory is that of one worker plus DDP's
  gradient buckets, one more copy of the gradients (DDP's default
  ``gradient_as_bucket_view=False``); the model is not sharded;
- input prefetch: ``Workload.gpu_prefetch_batches`` extra batches on the GPU (seed 000).

Not accounted for: the CUDA context (outside the allocator; :mod:`raybatch.memory.budget` subtracts
it from the budget), cuDNN's algorithm-search workspaces under ``cudnn.benchmark``, and
fragmentation of the caching allocator (``reserved > allocated``), which the headroom and the
probe's calibration cover.
"""
