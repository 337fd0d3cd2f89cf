"""What the plugin runs inside the engine, with no vLLM import: checks, cache views, write, attend.

vLLM hands each attention layer one int8 tensor per layer, ``[num_blocks, H, N, C]`` bytes, whose
page is exactly kvquant's INT8 page (``kvquant.page_bytes``), so vLLM's memory accounting and block
manager see the byte count they expect. Inside the page the arrangement is kvquant's (a
``kvquant.PagedKVCache`` over the engine's bytes: ``kvquant.cache_from_pages``), and the numerics
here are the fp32 torch reference's (``kvquant.reference``); ``_kernels`` serves the same pages
with kvquant's Triton kernels.
"""

from __future__ import annotations

import math

import torch

from .. import (
    SUPPORTED_BLOCK_SIZES,
    SUPPORTED_HEAD_SIZES,
    PagedKVCache,
    cache_from_pages,
    page_bytes,
)
from ..cache_dtypes import INT8_KV_CACHE_DTYPE as INT8_KV_CACHE_DTYPE
from ..reference import cache_write_ref, paged_attention_ref
from ._errors import UnsupportedConfigError


def wants_int8(kv_cache_dtype: object) -> bool:
    """Whether the engine's ``--kv-cache-dtype`` asks for the INT8 cache kvquant serves."""
    return kv_cache_dtype == INT8_KV_CACHE_DTYPE


def int8_content_bytes(head_size: int) -> int:
    """Bytes one (token, kv head) takes in the INT8 page: K and V codes and two fp32 scales."""
    return page_bytes(1, 1, head_size, torch.int8)


def check_attention_layer(
    *,
    head_size: int,
    head_size_v: int | None = None,
    use_mla: bool = False,
    use_sparse: bool = False,
    has_sink: bool = False,
    is_decoder: bool = True,
    has_alibi: bool = False,
) -> None:
    """Refuse, in one line, an attention layer that kvquant's INT8 cache cannot serve."""
    if use_mla:
        raise UnsupportedConfigError(
            "MLA models have a latent KV cache, not per-(token, kv-head) K and V; "
            f"{INT8_KV_CACHE_DTYPE} is not served for them"
        )
    if use_sparse:
        raise UnsupportedConfigError(f"sparse attention is not served with {INT8_KV_CACHE_DTYPE}")
    if head_size not in SUPPORTED_HEAD_SIZES:
        raise UnsupportedConfigError(
            f"head size {head_size} is not supported by kvquant's INT8 cache; "
            f"supported: {', '.join(map(str, SUPPORTED_HEAD_SIZES))}"
        )
    if head_size_v is not None and head_size_v != head_size:
        raise UnsupportedConfigError(
            f"K head size {head_size} differs from V head size {head_size_v}; "
            "kvquant's INT8 cache needs them equal"
        )
    if has_sink:
        raise UnsupportedConfigError(f"attention sinks are not served with {INT8_KV_CACHE_DTYPE}")
    if has_alibi:
        raise UnsupportedConfigError(f"ALiBi slopes are not served with {INT8_KV_CACHE_DTYPE}")
    if not is_decoder:
        raise UnsupportedConfigError(
            f"only decoder self-attention is served with {INT8_KV_CACHE_DTYPE} "
            "(no encoder or cross-attention)"
        )


def check_model(*, is_hybrid: bool, use_mla: bool) -> None:
    """Refuse hybrid (attention + state-space) and MLA models, whose caches are not K/V pages."""
    if is_hybrid:
        raise UnsupportedConfigError(
            "hybrid models (attention with Mamba/linear-attention state) are not served with "
            f"{INT8_KV_CACHE_DTYPE}: their pages mix attention K/V and recurrent state"
        )
    if use_mla:
        check_attention_layer(head_size=SUPPORTED_HEAD_SIZES[0], use_mla=True)


def check_block_size(block_size: int) -> None:
    """Refuse a kernel block size kvquant's page layout does not support."""
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise UnsupportedConfigError(
            f"block size {block_size} is not supported by kvquant's INT8 cache; "
            f"supported: {', '.join(map(str, SUPPORTED_BLOCK_SIZES))}"
        )


def cache_view(kv_cache: torch.Tensor, head_size: int) -> PagedKVCache:
    """kvquant's cache over vLLM's per-layer INT8 tensor ``[num_blocks, H, N, C]``, without a copy.

    Raises:
        UnsupportedConfigError: the tensor is not int8, its pages are not kvquant's byte count, or
            its pages are not dense (then reinterpreting them would read another block's bytes).
    """
    if kv_cache.dtype != torch.int8 or kv_cache.dim() != 4:
        raise UnsupportedConfigError(
            f"the engine gave a KV cache of {kv_cache.dtype} with shape {tuple(kv_cache.shape)}; "
            "expected int8 [num_blocks, num_kv_heads, block_size, bytes]"
        )
    num_blocks, num_kv_heads, block_size, content = kv_cache.shape
    if content != int8_content_bytes(head_size):
        raise UnsupportedConfigError(
            f"the engine's INT8 page holds {content} bytes per (token, kv head); kvquant's holds "
            f"{int8_content_bytes(head_size)} for head size {head_size}"
        )
    page = num_kv_heads * block_size * content
    if kv_cache.stride()[1:] != (block_size * content, content, 1) or (
        num_blocks > 1 and kv_cache.stride(0) < page
    ):
        raise UnsupportedConfigError(
            f"the engine's KV cache pages are not dense (strides {kv_cache.stride()}); "
            "kvquant needs each block's page in one piece"
        )
    pages = torch.as_strided(kv_cache, (num_blocks, page), (kv_cache.stride(0), 1))
    return cache_from_pages(pages, num_kv_heads, block_size, head_size)


def write(
    cache: PagedKVCache, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Quantize ``key``/``value [tokens, kv heads, head]`` into their slots (negative: skipped)."""
    num_slots = slot_mapping.shape[0]
    # The engine may pad key/value past the real tokens; slot_mapping covers exactly the real ones.
    cache_write_ref(cache, key[:num_slots], value[:num_slots], slot_mapping)


def attend(
    query: torch.Tensor,
    cache: PagedKVCache,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    softmax_scale: float,
    out: torch.Tensor,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> None:
    """Causal attention of each sequence's newest tokens over its INT8 pages, dequantized in fp32.

    ``query [tokens, q heads, head]``: sequence i owns rows ``query_start_loc[i]:[i + 1]``. The
    result is cast to ``out``'s dtype and written into ``out[:tokens]``. Sequences with one new
    token (decode) are attended together; longer ones (prefill chunks) one at a time by
    ``kvquant.reference.paged_attention_ref``.
    """
    num_tokens = int(query_start_loc[-1])
    if num_tokens > len(query):
        raise UnsupportedConfigError(
            f"the batch claims {num_tokens} query tokens but holds {len(query)}"
        )
    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    decode = torch.nonzero(query_lens == 1).flatten()
    if len(decode):
        rows = query_start_loc[:-1][decode]
        result = decode_attention(
            query[rows],
            cache,
            block_table[decode],
            seq_lens[decode],
            softmax_scale,
            sliding_window,
            softcap,
        )
        out[rows] = result.to(out.dtype)
    for i in torch.nonzero(query_lens > 1).flatten().tolist():
        begin, end = int(query_start_loc[i]), int(query_start_loc[i + 1])
        one = torch.tensor([0, end - begin])
        result = paged_attention_ref(
            query[begin:end],
            cache,
            block_table[i : i + 1],
            seq_lens[i : i + 1],
            one,
            softmax_scale,
            sliding_window,
            softcap,
        )
        out[begin:end] = result.to(out.dtype)


def decode_attention(
    query: torch.Tensor,
    cache: PagedKVCache,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """One new token per sequence, all sequences at once; fp32 ``[seqs, q heads, head]``.

    The same arithmetic as ``kvquant.reference.attention_ref`` for a query of length one (fp32
    dequantized K/V, softcap, causal window, softmax, the NaN policy), batched over sequences by
    padding every context to the longest: vLLM calls this once per layer and step, and a Python
    loop over sequences made the reference path ~6x slower than vLLM's own CPU attention.
    """
    num_seqs, num_q_heads, head_size = query.shape
    group = num_q_heads // cache.num_kv_heads
    longest = int(seq_lens.max())
    positions = torch.arange(longest)
    blocks = block_table.long()[:, positions // cache.block_size]  # [seqs, longest]
    offsets = positions % cache.block_size
    key = cache.k[blocks, :, offsets, :].float()  # [seqs, longest, kv heads, head]
    value = cache.v[blocks, :, :, offsets].float()
    if cache.is_quantized:
        assert cache.k_scale is not None and cache.v_scale is not None
        key = key * cache.k_scale[blocks, :, offsets][..., None]
        value = value * cache.v_scale[blocks, :, offsets][..., None]
    newest = seq_lens.long()[:, None] - 1
    visible = positions[None, :] <= newest  # [seqs, longest]: padding past each context is hidden
    if sliding_window is not None:
        visible &= positions[None, :] > newest - sliding_window
    q = query.float().view(num_seqs, cache.num_kv_heads, group, head_size)
    logits = torch.einsum("skgd,stkd->skgt", q, key) * softmax_scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logits = logits.masked_fill(~visible[:, None, None, :], -math.inf)
    probs = torch.softmax(logits, dim=-1)
    # NaN policy: a visible non-finite V poisons its sequence's output; padding never does.
    value_finite = torch.isfinite(value).all(dim=-1)  # [seqs, longest, kv heads]
    clean = torch.where((value_finite & visible[..., None])[..., None], value, 0.0)
    out = torch.einsum("skgt,stkd->skgd", probs, clean)
    poisoned = (~value_finite & visible[..., None]).any(dim=1)  # [seqs, kv heads]
    out = out.masked_fill(poisoned[:, :, None, None], math.nan)
    return out.reshape(num_seqs, num_q_heads, head_size)
