"""`decode_attention`: one decode call, checked, through the `DecodePlan` of its shapes."""

from __future__ import annotations

import torch

from ..._cache import PagedKVCache
from ..._errors import InvalidInputError
from .._common import check_runnable
from .._paged_tiles import check_attention_inputs, check_block_table, index_tensor
from .config import DecodeConfig
from .plan import plan_decode


def decode_attention(
    query: torch.Tensor,
    cache: PagedKVCache,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    out: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    validate: bool = True,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """Attention of one new query token per sequence over its paged K/V.

    Launches through the `DecodePlan` of the call's shapes (`plan_decode`, cached), with split
    partials allocated per call; a caller that launches the same shapes repeatedly, or inside a
    CUDA/HIP graph, holds the plan and its scratch itself (`DecodePlan.run`).

    Args:
        query: ``[num_seqs, num_q_heads, head_size]`` fp16/bf16; query head h uses kv head
            ``h // (num_q_heads // num_kv_heads)``.
        block_table: int32 ``[num_seqs, max_pages]``: page i of a sequence holds its keys
            ``i * block_size ...``.
        seq_lens: ``[num_seqs]`` keys per sequence (>= 1), the query token's own included.
        sliding_window: attend only the newest ``sliding_window`` keys.
        softcap: logits become ``softcap * tanh(logits / softcap)``.
        max_seq_len: upper bound of seq_lens, sizes split-KV; read from seq_lens if None. Keys
            past it are not attended.
        num_splits: force a split-KV count (tests); chosen by ``choose_num_splits`` if None.
        validate: check seq_lens and block_table on the device first (one host sync).
        config: the launch shape (sweeps); `decode_config`'s if None.

    Returns:
        ``out`` (allocated if None), ``[num_seqs, num_q_heads, head_size]`` in query's dtype.
    """
    check_attention_inputs(
        query, cache, block_table, seq_lens, softmax_scale, sliding_window, softcap, out
    )
    num_seqs = seq_lens.shape[0]
    if query.shape[0] != num_seqs:
        raise InvalidInputError(
            f"`query` has {query.shape[0]} tokens; decode expects one per sequence ({num_seqs})"
        )
    if validate:
        checked_max = check_block_table(cache, block_table, seq_lens)
        if num_seqs and int(seq_lens.min()) < 1:
            raise InvalidInputError("`seq_lens` holds 0; decode needs >= 1 key per sequence")
        if max_seq_len is not None and checked_max > max_seq_len:
            raise InvalidInputError(
                f"`max_seq_len` is {max_seq_len}; `seq_lens` holds {checked_max}"
            )
        max_seq_len = checked_max if max_seq_len is None else max_seq_len
    check_runnable("query", query)
    result = out if out is not None else torch.empty_like(query)
    if num_seqs == 0:
        return result
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    plan = plan_decode(
        num_seqs=num_seqs,
        max_seq_len=max(max_seq_len, 1),
        num_q_heads=query.shape[1],
        num_kv_heads=cache.num_kv_heads,
        head_size=cache.head_size,
        block_size=cache.block_size,
        model_dtype=query.dtype,
        cache_dtype=cache.dtype,
        device=query.device,
        out_dtype=result.dtype,
        sliding_window=sliding_window,
        num_splits=num_splits,
        config=config,
    )
    seq_lens = index_tensor(seq_lens)
    return plan.run(query, cache, block_table, seq_lens, softmax_scale, softcap=softcap, out=result)
