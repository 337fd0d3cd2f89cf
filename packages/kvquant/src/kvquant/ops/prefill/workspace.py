"""The INT8 prefill's 16-bit workspace: the pages a prefill reads, expanded once into fp16.

The fused INT8 prefill widens and scales every K/V tile in each program that reads it; a prefill
of N new tokens over a long prefix reads each tile once per block of query rows, so that work
grows with N. Expanded once per call into a workspace of fp16 pages, the same tiles are read by
the 16-bit prefill's loop (`prefill_attention`'s EXPANDED variant), which does none of it.

Numerics: each value is code x scale x 2**-e, rounded to fp16 (11 significant bits), with one
power of two per kv head and K or V, chosen from the largest finite scale among the call's keys
so that the head's largest |code x scale| lies in [2**14, 2**15]: no value overflows fp16 and
none loses bits to the subnormal range that matters. The prefill multiplies the scores by 2**e_K
and its output by 2**e_V (exact). A key whose V scale is not finite is written with a NaN K and a
zero V: rows that see it turn NaN, rows that may not see it lose nothing (0 x NaN would poison
them through P x V).
"""

# mypy: disable-error-code="no-untyped-def"
# (@triton.jit kernels take Triton tensors and constexprs, which have no Python types.)

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..._cache import PagedKVCache, cache_from_pages, page_bytes
from .._common import BoundLaunch, KernelSpec, make_spec, page_shift, pointer, runtime_parameters
from .._paged_tiles import FREE_STRIDES, load_tile, shared_constexprs

# Keys per workspace page: one 64-key tile of the 16-bit prefill on CUDA, two on HIP.
WORKSPACE_BLOCK = 64
# The largest workspace a prefill allocates by default (K and V); a larger one is not allocated
# and the prefill runs fused. 512 MiB holds 4 x 18k keys of 8 kv heads at head 128.
WORKSPACE_LIMIT_BYTES = 512 << 20
_NUM_WARPS = 4


@triton.jit
def workspace_units(bound_bits):
    """(2**-e, 2**e) for a largest finite scale given as fp32 bits: 127 x the scale times 2**-e
    lies in [2**14, 2**15) (clamped so both powers stay normal fp32)."""
    largest = (bound_bits.to(tl.float32, bitcast=True) * 127.0).to(tl.int32, bitcast=True)
    biased = tl.minimum(tl.maximum(268 - ((largest >> 23) & 0xFF), 1), 253)
    unit = (biased << 23).to(tl.float32, bitcast=True)
    inverse = ((254 - biased) << 23).to(tl.float32, bitcast=True)
    return unit, inverse


@triton.jit
def _raise_bound(bound_ptr, scale_ptrs, valid):
    """The bound at ``bound_ptr`` raised to the largest finite |scale| of the valid keys."""
    scale = tl.abs(tl.load(scale_ptrs, mask=valid, other=0.0))
    largest = tl.max(tl.where(valid & (scale - scale == 0.0), scale, 0.0), axis=0)
    # Non-negative fp32 values order as their int32 bits.
    tl.atomic_max(bound_ptr, largest.to(tl.int32, bitcast=True))


@triton.jit(do_not_specialize=["block_shift", "stride_bt"])
def _expand_kernel(
    k_bound_ptr,  # [num_kv_heads] int32: fp32 bits of the largest finite |K scale| of the keys
    v_bound_ptr,
    ws_k_ptr,  # [pages, num_kv_heads, TILE_N, head_size] fp16
    ws_v_ptr,  # [pages, num_kv_heads, head_size, TILE_N] fp16
    k_ptr,  # the INT8 cache: codes and scales (`PagedKVCache`)
    v_ptr,
    k_scale_ptr,
    v_scale_ptr,
    block_table_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32
    page_seq_ptr,  # [pages] int32: the sequence of each workspace page
    page_tile_ptr,  # [pages] int32: which TILE_N keys of its sequence it holds
    block_size,
    block_shift,
    stride_k_b,
    stride_k_h,
    stride_v_b,
    stride_v_h,
    stride_s_b,
    stride_s_h,
    stride_wk_b,
    stride_wk_h,
    stride_wv_b,
    stride_wv_h,
    stride_bt,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    V_PAGEWISE: tl.constexpr,
    FIND_BOUNDS: tl.constexpr,  # True: the bounds pass; False: the expansion
):
    """One (workspace page, kv head): raise the head's bounds to its keys' scales, or write the
    page's K and V as fp16 in the head's units (`workspace_units`)."""
    page = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.load(page_seq_ptr + page)
    tile = tl.load(page_tile_ptr + page)
    seq_len = tl.load(seq_lens_ptr + seq)
    block_table_row = block_table_ptr + seq.to(tl.int64) * stride_bt
    head_s = head.to(tl.int64) * stride_s_h
    if FIND_BOUNDS:
        keys = tile * TILE_N + tl.arange(0, TILE_N)
        valid = keys < seq_len
        cache_page = tl.load(block_table_row + (keys >> block_shift), mask=valid, other=0)
        offsets = cache_page.to(tl.int64) * stride_s_b + head_s + (keys & (block_size - 1))
        _raise_bound(k_bound_ptr + head, k_scale_ptr + offsets, valid)
        _raise_bound(v_bound_ptr + head, v_scale_ptr + offsets, valid)
    else:
        _, _, k, v, k_scale, v_scale, finite_v = load_tile(
            tile, 0, seq_len - 1, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, block_table_row,
            head.to(tl.int64) * stride_k_h, head.to(tl.int64) * stride_v_h, head_s, block_size,
            block_shift, stride_k_b, stride_v_b, stride_s_b, HEAD_SIZE, HEAD_PAD, TILE_N, True,
            V_PAGEWISE,
        )  # fmt: skip
        k_unit, _ = workspace_units(tl.load(k_bound_ptr + head))
        v_unit, _ = workspace_units(tl.load(v_bound_ptr + head))
        # load_tile gives a key with a non-finite V scale a NaN K scale, and keys past the end
        # a zero V scale; their K values are never seen (the prefill masks their scores).
        k_values = (k.to(tl.float32) * (k_scale * k_unit)[:, None]).to(tl.float16)
        v_weight = tl.where(finite_v, v_scale * v_unit, 0.0)
        v_values = (v.to(tl.float32) * v_weight[None, :]).to(tl.float16)
        slots = tl.arange(0, TILE_N)
        dims = tl.arange(0, HEAD_PAD)
        dim_valid = dims < HEAD_SIZE
        ws_k = page.to(tl.int64) * stride_wk_b + head.to(tl.int64) * stride_wk_h
        ws_v = page.to(tl.int64) * stride_wv_b + head.to(tl.int64) * stride_wv_h
        k_offsets = ws_k + slots[:, None] * HEAD_SIZE + dims[None, :]
        tl.store(ws_k_ptr + k_offsets, k_values, mask=dim_valid[None, :])
        v_offsets = ws_v + dims[:, None] * TILE_N + slots[None, :]
        tl.store(ws_v_ptr + v_offsets, v_values, mask=dim_valid[:, None])


@functools.cache
def expand_spec(*, head_size: int, block_size: int, target: str, find_bounds: bool) -> KernelSpec:
    """The bounds pass (``find_bounds``) or the expansion, for an INT8 cache of this geometry."""
    constexprs = shared_constexprs(head_size, block_size, torch.int8, target)
    known = {
        "k_bound_ptr": pointer(torch.int32),
        "v_bound_ptr": pointer(torch.int32),
        "ws_k_ptr": pointer(torch.float16),
        "ws_v_ptr": pointer(torch.float16),
        "k_ptr": pointer(torch.int8),
        "v_ptr": pointer(torch.int8),
        "k_scale_ptr": pointer(torch.float32),
        "v_scale_ptr": pointer(torch.float32),
        "block_table_ptr": pointer(torch.int32),
        "seq_lens_ptr": pointer(torch.int32),
        "page_seq_ptr": pointer(torch.int32),
        "page_tile_ptr": pointer(torch.int32),
        "block_size": "i32",
        "block_shift": "i32",
    }
    types = {
        name: known[name] if not name.startswith("stride_") else "i64"
        for name in runtime_parameters(_expand_kernel)
    }
    return make_spec(
        "prefill_bounds" if find_bounds else "prefill_expand",
        _expand_kernel,
        types,
        {
            "HEAD_SIZE": head_size,
            "HEAD_PAD": constexprs["HEAD_PAD"],
            "TILE_N": WORKSPACE_BLOCK,
            "V_PAGEWISE": constexprs["V_PAGEWISE"],
            "FIND_BOUNDS": find_bounds,
        },
        num_warps=_NUM_WARPS,
        num_stages=1,
        unaligned=FREE_STRIDES,
    )


def workspace_page_bytes(num_kv_heads: int, head_size: int) -> int:
    """Bytes of one workspace page (K and V of WORKSPACE_BLOCK keys, fp16) for these heads."""
    return page_bytes(num_kv_heads, WORKSPACE_BLOCK, head_size, torch.float16)


def engine_pages(*, max_tokens: int, max_seqs: int, max_seq_len: int) -> int:
    """Workspace pages an engine's prefill steps need with every prefix within one longest
    context: the keys of one sequence of ``max_seq_len`` plus a step's ``max_tokens`` new
    tokens, and a partial page at each end of every sequence a step can hold."""
    sequences = min(max_seqs, max_tokens)
    return -(-max_seq_len // WORKSPACE_BLOCK) + -(-max_tokens // WORKSPACE_BLOCK) + 2 * sequences


class PrefillScratch:
    """The device memory an INT8 cache's prefills expand into, allocated once: ``capacity``
    fp16 pages of WORKSPACE_BLOCK keys and the per-head scale bounds.

    One scratch serves any number of layers and calls in stream order (each prefill fills it
    before reading it), as one engine's layers run; a prefill whose keys need more pages than
    ``capacity`` reads the INT8 pages itself (fused) instead.
    """

    def __init__(
        self, *, num_kv_heads: int, head_size: int, capacity: int, device: torch.device | str
    ) -> None:
        device = torch.device(device)
        self.capacity = capacity
        elems = workspace_page_bytes(num_kv_heads, head_size) // 2
        pages = torch.empty(max(capacity, 1), elems, dtype=torch.float16, device=device)
        self.cache = cache_from_pages(pages, num_kv_heads, WORKSPACE_BLOCK, head_size)
        # The fp32 bits of each head's largest finite K and V scale, found again on every fill
        # and zeroed again by the prefill that read them (its last program, counted in
        # ``fills_done``), or by the host before each fill on HIP (`bounds_reset`); rows 16-byte
        # aligned, as the kernels' pointers are compiled
        # (`KernelSpec.aligned`).
        self.bounds = torch.zeros(2, -(-num_kv_heads // 4) * 4, dtype=torch.int32, device=device)
        self.fills_done = torch.zeros(4, dtype=torch.int32, device=device)

    @property
    def nbytes(self) -> int:
        """Device bytes held: the pages, the bounds and the count."""
        pages = self.cache.k.untyped_storage().nbytes()
        return pages + self.bounds.nbytes + self.fills_done.nbytes

    def fits(self, cache: PagedKVCache) -> bool:
        """Whether this scratch's pages have ``cache``'s kv heads and head size."""
        return (self.cache.num_kv_heads, self.cache.head_size) == (
            cache.num_kv_heads,
            cache.head_size,
        )


def expand_launches(
    scratch: PrefillScratch,
    cache_geometry: tuple[int, int],
    step_values: dict[str, object],
    target: str,
    device: torch.device,
) -> tuple[BoundLaunch, BoundLaunch]:
    """The bounds pass and the expansion into ``scratch``, fixed but for the INT8 cache they
    read (`EXPAND_VARYING`, per layer); ``step_values``: the block table, seq_lens, page_seq and
    page_tile tensors and the block table's stride of the step they are first made for (later
    steps bind theirs, `BoundLaunch.rebound`). ``cache_geometry``: block size and head size."""
    block_size, head_size = cache_geometry
    fixed: dict[str, object] = step_values | {
        "k_bound_ptr": scratch.bounds[0],
        "v_bound_ptr": scratch.bounds[1],
        "ws_k_ptr": scratch.cache.k,
        "ws_v_ptr": scratch.cache.v,
        "block_size": block_size,
        "block_shift": page_shift(block_size),
        "stride_wk_b": scratch.cache.k.stride(0),
        "stride_wk_h": scratch.cache.k.stride(1),
        "stride_wv_b": scratch.cache.v.stride(0),
        "stride_wv_h": scratch.cache.v.stride(1),
    }
    grid = (1, scratch.cache.num_kv_heads)
    bound_launches = []
    for find_bounds in (True, False):
        spec = expand_spec(
            head_size=head_size, block_size=block_size, target=target, find_bounds=find_bounds
        )
        bound_launches.append(BoundLaunch(spec, device, grid, fixed, EXPAND_VARYING))
    return bound_launches[0], bound_launches[1]


# What a fill takes per layer: the INT8 cache's pages, scales and their strides.
EXPAND_VARYING = (
    "k_ptr",
    "v_ptr",
    "k_scale_ptr",
    "v_scale_ptr",
    "stride_k_b",
    "stride_k_h",
    "stride_v_b",
    "stride_v_h",
    "stride_s_b",
    "stride_s_h",
)
