"""`prefill_attention`: one causal varlen (chunked) prefill call, checked, through its plan."""

from __future__ import annotations

import torch

from ..._cache import PagedKVCache
from .kernels import PrefillConfig
from .plan import plan_prefill
from .workspace import WORKSPACE_LIMIT_BYTES


def prefill_attention(
    query: torch.Tensor,
    cache: PagedKVCache,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    softmax_scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    out: torch.Tensor | None = None,
    config: PrefillConfig | None = None,
    workspace_limit_bytes: int = WORKSPACE_LIMIT_BYTES,
) -> torch.Tensor:
    """Causal varlen (chunked) prefill over the paged cache; the new tokens must be written first.

    Sequence i's queries are rows ``cu_seqlens_q[i]:cu_seqlens_q[i + 1]`` of ``query``, its newest
    ``q_len_i`` tokens; each attends the cached prefix and the new tokens up to itself.

    Args:
        query: ``[total_q, num_q_heads, head_size]`` fp16/bf16.
        seq_lens: ``[num_seqs]`` keys per sequence (prefix plus new tokens), ``>= q_len_i``.
        cu_seqlens_q: int32/int64 ``[num_seqs + 1]``, starts at 0, non-decreasing.
        config: the launch shape (benchmarks sweep it); None: `prefill_config`'s.
        workspace_limit_bytes: INT8 cache: the largest fp16 workspace the prefill may allocate
            (`workspace`); past it, or at 0, the prefill reads the INT8 pages itself
            (fused).

    Returns:
        ``out`` (allocated if None), ``[total_q, num_q_heads, head_size]`` in query's dtype.
    """
    plan = plan_prefill(
        query,
        cache,
        block_table,
        seq_lens,
        cu_seqlens_q,
        softmax_scale,
        sliding_window=sliding_window,
        softcap=softcap,
        out=out,
        config=config,
        workspace_limit_bytes=workspace_limit_bytes,
    )
    return plan.run()
