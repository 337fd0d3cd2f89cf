"""Causal varlen (chunked) prefill over the paged INT8 or 16-bit cache: kernel, spec, launcher.

A program owns one kv head and a block of query tokens times all the query heads that share it
(the rows, along the dots' M dimension), so each K/V tile is loaded once for the whole group. It
walks KV tiles of TILE_N keys with an online softmax in two loops: the tiles every row sees whole
(no mask), then the tiles on the causal diagonal or at the sliding window's edge (masked).

Both caches multiply on the 16-bit tensor cores. INT8: an int8 code is exact in fp16 (|code| <=
128 needs 8 significant bits), so K and V codes are widened in registers and the scales move
outside the dots: each key's K scale multiplies its column of scores after Q x K, each key's V
scale (over the largest V scale so far) its column of P before P x V, and the accumulator, kept
in units of that largest scale, is rescaled with the softmax's running max. The query goes to
fp16 divided by a power of two at its row's largest |q| (exact: a bf16 or fp16 value keeps every
bit, below 2**-14 of the row's largest as a subnormal), whatever the model's dtype, so one
compiled variant serves fp16 and bf16 models; P is rounded to fp16 (11 bits; the 16-bit path
rounds it to the cache dtype).

An INT8 cache is read that way (fused) only when its workspace would not fit: by default the
launch first expands the pages its queries see into fp16 pages (`workspace`), which the
16-bit loop reads (EXPANDED), so each tile is widened and scaled once per call instead of once per
block of query rows.
"""

# mypy: disable-error-code="no-untyped-def"
# (@triton.jit kernels take Triton tensors and constexprs, which have no Python types.)

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..._errors import InvalidInputError
from .._common import KernelSpec, check_target, make_spec, next_power_of_2
from .._paged_tiles import (
    FREE_STRIDES,
    LOG2E,
    apply_softcap,
    as_output,
    attention_types,
    dot_16bit,
    float_from_bits,
    load_tile,
    row_magnitudes,
    running_v_weights,
    shared_constexprs,
    softmax_step,
    widen_codes,
)
from .workspace import WORKSPACE_BLOCK, expand_spec, workspace_units


@dataclass(frozen=True)
class PrefillConfig:
    """Launch shape of one prefill program.

    Attributes:
        rows: query rows (query tokens x the group's query heads), the dots' M; at least the
            group, which one program always covers whole.
        tile_n: keys per KV tile, the dots' N (a multiple of 16: whole runs of a page).
        num_warps, num_stages: launch options (stages: the software pipeline's depth).
    """

    rows: int
    tile_n: int
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        for name in ("rows", "tile_n", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise InvalidInputError(f"`{name}` is {value}; expected a power of two")
        if self.tile_n < 16 or self.num_stages < 1:
            raise InvalidInputError(
                f"prefill config {self}: expected tile_n >= 16 and num_stages >= 1"
            )


# The shipped launch shapes (`prefill_config`). CUDA, from the H200 sweep
# (`benchmark_prefill_attention.py --sweep`; bf16 model, 32/8 heads, head 128, block 16;
# CUDA-graph kernel time in ms at 4 x (2048 + 2048) / 4 x (16384 + 2048) / 1 x (32768 + 4096) /
# 8 x (0 + 2048)), rows / keys / warps / stages:
#   16-bit  64 / 64 / 4 / 2   1.571 / 8.651 / 8.518 / 1.163
#          128 / 64 / 8 / 2   1.548 / 9.146 / 8.689 / 1.136
#         128 / 128 / 8 / 2   1.496 / 8.190 / 7.930 / 1.176 (spills 8 bytes in the sm_90 build)
#     and 8 warps 2.880 / 16.000 in another run. INT8: DESIGN.md, "Launch shape" and "What the
#     INT8 prefill costs".
_CONFIG_CUDA = PrefillConfig(rows=64, tile_n=64, num_warps=4, num_stages=2)
# INT8: one stage, measured faster; why is not established (the sm_90 build with Triton 3.9: 236
# registers and 32 KB of shared memory, against 244 and 49 KB at two stages). H200, ms at the
# four shapes above: 2.067 / 11.189 / 11.565 / 1.494, against 2.324 / 12.392 / 12.604 / 1.707 at
# two stages.
_CONFIG_CUDA_INT8 = PrefillConfig(rows=64, tile_n=64, num_warps=4, num_stages=1)
# Head 256 at that shape spills (sm_90 build: 376-600 bytes at one stage; more shared memory than
# an H200 has at two); 32-key tiles on 8 warps do not. Chosen on resource use; not timed.
_CONFIG_CUDA_HEAD_256 = PrefillConfig(rows=64, tile_n=32, num_warps=8, num_stages=1)
# HIP: CDNA hides latency with waves per SIMD, and the pipeliner's extra buffers cost registers,
# so no pipelining, and tiles small enough for 2 waves per SIMD in the gfx90a build (head 128:
# 64-key tiles took 272 VGPRs at 16 bits, 1 wave; 32-key tiles 229 / 253 at 16 bits / INT8;
# head 256 on 4 warps 255 / 263, on 8 warps 233 / 242). Chosen on resource use; not timed on a
# gfx90a (none is reachable from this project).
_CONFIG_HIP = PrefillConfig(rows=64, tile_n=32, num_warps=4, num_stages=1)
_CONFIG_HIP_HEAD_256 = PrefillConfig(rows=32, tile_n=32, num_warps=8, num_stages=1)
# The interpreter: small tiles, so CPU tests still cross tiles and the causal diagonal.
_CONFIG_INTERPRETER = PrefillConfig(rows=64, tile_n=64, num_warps=4, num_stages=1)


@triton.jit
def _query_operand(q, query_bf16, softmax_scale, softcap, QUANTIZED: tl.constexpr):
    """(query tile for the Q x K dot, per-row score scale in log2 units unless softcap).

    INT8 cache: the query comes as int16 bits (see `attention_types`) and goes to fp16 divided
    by 2**floor(log2(row max |q|)), exactly; the power of two moves into the row's score scale
    (0 for a row of zeros or subnormals, whose scores are 0 either way).
    A row with NaN or inf gets a NaN score scale, so only that row's output is NaN.
    """
    if QUANTIZED:
        q32 = float_from_bits(q, query_bf16)
        row_absmax, finite = row_magnitudes(q32)
        # The power and its inverse are built from exponent bits, so both are exact; capped at
        # 2**126, whose inverse is still a normal fp32 (a row past it keeps |q| / power <= 4).
        exponent_bits = tl.minimum(row_absmax.to(tl.int32, bitcast=True) & 0x7F800000, 126 << 23)
        power = exponent_bits.to(tl.float32, bitcast=True)
        inverse = ((254 << 23) - exponent_bits).to(tl.float32, bitcast=True)
        q = tl.where(finite[:, None], q32 * inverse[:, None], 0.0).to(tl.float16)
        row_scale = tl.where(finite, power, float("nan")) * softmax_scale
    else:
        row_scale = tl.zeros([q.shape[0]], tl.float32) + softmax_scale
    if softcap <= 0:
        row_scale = row_scale * LOG2E
    return q, row_scale


@triton.jit
def _prefill_tiles(
    acc,  # [ROWS, HEAD_PAD] fp32
    running_max,  # [ROWS] log2 units
    running_sum,  # [ROWS]
    v_reference,  # INT8: the largest finite V scale so far (see below)
    q,  # [ROWS, HEAD_PAD] fp16 (INT8 cache), else the cache dtype
    score_scale,  # [ROWS]
    row_pos,  # [ROWS] key position of each row's query token (the causal mask)
    tile_lo,
    tile_hi,
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
    softcap,
    sliding_window,
    block_size,
    block_shift,
    stride_k_b,
    stride_v_b,
    stride_s_b,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    QUANTIZED: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    V_PAGEWISE: tl.constexpr,
    WIDEN_PTX: tl.constexpr,
    ONE_PAGE: tl.constexpr,
    MASKED: tl.constexpr,  # False: every row sees every key of these tiles
):
    """Online softmax over KV tiles [tile_lo, tile_hi); returns (acc, max, sum, v_reference).

    INT8: acc is kept in units of v_reference / 127, v_reference the largest finite V scale so
    far, so P x V accumulates inside the dot (its scale moves into the per-row rescale the
    online softmax does anyway); P is each key's V scale over v_reference, x127, times P.
    """
    for tile in range(tile_lo, tile_hi):
        keys, key_valid, k, v, k_scale, v_scale, finite_v = load_tile(
            tile, first_key, last_key, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, block_table_row,
            head_k, head_v, head_s, block_size, block_shift, stride_k_b, stride_v_b, stride_s_b,
            HEAD_SIZE, HEAD_PAD, TILE_N, QUANTIZED, V_PAGEWISE, not MASKED, ONE_PAGE,
        )  # fmt: skip
        if QUANTIZED:
            k = widen_codes(k, WIDEN_PTX)
        scores = dot_16bit(q, tl.trans(k), DOT_IN_FP32) * score_scale[:, None]
        if QUANTIZED:
            scores = scores * k_scale[None, :]
        if softcap > 0:
            scores = apply_softcap(scores, softcap)
        if MASKED:
            visible = key_valid[None, :] & (keys[None, :] <= row_pos[:, None])
            if sliding_window > 0:
                visible &= keys[None, :] > row_pos[:, None] - sliding_window
            scores = tl.where(visible, scores, float("-inf"))
        p, correction, running_max, running_sum = softmax_step(scores, running_max, running_sum, 1)
        if QUANTIZED:
            # A key with a non-finite V scale: weight 0 where rows may not see it (its NaN K
            # scale poisons the rows that do); NaN in an unmasked tile, where every row sees it.
            v_weight, rescale, v_reference = running_v_weights(
                v_scale, finite_v, v_reference, 0.0 if MASKED else float("nan")
            )
            p = (p * v_weight[None, :]).to(tl.float16)
            acc = acc * (correction * rescale)[:, None]
            acc = dot_16bit(p, tl.trans(widen_codes(v, WIDEN_PTX)), DOT_IN_FP32, acc)
        else:
            if MASKED:
                v = tl.where(key_valid[None, :], v, 0.0)  # stale slots may hold NaN/inf
            pv = dot_16bit(p.to(v.dtype), tl.trans(v), DOT_IN_FP32)
            acc = acc * correction[:, None] + pv
    return acc, running_max, running_sum, v_reference


@triton.jit(
    do_not_specialize=[
        "sliding_window",
        "group",
        "block_q",
        "query_bf16",
        "block_shift",
        "stride_bt",
    ]
)
def _prefill_kernel(
    # Outputs
    out_ptr,  # [total_q, num_q_heads, head_size] query dtype
    # Inputs
    q_ptr,  # [total_q, num_q_heads, head_size] fp16/bf16
    k_ptr,  # [num_blocks, num_kv_heads, block_size, head_size] int8 or query dtype
    v_ptr,  # [num_blocks, num_kv_heads, head_size, block_size]
    k_scale_ptr,  # [num_blocks, num_kv_heads, block_size] fp32; iff QUANTIZED, else any pointer
    v_scale_ptr,
    block_table_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32, keys per sequence, the new tokens included
    cu_seqlens_q_ptr,  # [num_seqs + 1] int32
    tile_seq_ptr,  # [grid0] int32, sequence of each query tile
    tile_start_ptr,  # [grid0] int32, first query token of the tile, within its sequence
    fills_done_ptr,  # EXPANDED: int32 count of this launch's programs done; else any pointer
    # Scalars
    softmax_scale,
    softcap,  # > 0 turns the logit softcap on
    sliding_window,  # > 0 turns the sliding window on
    group,  # query heads per kv head
    block_q,  # query tokens per program: ROWS // group
    query_bf16,  # INT8 cache: 1 if the int16 query and output bits are bf16, 0: fp16
    block_size,  # a power of two, >= 16; 16 when V_PAGEWISE
    block_shift,  # log2(block_size)
    # Strides
    stride_q_t: tl.int64,
    stride_q_h: tl.int64,
    stride_o_t: tl.int64,
    stride_o_h: tl.int64,
    stride_k_b: tl.int64,
    stride_k_h: tl.int64,
    stride_v_b: tl.int64,
    stride_v_h: tl.int64,
    stride_s_b: tl.int64,
    stride_s_h: tl.int64,
    stride_bt: tl.int64,
    # Shapes and features
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    TILE_N: tl.constexpr,
    QUANTIZED: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    V_PAGEWISE: tl.constexpr,
    WIDEN_PTX: tl.constexpr,  # CUDA: INT8 codes widen by PTX (`widen_codes`)
    # An INT8 cache read from its fp16 workspace (`workspace`): the 16-bit tiles
    # (QUANTIZED is False), the INT8 kernel's query and output, the scale pointers at the
    # workspace's bounds, whose powers of two scale the scores and the output back.
    EXPANDED: tl.constexpr,
    ONE_PAGE: tl.constexpr,  # each KV tile lies in one page (the workspace's, `load_tile`)
    RESET_BOUNDS: tl.constexpr,  # EXPANDED: zero the bounds at the end (`bounds_reset`)
):
    """One (query tile, kv head): block_q query tokens x all ``group`` query heads, causal."""
    kv_head = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tl.program_id(0))
    q_first = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_first
    tile_start = tl.load(tile_start_ptr + tl.program_id(0))
    seq_len = tl.load(seq_lens_ptr + seq)

    # ---- Query rows: row r is query token r // group, query head r % group ----
    # The group is a runtime value, so one compiled kernel serves every GQA ratio; rows past
    # block_q * group (a ratio that does not divide ROWS) stay idle.
    rows = tl.arange(0, ROWS)
    row_token = tile_start + rows // group  # within the sequence's new tokens
    row_head = kv_head * group + rows % group
    row_valid = (row_token < q_len) & (rows < block_q * group)
    row_pos = seq_len - q_len + row_token  # key position of the query token itself
    dims = tl.arange(0, HEAD_PAD)
    dim_valid = dims < HEAD_SIZE
    q_offsets = (q_first + row_token).to(tl.int64)[:, None] * stride_q_t
    q_offsets += row_head.to(tl.int64)[:, None] * stride_q_h + dims[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_valid[:, None] & dim_valid[None, :], other=0)
    q, score_scale = _query_operand(q, query_bf16, softmax_scale, softcap, QUANTIZED or EXPANDED)
    if EXPANDED:
        _, k_inverse = workspace_units(tl.load(k_scale_ptr + kv_head))
        score_scale = score_scale * k_inverse

    # ---- KV tiles: those every row sees whole, then the masked ones ----
    first_pos = seq_len - q_len + tile_start  # the tile's first query token
    last_key = seq_len - q_len + tl.minimum(tile_start + block_q, q_len) - 1
    if sliding_window > 0:
        first_key = tl.maximum(first_pos - sliding_window + 1, 0)
        unmasked_hi = first_key // TILE_N  # every tile masked: the window moves per row
    else:
        first_key = 0
        unmasked_hi = (first_pos + 1) // TILE_N
    head_k = kv_head.to(tl.int64) * stride_k_h
    head_v = kv_head.to(tl.int64) * stride_v_h
    head_s = kv_head.to(tl.int64) * stride_s_h
    block_table_row = block_table_ptr + seq.to(tl.int64) * stride_bt
    acc = tl.zeros([ROWS, HEAD_PAD], tl.float32)
    running_max = tl.full([ROWS], float("-inf"), tl.float32)
    running_sum = tl.zeros([ROWS], tl.float32)
    v_reference = 1e-6  # at least the cache's scale floor
    acc, running_max, running_sum, v_reference = _prefill_tiles(
        acc, running_max, running_sum, v_reference, q, score_scale, row_pos, first_key // TILE_N,
        unmasked_hi, first_key, last_key, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, block_table_row,
        head_k, head_v, head_s, softcap, sliding_window, block_size, block_shift, stride_k_b,
        stride_v_b, stride_s_b, HEAD_SIZE, HEAD_PAD, TILE_N, QUANTIZED, DOT_IN_FP32, V_PAGEWISE,
        WIDEN_PTX, ONE_PAGE, False,
    )  # fmt: skip
    acc, running_max, running_sum, v_reference = _prefill_tiles(
        acc, running_max, running_sum, v_reference, q, score_scale, row_pos,
        tl.maximum(unmasked_hi, first_key // TILE_N), last_key // TILE_N + 1, first_key,
        last_key, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, block_table_row, head_k, head_v,
        head_s, softcap, sliding_window, block_size, block_shift, stride_k_b, stride_v_b,
        stride_s_b, HEAD_SIZE, HEAD_PAD, TILE_N, QUANTIZED, DOT_IN_FP32, V_PAGEWISE, WIDEN_PTX,
        ONE_PAGE, True,
    )  # fmt: skip

    # ---- Epilogue ----
    if QUANTIZED:
        acc = acc * (v_reference / 127.0)
    if EXPANDED:
        acc = acc * workspace_units(tl.load(v_scale_ptr + kv_head))[1]
    out_rows = (q_first + row_token).to(tl.int64)
    o_offsets = out_rows[:, None] * stride_o_t + row_head.to(tl.int64)[:, None] * stride_o_h
    tl.store(
        out_ptr + o_offsets + dims[None, :],
        as_output(acc / running_sum[:, None], out_ptr, query_bf16),
        mask=row_valid[:, None] & dim_valid[None, :],
    )
    if EXPANDED and RESET_BOUNDS:
        # The launch's last program to finish zeroes the workspace's bounds (and the count) for
        # the next fill: every program read them before counting itself done. No host memset
        # between layers, and a graph replay starts from zeroed bounds too.
        done = tl.atomic_add(fills_done_ptr, 1)
        if done == tl.num_programs(0) * tl.num_programs(1) - 1:
            for head in range(0, tl.num_programs(1)):
                tl.store(k_scale_ptr + head, 0)
                tl.store(v_scale_ptr + head, 0)
            tl.store(fills_done_ptr, 0)


def bounds_reset(target: str) -> bool:
    """Whether the workspace's prefill zeroes the bounds it read (RESET_BOUNDS), else the host
    zeroes them before each fill. Not on HIP: in the gfx90a build with Triton 3.6 the reset's
    one more VGPR (193 + 64 AGPRs at head 128) takes the workspace's prefill from 2 waves per
    SIMD to 1; a memset launch per layer costs CDNA less than half its occupancy."""
    return target != "hip"


def prefill_config(head_size: int, target: str, quantized: bool) -> PrefillConfig:
    """The launch shape the prefill ships with for this head size and cache on ``target``."""
    if target == "hip":
        return _CONFIG_HIP_HEAD_256 if next_power_of_2(head_size) >= 256 else _CONFIG_HIP
    if target == "interpreter":
        return _CONFIG_INTERPRETER
    if next_power_of_2(head_size) >= 256:
        return _CONFIG_CUDA_HEAD_256
    return _CONFIG_CUDA_INT8 if quantized else _CONFIG_CUDA


@functools.cache
def prefill_spec(
    *,
    head_size: int,
    block_size: int,
    gqa: int,
    model_dtype: torch.dtype,
    cache_dtype: torch.dtype,
    target: str,
    out_dtype: torch.dtype | None = None,
    config: PrefillConfig | None = None,
    expanded: bool = False,
) -> KernelSpec:
    """The prefill kernel the launcher compiles; out_dtype (fp32 for tests) defaults to model's;
    ``config`` to `prefill_config`'s choice. ``expanded``: an INT8 cache read from its fp16
    workspace (`workspace`), at the 16-bit prefill's launch shape."""
    quantized = cache_dtype == torch.int8 and not expanded
    config = config or prefill_config(head_size, target, quantized)
    # The workspace is a 16-bit cache of WORKSPACE_BLOCK-key pages.
    pages = (WORKSPACE_BLOCK, torch.float16) if expanded else (block_size, cache_dtype)
    constexprs = shared_constexprs(head_size, *pages, target)
    # Both caches' dots are 16-bit; the interpreter gets them in fp32 (exact there).
    constexprs["DOT_IN_FP32"] = target == "interpreter"
    constexprs["ROWS"] = max(next_power_of_2(gqa), config.rows)
    constexprs["TILE_N"] = config.tile_n
    constexprs["WIDEN_PTX"] = target == "cuda"
    constexprs["EXPANDED"] = expanded
    constexprs["ONE_PAGE"] = expanded and WORKSPACE_BLOCK % config.tile_n == 0
    constexprs["RESET_BOUNDS"] = expanded and bounds_reset(target)
    types = attention_types(
        _prefill_kernel, model_dtype, cache_dtype, out_dtype or model_dtype, expanded=expanded
    )
    return make_spec(
        "prefill_attention_expanded" if expanded else "prefill_attention",
        _prefill_kernel,
        types,
        constexprs,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        unaligned=FREE_STRIDES,
    )


def aot_specs(
    *,
    head_size: int,
    block_size: int,
    gqa: int,
    model_dtype: torch.dtype,
    cache_dtype: torch.dtype,
    target: str,
) -> list[KernelSpec]:
    """Prefill attention for one model configuration (softcap, sliding window, the GQA ratio
    and the block size are runtime arguments, except INT8 at block 16, see V_PAGEWISE); for an
    INT8 cache the fused prefill, and the workspace's two passes and the prefill that reads it."""
    check_target(target)
    geometry = {
        "head_size": head_size,
        "block_size": block_size,
        "gqa": gqa,
        "model_dtype": model_dtype,
        "cache_dtype": cache_dtype,
        "target": target,
    }
    specs = [prefill_spec(**geometry)]
    if cache_dtype == torch.int8:
        specs += [
            expand_spec(
                head_size=head_size, block_size=block_size, target=target, find_bounds=bounds
            )
            for bounds in (True, False)
        ]
        specs.append(prefill_spec(**geometry, expanded=True))
    return specs
