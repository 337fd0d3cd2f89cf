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

import functools
from dataclasses import dataclass
from typing import Any

import torch

from ._errors import InvalidInputError
from .cache_dtypes import CACHE_DTYPES, KERNELS

# The kernels take both sizes as runtime values marked as multiples of 16 (ops._common), and
# split a slot or key position into page and offset by shifting: block sizes are powers of two.
SUPPORTED_HEAD_SIZES = (64, 80, 96, 128, 256)
SUPPORTED_BLOCK_SIZES = (16, 32, 64)
# The element dtypes of a page: the kernels' caches that fix one (`cache_dtypes`).
PAGE_DTYPES = tuple(
    getattr(torch, row.torch_dtype)
    for row in CACHE_DTYPES
    if KERNELS in row.paths and row.torch_dtype is not None
)
# The model dtypes the kernels take (queries, keys and values, outputs).
ACTIVATION_DTYPES = (torch.float16, torch.bfloat16)
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

    @functools.cached_property
    def launch_pointers(self) -> tuple[int, int, int, int]:
        """The addresses of K, V and their scales (a 16-bit cache's K in place of scales), as
        the kernels' direct launches pass them; made once per cache."""
        k_scale = self.k if self.k_scale is None else self.k_scale
        v_scale = self.k if self.v_scale is None else self.v_scale
        return (self.k.data_ptr(), self.v.data_ptr(), k_scale.data_ptr(), v_scale.data_ptr())

    @functools.cached_property
    def launch_strides(self) -> tuple[int, int, int, int, int, int]:
        """The page and head strides of K, V and the scales, in that order."""
        args = self.kernel_arguments
        return tuple(  # type: ignore[return-value]
            args[name]
            for name in (
                "stride_k_b", "stride_k_h", "stride_v_b", "stride_v_h", "stride_s_b", "stride_s_h"
            )
        )  # fmt: skip

    @functools.cached_property
    def kernel_arguments(self) -> dict[str, object]:
        """The attention kernels' cache arguments by name: K, V, their scales (a 16-bit cache's
        K, never read, in place of scales) and the page and head strides of each. Made once per
        cache: an engine's layers pass them on every step."""
        k_scale = self.k if self.k_scale is None else self.k_scale
        v_scale = self.k if self.v_scale is None else self.v_scale
        return {
            "k_ptr": self.k,
            "v_ptr": self.v,
            "k_scale_ptr": k_scale,
            "v_scale_ptr": v_scale,
            "stride_k_b": self.k.stride(0),
            "stride_k_h": self.k.stride(1),
            "stride_v_b": self.v.stride(0),
            "stride_v_h": self.v.stride(1),
            "stride_s_b": k_scale.stride(0),
            "stride_s_h": k_scale.stride(1),
        }


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
    if pages.dim() != 2 or pages.dtype not in PAGE_DTYPES:
        raise InvalidInputError(
            f"`pages` is {pages.dtype} with {pages.dim()} dims; expected one of {PAGE_DTYPES} "
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
    if dtype not in PAGE_DTYPES:
        raise InvalidInputError(f"`dtype` is {dtype}; expected one of {PAGE_DTYPES}")
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


@dataclass(frozen=True)
class AttentionGeometry:
    """A model's attention over its paged cache, as the kernels compile and launch it.

    The decode's and the prefill's specs depend on it through ``gqa`` only (one compiled kernel
    serves every head count of one ratio); their launches and plans take the head counts too.
    """

    num_q_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    model_dtype: torch.dtype
    cache_dtype: torch.dtype

    @property
    def gqa(self) -> int:
        """Query heads per kv head."""
        return self.num_q_heads // self.num_kv_heads

    @classmethod
    def of(cls, query: torch.Tensor, cache: PagedKVCache) -> AttentionGeometry:
        """The geometry of a launch over ``query`` ``[tokens, q heads, head]`` and ``cache``."""
        return cls(
            num_q_heads=query.shape[1],
            num_kv_heads=cache.num_kv_heads,
            head_size=cache.head_size,
            block_size=cache.block_size,
            model_dtype=query.dtype,
            cache_dtype=cache.dtype,
        )

    def spec_arguments(self, target: str) -> dict[str, Any]:
        """The keyword arguments of the spec functions (``decode_spec``, ``prefill_spec``,
        ``aot_specs``) for a launch on ``target``."""
        return {
            "head_size": self.head_size,
            "block_size": self.block_size,
            "gqa": self.gqa,
            "model_dtype": self.model_dtype,
            "cache_dtype": self.cache_dtype,
            "target": target,
        }

    def check(self) -> None:
        """Raise a one-line InvalidInputError for a geometry the kernels do not serve."""
        if self.num_kv_heads < 1:
            raise InvalidInputError(f"`num_kv_heads` is {self.num_kv_heads}; expected >= 1")
        if self.num_q_heads < 1 or self.num_q_heads % self.num_kv_heads:
            raise InvalidInputError(
                f"`num_q_heads` is {self.num_q_heads}; expected a multiple of num_kv_heads "
                f"{self.num_kv_heads}"
            )
        if self.head_size not in SUPPORTED_HEAD_SIZES:
            raise InvalidInputError(
                f"`head_size` is {self.head_size}; expected one of {SUPPORTED_HEAD_SIZES}"
            )
        if self.block_size not in SUPPORTED_BLOCK_SIZES:
            raise InvalidInputError(
                f"`block_size` is {self.block_size}; expected one of {SUPPORTED_BLOCK_SIZES}"
            )
        if self.model_dtype not in ACTIVATION_DTYPES:
            raise InvalidInputError(
                f"`model_dtype` is {self.model_dtype}; expected one of {ACTIVATION_DTYPES}"
            )
        if self.cache_dtype not in (torch.int8, self.model_dtype):
            raise InvalidInputError(
                f"`cache_dtype` is {self.cache_dtype}; expected torch.int8 or the model dtype "
                f"{self.model_dtype}"
            )
