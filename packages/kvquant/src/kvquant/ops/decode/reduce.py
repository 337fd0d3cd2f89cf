"""The split-KV reducer of the decode: a decode of more than one split writes each split's
unnormalised partial result (`kernels`), and ``_reduce_splits_kernel`` combines them into
the output, one program per (sequence, query head); `reduce_spec` says what compiles.
"""

# mypy: disable-error-code="no-untyped-def"
# (@triton.jit kernels take Triton tensors and constexprs, which have no Python types.)

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .._common import KernelSpec, make_spec, next_power_of_2
from .._paged_tiles import attention_types

# Splits the reducer combines per step; the split count itself is a runtime argument.
_SPLIT_TILE = 16


@triton.jit(do_not_specialize=["num_splits"])
def _reduce_splits_kernel(
    out_ptr,  # [num_seqs, num_q_heads, head_size] query dtype
    partial_acc_ptr,  # [num_seqs, num_q_heads, num_splits, head_size] fp32
    partial_max_ptr,  # [num_seqs, num_q_heads, num_splits] fp32, log2 units
    partial_sum_ptr,  # [num_seqs, num_q_heads, num_splits] fp32
    num_splits,
    head_size,  # a multiple of 16, <= HEAD_PAD
    stride_o_t: tl.int64,
    stride_o_h: tl.int64,
    HEAD_PAD: tl.constexpr,
    SPLIT_TILE: tl.constexpr,
):
    """One (sequence, query head): combine the splits' partial results in one pass.

    Each step loads SPLIT_TILE splits' max, sum and accumulator together and rescales what came
    before to the new running max, so the common case (at most SPLIT_TILE splits) waits for one
    round of loads, not two.
    """
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLIT_TILE)
    dims = tl.arange(0, HEAD_PAD)
    base = (token * tl.num_programs(1) + head) * num_splits
    running_max = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], tl.float32)
    result = tl.zeros([HEAD_PAD], tl.float32)
    for start in range(0, num_splits, SPLIT_TILE):
        split_valid = start + splits < num_splits
        index = base + start + splits
        split_max = tl.load(partial_max_ptr + index, mask=split_valid, other=float("-inf"))
        split_sum = tl.load(partial_sum_ptr + index, mask=split_valid, other=0.0)
        split_acc = tl.load(
            partial_acc_ptr + index[:, None] * head_size + dims[None, :],
            mask=split_valid[:, None] & (dims[None, :] < head_size),
            other=0.0,
        )
        new_max = tl.maximum(running_max, tl.max(split_max, axis=0))
        # Every split so far empty (max -inf): any finite reference keeps the weights at 0.
        reference = tl.where(new_max == float("-inf"), 0.0, new_max)
        correction = tl.exp2(running_max - reference)
        weight = tl.exp2(split_max - reference)  # an empty split has max -inf: weight 0
        total = total * correction + tl.sum(split_sum * weight, axis=0)
        result = result * correction + tl.sum(split_acc * weight[:, None], axis=0)
        running_max = new_max
    tl.store(
        out_ptr + token * stride_o_t + head * stride_o_h + dims,
        (result / total).to(out_ptr.dtype.element_ty),
        mask=dims < head_size,
    )


@functools.cache
def reduce_spec(
    *, head_size: int, model_dtype: torch.dtype, out_dtype: torch.dtype | None = None
) -> KernelSpec:
    """The split reducer the launcher compiles (the same on every target)."""
    types = attention_types(
        _reduce_splits_kernel, model_dtype, model_dtype, out_dtype or model_dtype
    )
    constexprs: dict[str, int | float | bool] = {
        "HEAD_PAD": next_power_of_2(head_size),
        "SPLIT_TILE": _SPLIT_TILE,
    }
    return make_spec(
        "reduce_splits", _reduce_splits_kernel, types, constexprs, num_warps=4, num_stages=1
    )
