"""The bundled example workload, addressable from the CLI as ``examples/digits.py:workload``.

A small CNN on scikit-learn's 8x8 digits (shipped with scikit-learn, no download), searched
with the ``digits_cnn_sgd`` preset. The workload itself lives in the package
(``raybatch.examples.digits``) so an installed raybatch has it too.
"""

from raybatch.examples.digits import DigitsWorkload, small_cnn, workload

__all__ = ["DigitsWorkload", "small_cnn", "workload"]
