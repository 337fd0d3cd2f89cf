"""Random paged batches shared by the correctness stage, the tests and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._cache import PagedKVCache, allocate_cache
from .ops.cache_write import cache_write


@dataclass(frozen=True)
class PagedBatch:
    """Sequences whose K/V are already in a paged cache, plus their newest query tokens.

    Attributes:
        cache: the paged cache holding every sequence's keys.
        key, value: the unquantized K/V written, ``[total_keys, num_kv_heads, head_size]``,
            sequence after sequence.
        query: ``[total_q, num_q_heads, head_size]``; the newest q_lens[i] tokens of sequence i.
        block_table: int32 ``[num_seqs, max_pages]``; pages are shuffled across sequences.
        seq_lens: int32 ``[num_seqs]``.
        cu_seqlens_q: int32 ``[num_seqs + 1]``.
        cu_seqlens_k: int32 ``[num_seqs + 1]``, rows of ``key``/``value``.
    """

    cache: PagedKVCache
    key: torch.Tensor
    value: torch.Tensor
    query: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor


def _cumsum(lengths: list[int], device: torch.device | str) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def make_paged_batch(
    *,
    seq_lens: list[int],
    q_lens: list[int] | None = None,
    num_kv_heads: int,
    group: int,
    head_size: int,
    block_size: int,
    cache_dtype: torch.dtype,
    model_dtype: torch.dtype,
    device: torch.device | str,
    generator: torch.Generator,
    spare_blocks: int = 3,
) -> PagedBatch:
    """Draw N(0, 1) K/V/queries, write K/V through the cache-write kernel, shuffle the pages.

    ``q_lens`` defaults to one query token per sequence (decode). The cache gets
    ``spare_blocks`` unused pages filled with random bytes, so a wrong page index reads garbage.
    """
    q_lens = [1] * len(seq_lens) if q_lens is None else q_lens
    pages_per_seq = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(pages_per_seq) + spare_blocks
    cache = allocate_cache(num_blocks, num_kv_heads, head_size, block_size, cache_dtype, device)
    _fill_random(cache.pages, generator)
    order = torch.randperm(num_blocks, generator=generator, device="cpu").tolist()
    max_pages = max(pages_per_seq, default=0) + 1
    # Unused block_table entries hold a valid page, as engines pad them.
    table = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32)
    slots: list[int] = []
    used = 0
    for i, n in enumerate(seq_lens):
        pages = order[used : used + pages_per_seq[i]]
        used += pages_per_seq[i]
        table[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        slots += [pages[p // block_size] * block_size + p % block_size for p in range(n)]
    total_keys = sum(seq_lens)
    shape = (total_keys, num_kv_heads, head_size)
    key = torch.randn(shape, generator=generator, dtype=torch.float32).to(model_dtype)
    value = torch.randn(shape, generator=generator, dtype=torch.float32).to(model_dtype)
    query = torch.randn(
        (sum(q_lens), num_kv_heads * group, head_size), generator=generator, dtype=torch.float32
    ).to(model_dtype)
    key, value, query = key.to(device), value.to(device), query.to(device)
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=device)
    cache_write(cache, key, value, slot_mapping)
    return PagedBatch(
        cache=cache,
        key=key,
        value=value,
        query=query,
        block_table=table.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        cu_seqlens_q=_cumsum(q_lens, device),
        cu_seqlens_k=_cumsum(seq_lens, device),
    )


def _fill_random(pages: torch.Tensor, generator: torch.Generator) -> None:
    """Random bytes (int8) or values (16-bit) everywhere, so nothing unwritten looks valid."""
    if pages.dtype == torch.int8:
        values = torch.randint(-128, 128, pages.shape, generator=generator, dtype=torch.int8)
    else:
        values = torch.randn(pages.shape, generator=generator).to(pages.dtype)
    pages.copy_(values)
