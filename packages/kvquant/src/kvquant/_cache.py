"""The paged KV cache: allocation, its in-page layout and conversion to upstream vLLM's layout.

One page (block) holds ``block_size`` token slots for every kv head. An INT8 page takes exactly the
bytes of upstream vLLM's ``int8_per_token_head`` page, ``block_size * num_kv_heads * (2 * head_size
+ 8)``, but arranged for aligned tile loads instead of upstream's interleaved 264-byte records::

    [ K codes  int8 [num_kv_heads, block_size, head_size]   ]  token-major: a K tile is one read
    [ V codes  int8 [num_kv_heads, head_size, block_size]   ]  transposed: the P.V reduction axis
                                                               (tokens) is contiguous, like K's
    [ K scales fp32 [num_kv_heads, block_size]              ]  kept apart so codes stay 16-byte
    [ V scales fp32 [num_kv_heads, block_size]              ]  aligned

A 16-bit page holds the same K and V arrangement in fp16/bf16 with no scales; it is the baseline
that INT8 has to beat, so the two differ only in quantization.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._errors import InvalidInputError

# The kernels take both sizes as runtime values marked as multiples of 16 (ops._common), and
# split a slot or key position into page and offset by shifting: block sizes are powers of two.
SUPPORTED_HEAD_SIZES = (64, 80, 96, 128, 256)
SUPPORTED_BLOCK_SIZES = (16, 32, 64)
CACHE_DTYPES = (torch.int8, torch.float16, torch.bfloat16)
# Upstream stores each scale as 4 fp32 bytes right after the codes it belongs to.
_SCALE_BYTES = 4


@dataclass(frozen=True)
class PagedKVCache:
    """One layer's paged K/V cache; every tensor is a view of ``pages``.

    Attributes:
        pages: the storage, ``[num_blocks, page_elems]``; int8 bytes or 16-bit values.
        k: K codes or values, ``[num_blocks, num_kv_heads, block_size, head_size]``.
        v: V codes or values, transposed within the page, ``[num_blocks, num_kv_heads,
            head_size, block_size]``.
        k_scale: fp32 ``[num_blocks, num_kv_heads, block_size]``; None for a 16-bit cache.
        v_scale: as ``k_scale``, for V.
    """

    pages: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None

    @property
    def dtype(self) -> torch.dtype:
        """torch.int8 for a quantized cache, else the 16-bit element type."""
        return self.pages.dtype

    @property
    def is_quantized(self) -> bool:
        return self.pages.dtype == torch.int8

    @property
    def num_blocks(self) -> int:
        return int(self.k.shape[0])

    @property
    def num_kv_heads(self) -> int:
        return int(self.k.shape[1])

    @property
    def block_size(self) -> int:
        return int(self.k.shape[2])

    @property
    def head_size(self) -> int:
        return int(self.k.shape[3])

    @property
    def device(self) -> torch.device:
        return self.pages.device


def page_bytes(num_kv_heads: int, block_size: int, head_size: int, dtype: torch.dtype) -> int:
    """Bytes of one page; for int8 this equals upstream vLLM's int8_per_token_head page."""
    if dtype == torch.int8:
        return num_kv_heads * block_size * (2 * head_size + 2 * _SCALE_BYTES)
    return num_kv_heads * block_size * 2 * head_size * dtype.itemsize


def _check_geometry(num_blocks: int, num_kv_heads: int, head_size: int, block_size: int) -> None:
    if num_blocks < 1:
        raise InvalidInputError(f"`num_blocks` is {num_blocks}; expected at least 1")
    if num_kv_heads < 1:
        raise InvalidInputError(f"`num_kv_heads` is {num_kv_heads}; expected at least 1")
    if head_size not in SUPPORTED_HEAD_SIZES:
        raise InvalidInputError(
            f"`head_size` is {head_size}; expected one of {SUPPORTED_HEAD_SIZES}"
        )
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise InvalidInputError(
            f"`block_size` is {block_size}; expected one of {SUPPORTED_BLOCK_SIZES}"
        )


def cache_from_pages(
    pages: torch.Tensor, num_kv_heads: int, block_size: int, head_size: int
) -> PagedKVCache:
    """One layer's cache over existing page storage, without a copy (an engine's KV tensor).

    Args:
        pages: ``[num_blocks, page_elems]``, int8 bytes or 16-bit values, each page contiguous
            (the pages themselves may lie any distance apart);
            ``page_elems = page_bytes(num_kv_heads, block_size, head_size, pages.dtype) //
            pages.dtype.itemsize``.
    """
    if pages.dim() != 2 or pages.dtype not in CACHE_DTYPES:
        raise InvalidInputError(
            f"`pages` is {pages.dtype} with {pages.dim()} dims; expected one of {CACHE_DTYPES} "
            "[num_blocks, page_elems]"
        )
    _check_geometry(pages.shape[0], num_kv_heads, head_size, block_size)
    elems = page_bytes(num_kv_heads, block_size, head_size, pages.dtype) // pages.dtype.itemsize
    if pages.shape[1] != elems or pages.stride(1) != 1:
        raise InvalidInputError(
            f"`pages` has pages of {pages.shape[1]} elements at stride {pages.stride(1)}; expected "
            f"{elems} contiguous ones for {num_kv_heads} kv heads, block size {block_size} and "
            f"head size {head_size}"
        )
    n = pages.shape[0]
    codes = num_kv_heads * block_size * head_size
    k = pages[:, :codes].view(n, num_kv_heads, block_size, head_size)
    v = pages[:, codes : 2 * codes].view(n, num_kv_heads, head_size, block_size)
    if pages.dtype != torch.int8:
        return PagedKVCache(pages, k, v, None, None)
    scale_bytes = num_kv_heads * block_size * _SCALE_BYTES
    start = 2 * codes
    k_scale = pages[:, start : start + scale_bytes].view(torch.float32)
    v_scale = pages[:, start + scale_bytes : start + 2 * scale_bytes].view(torch.float32)
    return PagedKVCache(
        pages,
        k,
        v,
        k_scale.view(n, num_kv_heads, block_size),
        v_scale.view(n, num_kv_heads, block_size),
    )


def allocate_cache(
    num_blocks: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int = 16,
    dtype: torch.dtype = torch.int8,
    device: torch.device | str = "cpu",
) -> PagedKVCache:
    """Allocate one layer's cache, zero-filled.

    Args:
        dtype: torch.int8 for the quantized cache, or torch.float16 / torch.bfloat16 for the
            16-bit baseline.
    """
    _check_geometry(num_blocks, num_kv_heads, head_size, block_size)
    if dtype not in CACHE_DTYPES:
        raise InvalidInputError(f"`dtype` is {dtype}; expected one of {CACHE_DTYPES}")
    elems = page_bytes(num_kv_heads, block_size, head_size, dtype) // dtype.itemsize
    pages = torch.zeros(num_blocks, elems, dtype=dtype, device=device)
    return cache_from_pages(pages, num_kv_heads, block_size, head_size)


def to_upstream_layout(cache: PagedKVCache) -> torch.Tensor:
    """Copy an INT8 cache into upstream vLLM's record layout, bit for bit.

    Returns:
        int8 ``[num_blocks, block_size, num_kv_heads, 2 * head_size + 8]``: per (slot, kv head) a
        record of K codes, K scale (4 bytes), V codes, V scale (4 bytes).
    """
    if not cache.is_quantized or cache.k_scale is None or cache.v_scale is None:
        raise InvalidInputError(f"`cache` has dtype {cache.dtype}; expected an int8 cache")
    n, h, b, d = cache.num_blocks, cache.num_kv_heads, cache.block_size, cache.head_size
    records = torch.empty(n, b, h, 2 * d + 2 * _SCALE_BYTES, dtype=torch.int8, device=cache.device)
    half = d + _SCALE_BYTES
    records[..., :d] = cache.k.permute(0, 2, 1, 3)
    records[..., d:half] = _scale_bytes(cache.k_scale)
    records[..., half : half + d] = cache.v.permute(0, 3, 1, 2)
    records[..., half + d :] = _scale_bytes(cache.v_scale)
    return records


def _scale_bytes(scale: torch.Tensor) -> torch.Tensor:
    """fp32 [n, h, b] -> its raw bytes as int8 [n, b, h, 4]."""
    n, h, b = scale.shape
    return scale.permute(0, 2, 1).contiguous().view(torch.int8).view(n, b, h, _SCALE_BYTES)


def from_upstream_layout(records: torch.Tensor) -> PagedKVCache:
    """Build an INT8 cache from upstream vLLM's record layout, bit for bit.

    Args:
        records: int8 ``[num_blocks, block_size, num_kv_heads, 2 * head_size + 8]``.
    """
    if records.dtype != torch.int8 or records.dim() != 4:
        raise InvalidInputError(
            f"`records` is {records.dtype} with {records.dim()} dims; expected int8 "
            "[num_blocks, block_size, num_kv_heads, 2 * head_size + 8]"
        )
    n, b, h, record = records.shape
    d = (record - 2 * _SCALE_BYTES) // 2
    _check_geometry(n, h, d, b)
    cache = allocate_cache(n, h, d, b, torch.int8, records.device)
    assert cache.k_scale is not None and cache.v_scale is not None
    half = d + _SCALE_BYTES
    cache.k.copy_(records[..., :d].permute(0, 2, 1, 3))
    cache.v.copy_(records[..., half : half + d].permute(0, 2, 3, 1))
    cache.k_scale.copy_(_scale_floats(records[..., d:half]))
    cache.v_scale.copy_(_scale_floats(records[..., half + d :]))
    return cache


def _scale_floats(raw: torch.Tensor) -> torch.Tensor:
    """int8 [n, b, h, 4] raw bytes -> fp32 [n, h, b]."""
    return raw.contiguous().view(torch.float32).squeeze(-1).permute(0, 2, 1)
