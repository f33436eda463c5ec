"""The winner in the shapes training code reads: Hugging Face ``TrainingArguments``, Lightning's
``Trainer`` and ``configure_optimizers``, a DeepSpeed config, ``torchrun`` / ``accelerate
launch`` lines — and the recipe moved to another GPU count.

- ``retarget``: :func:`retarget`, the recipe on ``N`` GPUs, said measured or not;
- ``hf``, ``lightning``, ``deepspeed``, ``launch``: one framework each, every mapped field
  named as the library version it was written against names it; what does not map is an
  :class:`~raybatch.errors.ExportError` or a marked comment, never a silent drop.
"""
