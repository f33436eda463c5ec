"""Models as their frameworks write them, read as a :class:`raybatch.Workload`.

- :mod:`raybatch.adapters.lightning`: a ``LightningModule`` and its ``LightningDataModule``;
- :mod:`raybatch.adapters.huggingface`: a Hugging Face model with its datasets, collator and
  ``compute_metrics`` (what ``Trainer.hyperparameter_search`` takes).

Each imports its framework only when used: raybatch does not depend on either.
"""
