"""Attention and dropout traced as CUDA runs them, against bytes counted by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from raybatch import load_space
from raybatch.memory.kernels import cuda_backend, cuda_kernels
from raybatch.memory.trace import trace_step

from .workloads import (
    AttentionWorkload,
    CheckpointedAttentionWorkload,
    DropoutWorkload,
    LearnedBiasWorkload,
)

ADAMW = load_space("generic_adamw").reference_config()


def test_fused_attention_keeps_its_inputs_output_and_one_float_per_row_by_hand_count() -> None:
    """Under the CUDA projection, fp32 attention runs the memory-efficient kernel. Counted by
    hand for 8 sequences of 64 tokens, width 64, 2 heads, every block rounded to 512 bytes,
    what forward leaves alive for backward is

    - the projection's output, whose views are the kernel's q, k, v: 8 x 64 x 192 x 4 = 393216
    - the kernel's output: 8 x 64 x 64 x 4 = 131072
    - its log-sum-exp, one float per head and query row: 8 x 2 x 64 x 4 = 4096
    - its dropout's random seed and offset, two scalars: 2 x 512
    - the loss, a scalar: 512

    and nothing of the 64 x 64 scores: the CPU's math path keeps them (their softmax, dropout
    mask and dropped copy), more than twice as much here.
    """
    workload = AttentionWorkload(length=64)
    cuda = trace_step(workload, ADAMW, 8, cuda=True)
    assert cuda.forward_activation_bytes == 393216 + 131072 + 4096 + 2 * 512 + 512
    cpu = trace_step(workload, ADAMW, 8, cuda=False)
    assert cpu.forward_activation_bytes > 2 * cuda.forward_activation_bytes


def test_fused_attention_grows_with_the_sequence_not_its_square() -> None:
    short, long = (
        trace_step(AttentionWorkload(length=n), ADAMW, 8, cuda=True).forward_activation_bytes
        for n in (64, 128)
    )
    assert long == 2 * short - 3 * 512  # the seed, offset and loss do not grow
    cpu_short, cpu_long = (
        trace_step(AttentionWorkload(length=n), ADAMW, 8, cuda=False).forward_activation_bytes
        for n in (64, 128)
    )
    assert cpu_long > 3 * cpu_short


def test_bf16_attention_runs_flash_on_its_autocast_inputs_by_hand_count() -> None:
    """Under bf16 autocast, flash attention: the projection's bf16 output (q, k, v) 196608,
    the projection's input cast to bf16 and saved for its weight's gradient 65536, the bf16
    output 65536, the float32 log-sum-exp 4096, seed, offset and loss 3 x 512."""
    workload = AttentionWorkload(length=64, amp_dtype="bf16")
    cuda = trace_step(workload, ADAMW, 8, cuda=True)
    assert cuda.forward_activation_bytes == 196608 + 65536 + 65536 + 4096 + 3 * 512


def test_dropout_keeps_a_byte_mask_on_cuda_and_one_of_its_dtype_on_the_cpu() -> None:
    """16 x 128 float32 activations through dropout (the output itself is not kept: the sum's
    backward needs none): CUDA keeps a bool mask, 2048 bytes; the CPU a float one, 8192."""
    workload = DropoutWorkload()
    assert trace_step(workload, ADAMW, 16, cuda=True).forward_activation_bytes == 2048 + 512
    assert trace_step(workload, ADAMW, 16, cuda=False).forward_activation_bytes == 8192 + 4


@pytest.mark.parametrize(
    ("dtype", "heads_kv", "head_dim", "mask", "expected"),
    [
        (torch.float32, 4, 64, False, "efficient"),  # flash takes half precision only
        (torch.bfloat16, 4, 64, False, "flash"),
        (torch.float16, 4, 256, False, "flash"),
        (torch.bfloat16, 4, 64, True, "efficient"),  # flash takes no mask
        (torch.bfloat16, 4, 320, False, "efficient"),  # over flash's 256
        (torch.float32, 4, 30, False, "math"),  # not a multiple of 4
        (torch.float32, 2, 64, False, "math"),  # grouped heads: the memory-efficient takes none
    ],
)
def test_the_kernel_is_the_one_pytorch_picks_on_sm80_and_newer(
    dtype: torch.dtype, heads_kv: int, head_dim: int, mask: bool, expected: str
) -> None:
    q = torch.empty(2, 4, 16, head_dim, dtype=dtype)
    kv = torch.empty(2, heads_kv, 16, head_dim, dtype=dtype)
    attn_mask = torch.ones(16, 16, dtype=torch.bool) if mask else None
    assert cuda_backend(q, kv, kv, attn_mask) == expected


def test_the_functions_are_put_back_after_a_step_that_raised() -> None:
    sdpa, dropout = F.scaled_dot_product_attention, F.dropout
    with pytest.raises(ZeroDivisionError), cuda_kernels(True):
        assert F.scaled_dot_product_attention is not sdpa and F.dropout is not dropout
        raise ZeroDivisionError
    assert F.scaled_dot_product_attention is sdpa and F.dropout is dropout
    with cuda_kernels(False):
        assert F.scaled_dot_product_attention is sdpa


def test_a_checkpointed_layer_is_traced_as_cuda_runs_it_in_forward_and_in_its_recompute() -> None:
    """Non-reentrant checkpointing runs the layer again in backward and checks that it saved
    what the first run did: the kernels must be CUDA's in both runs (a byte mask against a
    float one, fused attention against the math path, fail the check)."""
    workload = CheckpointedAttentionWorkload(length=64)
    cuda = trace_step(workload, ADAMW, 8, cuda=True)
    cpu = trace_step(workload, ADAMW, 8, cuda=False)
    assert cuda.peak_bytes > 0 and cpu.peak_bytes > 0


def test_an_unaligned_mask_is_padded_once_as_given_not_per_batch_item_and_head() -> None:
    """A learned bias of 60 keys: SDPA pads it to aligned strides before it expands it, so the
    kernel keeps one padded copy of its own size, 1 x 2 x 60 x 64 floats (30720 bytes), not
    one per batch item and head; and the bias gets its gradient, as every parameter does."""
    workload = LearnedBiasWorkload()
    traced = trace_step(workload, ADAMW, 32, cuda=True)
    assert traced.gradient_bytes == traced.parameter_bytes
    plain = trace_step(AttentionWorkload(length=60, dropout=0.0), ADAMW, 32, cuda=True)
    extra = traced.forward_activation_bytes - plain.forward_activation_bytes
    assert 30720 <= extra < 2 * 30720 + 2048  # the padded copy (and no 32 x 2 x 60 x 64)


@pytest.mark.parametrize(
    ("heads_q", "heads_kv", "gqa", "expected"),
    [(8, 2, True, "flash"), (8, 2, False, "math"), (8, 3, True, "math"), (8, 8, False, "flash")],
)
def test_grouped_query_heads_run_flash_only_when_asked_and_when_they_divide(
    heads_q: int, heads_kv: int, gqa: bool, expected: str
) -> None:
    q = torch.empty(2, heads_q, 16, 64, dtype=torch.bfloat16)
    kv = torch.empty(2, heads_kv, 16, 64, dtype=torch.bfloat16)
    assert cuda_backend(q, kv, kv, enable_gqa=gqa) == expected


def test_another_thread_calls_pytorchs_own_functions_while_a_trace_runs() -> None:
    """The replacements act in the tracing thread only: a thread training beside it (real
    tensors) still goes through PyTorch's own ``F.dropout``."""
    import threading

    from torch.overrides import TorchFunctionMode

    class Seen(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.funcs: list[object] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.funcs.append(func)
            return func(*args, **(kwargs or {}))

    elsewhere, here = Seen(), Seen()

    def train_beside() -> None:
        with elsewhere:
            F.dropout(torch.ones(4), 0.5, True)

    with cuda_kernels(True):
        thread = threading.Thread(target=train_beside)
        thread.start()
        thread.join()
        with here:
            F.dropout(torch.ones(4), 0.5, True)
    assert torch.native_dropout not in elsewhere.funcs  # PyTorch's own F.dropout ran there
    assert torch.native_dropout in here.funcs
