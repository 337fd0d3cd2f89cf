"""What the attention tests share: paged batches of random data, the kernels' outputs poisoned
with NaN first, decode plans of a batch's geometry, the fp32 reference on the same (dequantized)
cache, and the check between them.

The reference reads the same cache, so the tolerances (`kvquant check`'s own) measure kernel
error only; the quantization error is checked separately against the unquantized K/V.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kvquant import DecodePlan, decode_attention, plan_decode, prefill_attention
from kvquant import reference as ref
from kvquant._batch import PagedBatch, make_paged_batch
from kvquant._check import ATTENTION_TOLERANCE, BASELINE_TOLERANCE

__all__ = [
    "ATTENTION_TOLERANCE",
    "BASELINE_TOLERANCE",
    "assert_close",
    "decode_out",
    "mixed_lens",
    "paged_batch",
    "plan_for",
    "prefill_out",
    "reference_out",
    "rel_l2",
]


def rel_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected.double()).norm() / expected.double().norm())


def paged_batch(
    seq_lens: list[int],
    device: torch.device,
    gen: torch.Generator,
    *,
    head_size: int = 64,
    block_size: int = 16,
    group: int = 4,
    cache_dtype: torch.dtype = torch.int8,
    model_dtype: torch.dtype = torch.bfloat16,
    q_lens: list[int] | None = None,
) -> PagedBatch:
    return make_paged_batch(
        seq_lens=seq_lens,
        q_lens=q_lens,
        num_kv_heads=2,
        group=group,
        head_size=head_size,
        block_size=block_size,
        cache_dtype=cache_dtype,
        model_dtype=model_dtype,
        device=device,
        generator=gen,
    )


def decode_out(
    batch: PagedBatch, out_dtype: torch.dtype = torch.float32, **kwargs: object
) -> torch.Tensor:
    out = torch.full(batch.query.shape, math.nan, dtype=out_dtype, device=batch.query.device)
    scale = batch.query.shape[-1] ** -0.5
    decode_attention(
        batch.query,
        batch.cache,
        batch.block_table,
        batch.seq_lens,
        scale,
        out=out,
        **kwargs,  # type: ignore[arg-type]
    )
    return out


def prefill_out(batch: PagedBatch, **kwargs: object) -> torch.Tensor:
    out = torch.full(batch.query.shape, math.nan, dtype=torch.float32, device=batch.query.device)
    scale = batch.query.shape[-1] ** -0.5
    prefill_attention(
        batch.query,
        batch.cache,
        batch.block_table,
        batch.seq_lens,
        batch.cu_seqlens_q,
        scale,
        out=out,
        **kwargs,  # type: ignore[arg-type]
    )
    return out


def reference_out(
    batch: PagedBatch, window: int | None = None, softcap: float | None = None
) -> torch.Tensor:
    return ref.paged_attention_ref(
        batch.query,
        batch.cache,
        batch.block_table,
        batch.seq_lens,
        batch.cu_seqlens_q,
        batch.query.shape[-1] ** -0.5,
        window,
        softcap,
    )


def assert_close(out: torch.Tensor, expected: torch.Tensor, tolerance: float) -> None:
    assert not out.isnan().any(), "an output element was not written (poisoned with NaN)"
    error = rel_l2(out, expected)
    assert error <= tolerance, f"relative L2 {error:.2e} > {tolerance:.0e}"


def mixed_lens(block_size: int, long: int) -> list[int]:
    return [1, block_size - 1, block_size + 1, long]


def plan_for(batch: PagedBatch, max_seq_len: int, **kwargs: Any) -> DecodePlan:
    """The decode plan of ``batch``'s geometry and size, for sequences up to ``max_seq_len``."""
    query, cache = batch.query, batch.cache
    return plan_decode(
        num_seqs=query.shape[0],
        max_seq_len=max_seq_len,
        num_q_heads=query.shape[1],
        num_kv_heads=cache.num_kv_heads,
        head_size=cache.head_size,
        block_size=cache.block_size,
        model_dtype=query.dtype,
        cache_dtype=cache.dtype,
        device=query.device,
        **kwargs,
    )
