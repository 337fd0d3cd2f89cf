"""Plain torch fp32 references for every kernel, written for clarity rather than speed.

The tests compare the kernels with these, and the accuracy stage uses them on CPU. The numerics
are upstream vLLM's ``int8_per_token_head``: per (token, kv head) vector,
``scale = max(absmax / 127, 1e-6)`` in fp32, ``code = round_half_away_from_zero(x * (1 / scale))``
clamped to [-128, 127].

NaN/inf policy (the kernels follow it): a vector that holds any NaN or inf is stored with scale
NaN and all-zero codes, so it dequantizes to NaN and never to finite garbage. Attention outputs
that attend such a token are NaN; every other output, head and token is unaffected. A 16-bit
cache stores values as given.
"""

from __future__ import annotations

import math

import torch

from ._cache import PagedKVCache

SCALE_FLOOR = 1e-6
CODE_MIN = -128
CODE_MAX = 127


def round_half_away_from_zero(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest integer, ties away from zero; exact for any fp32 input."""
    whole = torch.trunc(x)
    fraction = x - whole  # exact in fp32
    step = torch.where(fraction.abs() >= 0.5, torch.sign(x), torch.zeros_like(x))
    return whole + step


def quantize_per_token_head(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., head_size]`` per vector; returns (int8 codes, fp32 scales [...])."""
    x32 = x.float()
    absmax = x32.abs().amax(dim=-1)
    # Divide by a tensor, not a Python scalar: on CUDA torch turns `t / 127.0` into a multiply by
    # fl(1/127), which differs from the correctly rounded quotient for ~4% of inputs; the kernels
    # and upstream divide exactly.
    scale = torch.clamp(absmax / torch.full_like(absmax, float(CODE_MAX)), min=SCALE_FLOOR)
    inverse = 1.0 / scale
    codes = round_half_away_from_zero(x32 * inverse[..., None]).clamp(CODE_MIN, CODE_MAX)
    finite = torch.isfinite(x32).all(dim=-1)
    codes = torch.where(finite[..., None], codes, torch.zeros_like(codes))
    scale = torch.where(finite, scale, torch.full_like(scale, math.nan))
    return codes.to(torch.int8), scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """codes ``[..., head_size]`` int8 times scale ``[...]`` fp32 -> fp32."""
    return codes.float() * scale[..., None]


def cache_write_ref(
    cache: PagedKVCache, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write ``key``/``value [num_tokens, num_kv_heads, head_size]`` into ``cache`` in place.

    ``slot_mapping[i]`` is ``block * block_size + offset``; a negative slot is padding and skipped.
    """
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    blocks, offsets = slots // cache.block_size, slots % cache.block_size
    key, value = key[keep], value[keep]
    if cache.is_quantized:
        assert cache.k_scale is not None and cache.v_scale is not None
        k_codes, k_scale = quantize_per_token_head(key)
        v_codes, v_scale = quantize_per_token_head(value)
        cache.k_scale[blocks, :, offsets] = k_scale
        cache.v_scale[blocks, :, offsets] = v_scale
    else:
        k_codes, v_codes = key.to(cache.dtype), value.to(cache.dtype)
    cache.k[blocks, :, offsets, :] = k_codes
    cache.v[blocks, :, :, offsets] = v_codes


def gather_kv(
    cache: PagedKVCache, block_table_row: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's dequantized K and V, fp32 ``[seq_len, num_kv_heads, head_size]``."""
    positions = torch.arange(seq_len, device=cache.device)
    blocks = block_table_row.long()[positions // cache.block_size]
    offsets = positions % cache.block_size
    k = cache.k[blocks, :, offsets, :].float()
    v = cache.v[blocks, :, :, offsets].float()
    if cache.is_quantized:
        assert cache.k_scale is not None and cache.v_scale is not None
        k = k * cache.k_scale[blocks, :, offsets][..., None]
        v = v * cache.v_scale[blocks, :, offsets][..., None]
    return k, v


def attention_ref(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    softmax_scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    *,
    values_finite: bool = False,
) -> torch.Tensor:
    """Causal attention of the last ``q_len`` positions of one sequence over all its keys.

    Args:
        query: ``[q_len, num_q_heads, head_size]``, the newest q_len tokens.
        key, value: ``[seq_len, num_kv_heads, head_size]``, seq_len >= q_len; each kv head serves
            ``num_q_heads // num_kv_heads`` consecutive query heads.
        sliding_window: a query at position p sees keys p - sliding_window < j <= p.
        softcap: logits become ``softcap * tanh(logits / softcap)``.
        values_finite: the caller knows ``value`` holds no NaN or inf. The NaN policy's
            bookkeeping then changes no output and is skipped: the same result, several times
            faster for one query over a long CPU cache (kvbench's decode steps).

    Returns:
        fp32 ``[q_len, num_q_heads, head_size]``.
    """
    q_len, num_q_heads, _ = query.shape
    seq_len, num_kv_heads, _ = key.shape
    group = num_q_heads // num_kv_heads
    k = key.float().repeat_interleave(group, dim=1)  # [seq_len, num_q_heads, head_size]
    v = value.float().repeat_interleave(group, dim=1)
    logits = torch.einsum("qhd,khd->hqk", query.float(), k) * softmax_scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    # The newest query alone, without a window, sees every key: a mask would hide nothing.
    masked = q_len > 1 or sliding_window is not None
    if masked or not values_finite:
        q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)[:, None]
        k_pos = torch.arange(seq_len, device=query.device)[None, :]
        visible = k_pos <= q_pos
        if sliding_window is not None:
            visible &= k_pos > q_pos - sliding_window
    if masked:
        logits = logits.masked_fill(~visible, -math.inf)
    probs = torch.softmax(logits, dim=-1)  # [num_q_heads, q_len, seq_len]
    if values_finite:
        return torch.einsum("hqk,khd->qhd", probs, v)
    # NaN policy: a non-finite value poisons exactly the outputs that can see its token.
    v_finite = torch.isfinite(v).all(dim=-1)  # [seq_len, num_q_heads]
    out = torch.einsum("hqk,khd->qhd", probs, torch.where(v_finite[..., None], v, 0.0))
    sees_bad_value = torch.einsum("qk,kh->qh", visible.float(), (~v_finite).float()) > 0
    return out.masked_fill(sees_bad_value[..., None], math.nan)


def paged_attention_ref(
    query: torch.Tensor,
    cache: PagedKVCache,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    softmax_scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Reference for decode and prefill over the paged cache, one sequence at a time.

    Args:
        query: ``[total_q, num_q_heads, head_size]``; sequence i owns rows
            ``cu_seqlens_q[i]:cu_seqlens_q[i + 1]``, the newest tokens of its ``seq_lens[i]``.
    """
    out = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    starts = cu_seqlens_q.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        begin, end = starts[i], starts[i + 1]
        if begin == end:
            continue
        key, value = gather_kv(cache, block_table[i], seq_len)
        out[begin:end] = attention_ref(
            query[begin:end], key, value, softmax_scale, sliding_window, softcap
        )
    return out
