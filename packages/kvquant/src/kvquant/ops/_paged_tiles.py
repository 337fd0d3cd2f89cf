"""What the paged attention kernels share: the KV tile loader and the softmax's device steps, the
16-bit <-> bits conversions of the INT8 kernels' operands, rows' magnitudes (the cache write's
quantizer uses them too), and the launchers' input checks and spec pieces. The decode
(`decode`) and the prefill (`prefill`) are built from these, and both are keyed by one
`AttentionGeometry`; neither reaches into the other.
"""

# mypy: disable-error-code="no-untyped-def"
# (@triton.jit functions take Triton tensors and constexprs, which have no Python types.)

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .._cache import ACTIVATION_DTYPES, PagedKVCache
from .._errors import InvalidInputError
from ._common import check_tensor, next_power_of_2, pointer, runtime_parameters

# Scores are kept in log2 units so the softmax can use exp2.
LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


# Every supported block size is a multiple of 16, so a page holds whole runs of 16 keys: within a
# run the page base is constant and the in-page offsets are contiguous. The attention kernels
# state that much (the block size itself is a runtime argument), so one compiled variant serves
# every block size, except INT8 at block 16, whose V loads go page by page (V_PAGEWISE).
PAGE_RUN: tl.constexpr = tl.constexpr(16)


@triton.jit
def load_tile(
    tile,
    first_key,
    last_key,
    k_ptr,
    v_ptr,
    k_scale_ptr,
    v_scale_ptr,
    block_table_row,  # pointer to this sequence's block-table row
    head_k,  # kv head times its stride in K, V and the scales (int64)
    head_v,
    head_s,
    block_size,
    block_shift,  # log2(block_size)
    stride_k_b,
    stride_v_b,
    stride_s_b,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    QUANTIZED: tl.constexpr,
    V_PAGEWISE: tl.constexpr,
    ALL_VALID: tl.constexpr = False,  # the caller knows every key of the tile is valid
    ONE_PAGE: tl.constexpr = False,  # block_size is a multiple of TILE_N: the tile is in one page
    KEY_PAGES: tl.constexpr = False,  # with V_PAGEWISE: K and the scales page by page too
):
    """KV tile ``tile``: (keys, key_valid, K [N, D], V [D, N], K scales, V scales, finite V).

    Addressing: one page of one kv head is contiguous (K [block_size, HEAD], V^T [HEAD,
    block_size]), so a token's address is its page's base plus a 32-bit in-page offset. The page
    base is constant over each run of PAGE_RUN keys and a multiple of 16 (every cache stride is,
    block_size >= 16): the hints let both tiles load as 16-byte vectors. Loads are unmasked over
    whole pages (a key past the end reads its page's stale slot, or page 0 for a page past the
    end); callers remove keys that are not valid from scores, P and (16-bit) V. INT8: V scales
    of keys that are not valid are 0; a key whose V scale is not finite gets a NaN K scale.
    With ALL_VALID (the prefill's unmasked tiles: every row sees every key) the scales come as
    loaded, and the caller poisons the rows through P instead. 16-bit: the scales are zeros,
    never read. With ONE_PAGE (the INT8 prefill's fp16 workspace, pages a multiple of the tile)
    the tile's keys are one page's consecutive slots: one block-table entry, one base address.
    With KEY_PAGES (V_PAGEWISE only) K and the scales are loaded page by page as V is, [PAGES,
    16, D] and [PAGES, 16]: one block-table entry per page rather than per key.
    """
    tl.static_assert(not (ONE_PAGE and V_PAGEWISE) and (V_PAGEWISE or not KEY_PAGES))
    dims = tl.arange(0, HEAD_PAD)
    dim_valid = dims < HEAD_SIZE
    keys = tile * TILE_N + tl.arange(0, TILE_N)  # [N]
    key_valid = (keys >= first_key) & (keys <= last_key)
    if ONE_PAGE:
        # The tile lies in one page: one block-table entry and one base address for all of it.
        tile_first = tile * TILE_N
        page = tl.load(
            block_table_row + (tile_first >> block_shift), mask=tile_first <= last_key, other=0
        ).to(tl.int64)
        slot = tl.multiple_of(tile_first & (block_size - 1), TILE_N) + tl.arange(0, TILE_N)
        k_base = tl.multiple_of(page * stride_k_b + head_k, 16)
        v_base = tl.multiple_of(page * stride_v_b + head_v, 16)
        s_base = page * stride_s_b + head_s
        k_offsets = k_base + (slot * HEAD_SIZE)[:, None] + dims[None, :]
        v_offsets = v_base + (dims * block_size)[:, None] + slot[None, :]
    else:
        if V_PAGEWISE:  # block_size == PAGE_RUN; constant arithmetic keeps its decode 1-2% faster
            page_index = keys // PAGE_RUN
            slot = keys % PAGE_RUN
        else:
            page_index = keys >> block_shift
            slot = keys & (block_size - 1)
            slot = tl.max_contiguous(tl.multiple_of(slot, PAGE_RUN), PAGE_RUN)
        if not KEY_PAGES:
            page = tl.load(block_table_row + page_index, mask=keys <= last_key, other=0)
            page = page.to(tl.int64)
            k_base = tl.multiple_of(tl.max_constancy(page * stride_k_b + head_k, PAGE_RUN), 16)
            # K tile [N, D], token-major.
            k_offsets = k_base[:, None] + (slot * HEAD_SIZE)[:, None] + dims[None, :]
        if V_PAGEWISE:
            # block_size == PAGE_RUN. A page row of V (one dim, 16 keys) is under a 32-byte
            # sector. Loaded as [D, N], each thread of a quarter-warp would read a different page
            # and every sector would be fetched twice; loaded page by page, [PAGES, D, 16],
            # consecutive threads read consecutive rows of one page. Then viewed as [D, N].
            tile_pages = tile * (TILE_N // PAGE_RUN) + tl.arange(0, TILE_N // PAGE_RUN)
            v_page = tl.load(
                block_table_row + tile_pages, mask=tile_pages * PAGE_RUN <= last_key, other=0
            )
            v_page = v_page.to(tl.int64)
            v_base = tl.multiple_of(v_page * stride_v_b + head_v, 16)
            if KEY_PAGES:
                k_page_base = tl.multiple_of(v_page * stride_k_b + head_k, 16)
                k_offsets = (
                    k_page_base[:, None, None]
                    + (tl.arange(0, PAGE_RUN) * HEAD_SIZE)[None, :, None]
                    + dims[None, None, :]
                )
                s_page_base = tl.multiple_of(v_page * stride_s_b + head_s, 16)
                s_offsets = s_page_base[:, None] + tl.arange(0, PAGE_RUN)[None, :]
            v_offsets = (
                v_base[:, None, None]
                + (dims * PAGE_RUN)[None, :, None]
                + tl.arange(0, PAGE_RUN)[None, None, :]
            )
        else:
            # V tile [D, N], transposed within the page.
            v_base = tl.multiple_of(tl.max_constancy(page * stride_v_b + head_v, PAGE_RUN), 16)
            v_offsets = v_base[None, :] + (dims * block_size)[:, None] + slot[None, :]
    if KEY_PAGES:
        k = tl.load(k_ptr + k_offsets, mask=dim_valid[None, None, :], other=0)
        k = tl.reshape(k, [TILE_N, HEAD_PAD])
    elif HEAD_SIZE == HEAD_PAD:
        k = tl.load(k_ptr + k_offsets)
    else:  # padded dims would read the next token's bytes, or past the cache's end
        k = tl.load(k_ptr + k_offsets, mask=dim_valid[None, :], other=0)
    if V_PAGEWISE:
        v = tl.load(v_ptr + v_offsets, mask=dim_valid[None, :, None], other=0)
        v = tl.reshape(tl.permute(v, (1, 0, 2)), [HEAD_PAD, TILE_N])
    else:
        v = tl.load(v_ptr + v_offsets, mask=dim_valid[:, None], other=0)
    if QUANTIZED:
        if KEY_PAGES:
            k_scale = tl.reshape(tl.load(k_scale_ptr + s_offsets), [TILE_N])
            loaded_v_scale = tl.reshape(tl.load(v_scale_ptr + s_offsets), [TILE_N])
        else:
            if not ONE_PAGE:
                s_base = tl.multiple_of(tl.max_constancy(page * stride_s_b + head_s, PAGE_RUN), 16)
            k_scale = tl.load(k_scale_ptr + s_base + slot)
            loaded_v_scale = tl.load(v_scale_ptr + s_base + slot)
        if ALL_VALID:
            v_scale = loaded_v_scale
            finite_v = v_scale - v_scale == 0.0
        else:
            # Stale scales of masked keys may be anything, inf included: zero them.
            v_scale = tl.where(key_valid, loaded_v_scale, 0.0)
            # A non-finite V scale (poisoned token) cannot reach the int8 P tile; it makes the
            # key's scores NaN instead, so exactly the rows that see the token turn NaN.
            finite_v = v_scale - v_scale == 0.0
            k_scale = tl.where(finite_v, k_scale, float("nan"))
    else:
        k_scale = tl.zeros([TILE_N], tl.float32)
        v_scale = k_scale
        finite_v = key_valid
    return keys, key_valid, k, v, k_scale, v_scale, finite_v


@triton.jit
def apply_softcap(scores, softcap):
    """softcap * tanh(scores / softcap) in log2 units, tanh through exp2 so large |s| saturate."""
    two_x = scores * (2.0 * LOG2E / softcap)
    return softcap * (1.0 - 2.0 / (tl.exp2(two_x) + 1.0)) * LOG2E


@triton.jit
def softmax_step(scores, running_max, running_sum, KEY_AXIS: tl.constexpr):
    """One tile of the online softmax, in log2 units, keys along KEY_AXIS of ``scores``.

    Returns (P, the factor for the accumulator so far, new running max, new running sum). A query
    that has seen no visible key yet keeps max -inf, and its P is 0.
    """
    new_max = tl.maximum(running_max, tl.max(scores, axis=KEY_AXIS))
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    correction = tl.exp2(running_max - safe_max)
    p = tl.exp2(scores - tl.expand_dims(safe_max, KEY_AXIS))
    return p, correction, new_max, running_sum * correction + tl.sum(p, axis=KEY_AXIS)


@triton.jit
def v_weights(v_scale, finite_v):
    """INT8 P tile: each key's V scale over the tile's largest finite one, x127; that largest."""
    tile_v_max = tl.maximum(tl.max(tl.where(finite_v, v_scale, 0.0), axis=0), 1e-6)
    return tl.where(finite_v, v_scale * (127.0 / tile_v_max), 0.0), tile_v_max


@triton.jit
def running_v_weights(v_scale, finite_v, v_reference, NOT_FINITE_WEIGHT: tl.constexpr):
    """INT8 P tile against the running V reference, the largest finite V scale so far: each key's
    V scale over the new reference, x127 (NOT_FINITE_WEIGHT for a non-finite one); the factor
    that takes an accumulator kept in units of the old reference to the new; the new reference.
    """
    finite_scale = tl.where(finite_v, v_scale, 0.0)
    new_reference = tl.maximum(v_reference, tl.max(finite_scale, axis=0))
    weight = finite_scale * (127.0 / new_reference)
    if NOT_FINITE_WEIGHT != 0.0:
        weight = tl.where(finite_v, weight, NOT_FINITE_WEIGHT)
    return weight, v_reference / new_reference, new_reference


@triton.jit
def widen_codes(codes, PTX: tl.constexpr):
    """int8 codes as fp16, exactly. PTX (CUDA), 5 instructions per 4 codes: each code, its sign
    bit flipped (code + 128), becomes the low mantissa byte of 1024.0, and 1152 is subtracted.
    Triton's own int8 -> fp16 conversion takes 3.5-4 per code on sm_90 (sign extension, I2F,
    repacking). HIP and the interpreter run no PTX: they convert."""
    if not PTX:
        return codes.to(tl.float16)
    return tl.inline_asm_elementwise(
        """{
        .reg .b32 biased, magic;
        xor.b32 biased, $2, 0x80808080;
        prmt.b32 $0, biased, 0x64646464, 0x4140;
        prmt.b32 $1, biased, 0x64646464, 0x4342;
        mov.b32 magic, 0x64806480;
        sub.f16x2 $0, $0, magic;
        sub.f16x2 $1, $1, magic;
        }""",
        "=r,=r,r",
        [codes],
        dtype=tl.float16,
        is_pure=True,
        pack=4,
    )


@triton.jit
def dot_16bit(a, b, DOT_IN_FP32: tl.constexpr, acc=None):
    """fp16 tiles multiplied with fp32 sums (added to ``acc`` if given); under the interpreter
    widened to fp32 first (the products of fp16 values are exact in fp32, as on the tensor
    cores)."""
    if DOT_IN_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def float_from_bits(bits, is_bf16):
    """fp32 values of 16-bit floats held as int16 bits: bf16 where is_bf16 != 0, else fp16."""
    # A branch, not a select: is_bf16 is one value for the whole program, so it converts once.
    if is_bf16 != 0:
        values = (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        values = bits.to(tl.float16, bitcast=True).to(tl.float32)
    return values


@triton.jit
def _max_keeping_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def row_magnitudes(x):
    """Per row of ``x [R, C]``: its largest |value| (NaN if the row holds NaN, else inf if it
    holds inf) and whether every value is finite, from one reduction."""
    absmax = tl.reduce(tl.abs(x), 1, _max_keeping_nan)
    return absmax, absmax < float("inf")  # NaN compares False too


@triton.jit
def bits_from_float(x, is_bf16):
    """int16 bits of x rounded to bf16 where is_bf16 != 0, else to fp16."""
    as_bf16 = x.to(tl.bfloat16).to(tl.int16, bitcast=True)
    as_fp16 = x.to(tl.float16).to(tl.int16, bitcast=True)
    return tl.where(is_bf16 != 0, as_bf16, as_fp16)


@triton.jit
def as_output(result, out_ptr, query_bf16):
    """An fp32 result as ``out_ptr`` holds it: the model dtype's int16 bits where the INT8
    kernels take their output as bits (see `attention_types`), else ``out_ptr``'s dtype."""
    if out_ptr.dtype.element_ty == tl.int16:
        result = bits_from_float(result, query_bf16)
    return result.to(out_ptr.dtype.element_ty)


def check_attention_inputs(
    query: torch.Tensor,
    cache: PagedKVCache,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
    sliding_window: int | None,
    softcap: float | None,
    out: torch.Tensor | None,
) -> None:
    device = cache.device
    num_seqs = seq_lens.shape[0] if isinstance(seq_lens, torch.Tensor) and seq_lens.dim() else 0
    check_tensor(
        "query", query, dtypes=ACTIVATION_DTYPES, shape=(None, None, cache.head_size), device=device
    )
    num_q_heads = query.shape[1]
    if num_q_heads % cache.num_kv_heads != 0:
        raise InvalidInputError(
            f"`query` has {num_q_heads} heads; expected a multiple of the cache's "
            f"{cache.num_kv_heads} kv heads"
        )
    if query.stride(-1) != 1:
        raise InvalidInputError("`query` must have a contiguous last (head) dimension")
    if not cache.is_quantized and cache.dtype != query.dtype:
        raise InvalidInputError(
            f"`query` has dtype {query.dtype}; a 16-bit cache of {cache.dtype} needs the same"
        )
    check_tensor(
        "seq_lens", seq_lens, dtypes=(torch.int32, torch.int64), shape=(num_seqs,), device=device
    )
    check_tensor(
        "block_table", block_table, dtypes=(torch.int32,), shape=(num_seqs, None), device=device
    )
    if block_table.stride(-1) != 1:
        raise InvalidInputError("`block_table` must have a contiguous last dimension")
    if out is not None:
        check_tensor(
            "out", out, dtypes=(query.dtype, torch.float32), shape=tuple(query.shape), device=device
        )
        if out.stride(-1) != 1:
            raise InvalidInputError("`out` must have a contiguous last (head) dimension")
    if not softmax_scale > 0:
        raise InvalidInputError(f"`softmax_scale` is {softmax_scale}; expected > 0")
    if sliding_window is not None and sliding_window < 1:
        raise InvalidInputError(f"`sliding_window` is {sliding_window}; expected >= 1 or None")
    if softcap is not None and not softcap > 0:
        raise InvalidInputError(f"`softcap` is {softcap}; expected > 0 or None")


def check_block_table(
    cache: PagedKVCache, block_table: torch.Tensor, seq_lens: torch.Tensor
) -> int:
    """Check every page a sequence uses lies in the cache (one host sync); return max seq_len."""
    if seq_lens.numel() == 0:
        return 0
    pages_needed = (seq_lens.long() + cache.block_size - 1) // cache.block_size
    columns = torch.arange(block_table.shape[1], device=block_table.device)
    used = columns[None, :] < pages_needed[:, None]
    outside = used & ((block_table < 0) | (block_table >= cache.num_blocks))
    stats = torch.stack(
        [seq_lens.max().long(), seq_lens.min().long(), pages_needed.max(), outside.sum()]
    )
    max_len, min_len, max_pages, outside_count = stats.tolist()
    if min_len < 0:
        raise InvalidInputError(f"`seq_lens` holds {min_len}; expected >= 0")
    if max_pages > block_table.shape[1]:
        raise InvalidInputError(
            f"`seq_lens` holds {max_len}, which needs {max_pages} pages; `block_table` has "
            f"{block_table.shape[1]} columns"
        )
    if outside_count:
        raise InvalidInputError(
            f"`block_table` points past the cache in {outside_count} used entries; expected "
            f"pages in [0, {cache.num_blocks})"
        )
    return int(max_len)


def attention_types(
    kernel: Any,
    model_dtype: torch.dtype,
    cache_dtype: torch.dtype,
    out_dtype: torch.dtype,
    *,
    expanded: bool = False,
) -> dict[str, str]:
    """Triton types of an attention kernel's runtime parameters, by name. ``expanded``: an INT8
    cache read from its fp16 workspace (`prefill.workspace`), whose scale pointers are the
    workspace's bounds."""
    quantized = cache_dtype == torch.int8
    values = torch.float16 if expanded else cache_dtype
    scales = torch.int32 if expanded else torch.float32 if quantized else cache_dtype
    # The INT8 kernels convert the query to fp32 first and round only their output, so they take
    # both as int16 bits and a runtime `query_bf16`: one compiled variant per model dtype pair.
    as_bits = quantized and out_dtype in ACTIVATION_DTYPES
    known = {
        "out_ptr": pointer(torch.int16 if as_bits else out_dtype),
        "partial_acc_ptr": pointer(torch.float32),
        "partial_max_ptr": pointer(torch.float32),
        "partial_sum_ptr": pointer(torch.float32),
        "q_ptr": pointer(torch.int16 if quantized else model_dtype),
        "k_ptr": pointer(values),
        "v_ptr": pointer(values),
        # A 16-bit cache has no scales: the launcher passes its K tensor, never dereferenced.
        "k_scale_ptr": pointer(scales),
        "v_scale_ptr": pointer(scales),
        "block_table_ptr": pointer(torch.int32),
        "seq_lens_ptr": pointer(torch.int32),
        "cu_seqlens_q_ptr": pointer(torch.int32),
        "tile_seq_ptr": pointer(torch.int32),
        "tile_start_ptr": pointer(torch.int32),
        "fills_done_ptr": pointer(torch.int32),
        "softmax_scale": "fp32",
        "softcap": "fp32",
        "sliding_window": "i32",
        "num_splits": "i32",
        "tiles_per_split": "i32",
        "group": "i32",
        "block_q": "i32",
        "query_bf16": "i32",
        "head_size": "i32",
        "block_size": "i32",
        "block_shift": "i32",
    }
    return {
        name: known[name] if not name.startswith("stride_") else "i64"
        for name in runtime_parameters(kernel)
    }


def shared_constexprs(
    head_size: int, block_size: int, cache_dtype: torch.dtype, target: str
) -> dict[str, int | float | bool]:
    quantized = cache_dtype == torch.int8
    return {
        # The head size stays a compile-time value here: as a runtime one (masks on every load) the
        # INT8 decode ran 7-11% slower on the H200 at head 80 and 128 (DESIGN.md, "Fewer compiled
        # variants").
        "HEAD_SIZE": head_size,
        "HEAD_PAD": next_power_of_2(head_size),
        "QUANTIZED": quantized,
        # Triton's interpreter multiplies bf16 tiles as raw integers; give it fp32 (exact here).
        "DOT_IN_FP32": target == "interpreter" and not quantized,
        # Page-by-page V loads when a page row is under a sector: INT8 at block 16 (1.58 ->
        # 1.28 ms at batch 64 / 32k on the H200); bf16 rows of 32 bytes ran 5% slower that way.
        # The only block-size specialization: the kernels take the block size at run time.
        "V_PAGEWISE": block_size * (1 if quantized else 2) < 32,
    }


# The block table's row stride is the caller's max blocks per sequence: any value.
FREE_STRIDES = ("stride_bt",)


def scale_tensors(cache: PagedKVCache) -> tuple[torch.Tensor, torch.Tensor]:
    """The scale tensors, or (never dereferenced) the K tensor for a 16-bit cache."""
    if cache.k_scale is None or cache.v_scale is None:
        return cache.k, cache.k
    return cache.k_scale, cache.v_scale


def cache_arguments(cache: PagedKVCache) -> dict[str, object]:
    """The attention kernels' cache arguments by name (`PagedKVCache.kernel_arguments`)."""
    return cache.kernel_arguments


def kernel_operand(tensor: torch.Tensor, cache: PagedKVCache) -> torch.Tensor:
    """A 16-bit query or output as the attention kernels take it: int16 bits for an INT8 cache."""
    if cache.is_quantized and tensor.dtype in ACTIVATION_DTYPES:
        return tensor.view(torch.int16)
    return tensor


def query_is_bf16(query: torch.Tensor) -> int:
    """The INT8 kernels' runtime ``query_bf16``: how to read the int16 bits of query and output."""
    return int(query.dtype == torch.bfloat16)


def index_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The kernels take int32 indices (the spec's signature); seq_lens may come as int64."""
    return tensor if tensor.dtype == torch.int32 else tensor.to(torch.int32)
