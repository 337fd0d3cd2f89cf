"""Paged decode attention over the INT8 (or 16-bit) cache, with split-KV: kernels and specs.

A program owns one kv head and the query heads that share it, so each K/V byte is loaded once per
tile, and walks KV tiles of TILE_N tokens (``load_tile``) with an online softmax. Decode has only
the group's few query heads, so it puts the keys along the dots' M dimension and the query heads
along N (``_decode_tiles``), and on CUDA one warp owns a program. A program covers one split of
its sequence's tiles and writes an unnormalised partial result; the split reducer
(`reduce`) combines them (flash-decoding). With one split (batches that fill the device
alone) the decode writes the result and no reducer runs. Split count (`splits`), GQA ratio,
softcap and sliding window are runtime arguments, so one compiled variant per head size, block
size and dtypes serves every call and every GQA ratio that pads alike (``aot_specs``). A launch
shape is a `DecodeConfig`: `decode_config` chooses it, a sweep passes its own. The launches are
`plan`'s: a `DecodePlan` per batch shape, and `decode_attention` for one call.

INT8 specifics (why they are done this way):
- Both dots run on int8 codes with int32 accumulation, exact: no code is converted to a float
  inside the loop (converting them cost 10% on the H200; DESIGN.md, "Both dots on int8 codes,
  exact"). Each query row is scaled to [-127, 127] and split into two int8 tiles, hi + lo / 254
  (14 bits, finer than fp16); so is P, which lies in [0, 1] after each key's entries are
  multiplied by its V scale over the tile's largest.
- K scales multiply the scores of their key, V scales P's entries of their key, and the tile's
  largest V scale the PV dot's result. int8 cannot carry NaN: a key whose V scale is not finite
  gets a NaN K scale instead, which reaches exactly the query heads that see it.
- Wide groups (16 and more query heads per kv head, CUDA; USE_FP16_PV, `_fp16_pv_tiles`): the
  whole group in one program with its query heads along M, as a prefill's rows: Q x K as above,
  P x V in fp16, the V codes widened in registers (exact), P rounded to fp16 (11 bits) after
  each key's entries are multiplied by its V scale over the largest seen so far. 8-column
  integer programs would each redo the per-key work.
- The 16-bit path multiplies in the cache dtype; only under the interpreter (DOT_IN_FP32) are
  the 16-bit operands widened to fp32, because it mishandles bf16 dots.
"""

# mypy: disable-error-code="no-untyped-def"
# (@triton.jit kernels take Triton tensors and constexprs, which have no Python types.)

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .._common import KernelSpec, check_target, make_spec
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
    v_weights,
    widen_codes,
)
from .config import DecodeConfig, check_fp16_pv, decode_config
from .reduce import reduce_spec


@triton.jit
def _decode_tiles(
    q_t,  # [HEAD_PAD, COLS] high int8 part (INT8 cache), else the cache dtype
    q_low_t,  # [HEAD_PAD, COLS] low int8 part (INT8 cache); unused otherwise
    score_scale,  # [COLS] softmax scale (times log2(e) unless softcap) and the query's scale
    tile_lo,
    tile_hi,
    first_key,
    last_key,
    k_ptr,
    v_ptr,
    k_scale_ptr,
    v_scale_ptr,
    block_table_row,  # pointer to this sequence's block-table row
    kv_head,
    softcap,  # > 0: logits become softcap * tanh(logits / softcap)
    block_size,
    block_shift,  # log2(block_size)
    stride_k_b,
    stride_k_h,
    stride_v_b,
    stride_v_h,
    stride_s_b,
    stride_s_h,
    COLS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    QUANTIZED: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    V_PAGEWISE: tl.constexpr,
):
    """Decode: online softmax over KV tiles [tile_lo, tile_hi); returns (acc, max, sum).

    Transposed against prefill: keys along the dots' M dimension and the group's query heads along
    N, scores [N, COLS], accumulator [HEAD_PAD, COLS]. A group of 4 then pads the MMA's 8 columns,
    not its 16 rows: half the tensor-core work and half the accumulator registers, which is what
    lets one warp own a whole program (DESIGN.md, "Keys along M, the group along N, one warp per
    program"). Wide INT8 groups take `_fp16_pv_tiles` instead.
    """
    running_max = tl.full([COLS], float("-inf"), tl.float32)
    running_sum = tl.zeros([COLS], tl.float32)
    acc = tl.zeros([HEAD_PAD, COLS], tl.float32)
    head_k = kv_head.to(tl.int64) * stride_k_h
    head_v = kv_head.to(tl.int64) * stride_v_h
    head_s = kv_head.to(tl.int64) * stride_s_h
    for tile in range(tile_lo, tile_hi):
        _, key_valid, k, v, k_scale, v_scale, finite_v = load_tile(
            tile,
            first_key,
            last_key,
            k_ptr,
            v_ptr,
            k_scale_ptr,
            v_scale_ptr,
            block_table_row,
            head_k,
            head_v,
            head_s,
            block_size,
            block_shift,
            stride_k_b,
            stride_v_b,
            stride_s_b,
            HEAD_SIZE,
            HEAD_PAD,
            TILE_N,
            QUANTIZED,
            V_PAGEWISE,
        )
        if QUANTIZED:
            qk = tl.dot(k, q_low_t, tl.dot(k, q_t) * 254, out_dtype=tl.int32)  # exact in int32
            scores = qk.to(tl.float32) * k_scale[:, None] * score_scale[None, :]
        elif DOT_IN_FP32:
            scores = tl.dot(k.to(tl.float32), q_t.to(tl.float32), input_precision="ieee")
            scores = scores * score_scale[None, :]
        else:
            scores = tl.dot(k, q_t) * score_scale[None, :]
        if softcap > 0:
            scores = apply_softcap(scores, softcap)
        scores = tl.where(key_valid[:, None], scores, float("-inf"))

        p, correction, running_max, running_sum = softmax_step(scores, running_max, running_sum, 0)
        if QUANTIZED:
            v_weight, tile_v_max = v_weights(v_scale, finite_v)
            p_hi, p_lo = _split_to_int8(p * v_weight[:, None])
            pv = tl.dot(v, p_lo, tl.dot(v, p_hi) * 254, out_dtype=tl.int32)  # exact in int32
            acc = acc * correction[None, :] + pv.to(tl.float32) * (tile_v_max / (127.0 * 254.0))
        else:
            v = tl.where(key_valid[None, :], v, 0.0)  # stale slots may hold NaN/inf
            p = p.to(v.dtype)
            if DOT_IN_FP32:
                # Rounded to the cache dtype first, as on the GPU path, then multiplied exactly.
                pv = tl.dot(v.to(tl.float32), p.to(tl.float32), input_precision="ieee")
                acc = acc * correction[None, :] + pv
            else:
                acc = acc * correction[None, :] + tl.dot(v, p)
    return acc, running_max, running_sum


@triton.jit
def _fp16_pv_tiles(
    q,  # [COLS, HEAD_PAD] high int8 part of the query rows
    q_low,  # [COLS, HEAD_PAD] low int8 part
    score_scale,  # [COLS]
    tile_lo,
    tile_hi,
    first_key,
    last_key,
    k_ptr,
    v_ptr,
    k_scale_ptr,
    v_scale_ptr,
    block_table_row,
    kv_head,
    softcap,
    block_size,
    block_shift,
    stride_k_b,
    stride_k_h,
    stride_v_b,
    stride_v_h,
    stride_s_b,
    stride_s_h,
    COLS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    V_PAGEWISE: tl.constexpr,
):
    """The INT8 decode of a wide group (USE_FP16_PV): `_decode_tiles`' online softmax with the
    group's query heads along the dots' M and the keys along N, as the prefill's rows; returns
    (acc [HEAD_PAD, COLS], max, sum) as `_decode_tiles` does.

    A group of 16 or 32 fills the MMA's rows; with the keys along M, as for small groups, the
    decode was 7-10% slower on the H200 (DESIGN.md, "Wide groups"). Q x K on exact int8 dots;
    P x V in fp16: V codes widened in registers (exact), P times each key's V scale over the
    largest V scale seen so far (v_reference), x127, rounded to fp16 (11 bits; the 16-bit decode
    rounds P to bf16's 8). acc is kept in units of v_reference / 127 and rescaled with the max.
    Per score the loop does what cannot wait: the key's scale and mask in one FMA, the row's
    scale in the exponent's FMA (the row's largest score is its scale times its largest
    product); at block 16, K and the scales come page by page (`load_tile`'s KEY_PAGES).
    """
    running_max = tl.full([COLS], float("-inf"), tl.float32)
    running_sum = tl.zeros([COLS], tl.float32)
    acc = tl.zeros([COLS, HEAD_PAD], tl.float32)
    v_reference = 1e-6  # the largest finite V scale so far, at least the cache's scale floor
    # The row's scale in the exponent's FMA (below): > 0 or NaN, so the scores of a query row of
    # zeros stay 0 at its valid keys and -inf at the others (not 0 x -inf).
    exp_scale = tl.where(score_scale == 0.0, 1.0, score_scale)
    head_k = kv_head.to(tl.int64) * stride_k_h
    head_v = kv_head.to(tl.int64) * stride_v_h
    head_s = kv_head.to(tl.int64) * stride_s_h
    for tile in range(tile_lo, tile_hi):
        _, key_valid, k, v, k_scale, v_scale, finite_v = load_tile(
            tile,
            first_key,
            last_key,
            k_ptr,
            v_ptr,
            k_scale_ptr,
            v_scale_ptr,
            block_table_row,
            head_k,
            head_v,
            head_s,
            block_size,
            block_shift,
            stride_k_b,
            stride_v_b,
            stride_s_b,
            HEAD_SIZE,
            HEAD_PAD,
            TILE_N,
            True,
            V_PAGEWISE,
            KEY_PAGES=V_PAGEWISE,
        )
        k_t = tl.trans(k)
        qk = tl.dot(q_low, k_t, tl.dot(q, k_t) * 254, out_dtype=tl.int32)  # exact in int32
        # The key's scale and its mask in one FMA: keys that are not valid get -inf (their
        # stale scales are replaced by 0 first, so no inf * 0 reaches them).
        key_scale = tl.where(key_valid, k_scale, 0.0)
        key_bias = tl.where(key_valid, 0.0, float("-inf"))
        scores = qk.to(tl.float32) * key_scale[None, :] + key_bias[None, :]
        if softcap > 0:
            scores = apply_softcap(scores * score_scale[:, None], softcap)
            scores = tl.where(key_valid[None, :], scores, float("-inf"))
            p_scale = tl.full([COLS], 1.0, tl.float32)
        else:
            # The row's scale waits for the exponent's FMA; it is > 0 (or NaN), so the row's
            # largest score is its scale times the largest product.
            p_scale = exp_scale
        v_weight, rescale, v_reference = running_v_weights(v_scale, finite_v, v_reference, 0.0)
        new_max = tl.maximum(running_max, tl.max(scores, axis=1) * p_scale)
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        correction = tl.exp2(running_max - safe_max)
        acc = acc * (correction * rescale)[:, None]
        p = tl.exp2(scores * p_scale[:, None] - safe_max[:, None])
        running_sum = running_sum * correction + tl.sum(p, axis=1)
        running_max = new_max
        p_weighted = (p * v_weight[None, :]).to(tl.float16)
        acc += dot_16bit(p_weighted, tl.trans(widen_codes(v, not DOT_IN_FP32)), DOT_IN_FP32)
    return tl.trans(acc) * (v_reference / 127.0), running_max, running_sum


@triton.jit
def _split_to_int8(x):
    """x in [-127, 127] -> (hi, lo) int8 with x == hi + lo / 254 to within 1 / 508."""
    hi = tl.floor(x + 0.5)
    lo = tl.floor((x - hi) * 254.0 + 0.5)
    return hi.to(tl.int8), lo.to(tl.int8)


@triton.jit
def _prepare_query(q, query_bf16, softmax_scale, softcap, QUANTIZED: tl.constexpr):
    """(query operand, its low part or the query again, per-row score scale in log2 units).

    INT8 cache: the query comes as int16 bits (see `attention_types`); each row is scaled to
    [-127, 127] and split into two int8 tiles (14 bits, finer than fp16's 11) for exact int8
    dots; the row's scale / 254 goes into its score scale. A row with NaN or inf gets a NaN
    score scale, so only that row's output is NaN.
    """
    if QUANTIZED:
        q32 = float_from_bits(q, query_bf16)
        row_absmax, finite = row_magnitudes(q32)
        to_codes = tl.where(row_absmax > 0.0, 127.0 / row_absmax, 0.0)
        q, q_low = _split_to_int8(tl.where(finite[:, None], q32 * to_codes[:, None], 0.0))
        row_scale = tl.where(finite, row_absmax / (127.0 * 254.0), float("nan")) * softmax_scale
    else:
        q_low = q
        row_scale = tl.zeros([q.shape[0]], tl.float32) + softmax_scale
    if softcap <= 0:
        row_scale = row_scale * LOG2E
    return q, q_low, row_scale


@triton.jit(
    do_not_specialize=[
        "sliding_window",
        "num_splits",
        "tiles_per_split",
        "group",
        "query_bf16",
        "block_shift",
        "stride_bt",
    ]
)
def _decode_kernel(
    # Outputs: the result itself when ONE_SPLIT (int16 bits for an INT8 cache and a 16-bit out),
    # else each split's unnormalised partial result, combined by _reduce_splits_kernel
    out_ptr,  # [num_seqs, num_q_heads, head_size]
    partial_acc_ptr,  # [num_seqs, num_q_heads, num_splits, head_size] fp32
    partial_max_ptr,  # [num_seqs, num_q_heads, num_splits] fp32, log2 units
    partial_sum_ptr,  # [num_seqs, num_q_heads, num_splits] fp32
    # Inputs
    q_ptr,  # [num_seqs, num_q_heads, head_size] fp16/bf16
    k_ptr,  # [num_blocks, num_kv_heads, block_size, head_size] int8 or query dtype
    v_ptr,  # [num_blocks, num_kv_heads, head_size, block_size]
    k_scale_ptr,  # [num_blocks, num_kv_heads, block_size] fp32; iff QUANTIZED, else any pointer
    v_scale_ptr,
    block_table_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32, keys per sequence, the new token included
    # Scalars
    softmax_scale,
    softcap,  # > 0 turns the logit softcap on
    sliding_window,  # > 0 turns the sliding window on
    num_splits,
    tiles_per_split,
    group,  # query heads per kv head
    query_bf16,  # INT8 cache: 1 if the int16 query (and prefill output) bits are bf16, 0: fp16
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
    GROUP_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    QUANTIZED: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    V_PAGEWISE: tl.constexpr,
    ONE_SPLIT: tl.constexpr,  # num_splits == 1: write the result, no partials
    USE_FP16_PV: tl.constexpr,  # INT8, wide groups: `_fp16_pv_tiles`, the P x V dot in fp16
):
    """One (sequence, kv head, block of GROUP_PAD of its query heads, split) against its keys.

    A group wider than GROUP_PAD is split over ``head_blocks`` programs along axis 1, each
    loading the kv head's tiles itself (see `_decode_columns`); every other group is one block.
    """
    seq = tl.program_id(0)
    head_blocks = (group + GROUP_PAD - 1) // GROUP_PAD
    kv_head = tl.program_id(1) // head_blocks
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    # Query heads of this block of the kv head's group, padded for tl.dot's N.
    rows = (tl.program_id(1) - kv_head * head_blocks) * GROUP_PAD + tl.arange(0, GROUP_PAD)
    row_head = kv_head * group + rows
    row_valid = rows < group
    dims = tl.arange(0, HEAD_PAD)
    dim_valid = dims < HEAD_SIZE
    q_offsets = seq.to(tl.int64) * stride_q_t + row_head.to(tl.int64)[:, None] * stride_q_h
    q = tl.load(
        q_ptr + q_offsets + dims[None, :], mask=row_valid[:, None] & dim_valid[None, :], other=0
    )
    q, q_low, score_scale = _prepare_query(q, query_bf16, softmax_scale, softcap, QUANTIZED)

    last_key = seq_len - 1
    first_key = tl.where(sliding_window > 0, tl.maximum(seq_len - sliding_window, 0), 0)
    tile_lo = first_key // TILE_N + split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, last_key // TILE_N + 1)
    if USE_FP16_PV:
        acc, running_max, running_sum = _fp16_pv_tiles(
            q,
            q_low,
            score_scale,
            tile_lo,
            tile_hi,
            first_key,
            last_key,
            k_ptr,
            v_ptr,
            k_scale_ptr,
            v_scale_ptr,
            block_table_ptr + seq.to(tl.int64) * stride_bt,
            kv_head,
            softcap,
            block_size,
            block_shift,
            stride_k_b,
            stride_k_h,
            stride_v_b,
            stride_v_h,
            stride_s_b,
            stride_s_h,
            GROUP_PAD,
            HEAD_SIZE,
            HEAD_PAD,
            TILE_N,
            DOT_IN_FP32,
            V_PAGEWISE,
        )
    else:
        acc, running_max, running_sum = _decode_tiles(
            tl.trans(q),
            tl.trans(q_low),
            score_scale,
            tile_lo,
            tile_hi,
            first_key,
            last_key,
            k_ptr,
            v_ptr,
            k_scale_ptr,
            v_scale_ptr,
            block_table_ptr + seq.to(tl.int64) * stride_bt,
            kv_head,
            softcap,
            block_size,
            block_shift,
            stride_k_b,
            stride_k_h,
            stride_v_b,
            stride_v_h,
            stride_s_b,
            stride_s_h,
            GROUP_PAD,
            HEAD_SIZE,
            HEAD_PAD,
            TILE_N,
            QUANTIZED,
            DOT_IN_FP32,
            V_PAGEWISE,
        )

    # ---- Epilogue: the result itself, or this split's partial result ----
    # A variant of its own (ONE_SPLIT), not a runtime choice: with a runtime branch here the
    # sm_90 build gave the tile loop 11 more registers and 48 more instructions, and with both
    # stores masked small decodes ran 0.8 us slower on the H200 (DESIGN.md, "One split writes
    # the result; the reducer in one pass").
    if ONE_SPLIT:
        o_offsets = seq.to(tl.int64) * stride_o_t + row_head.to(tl.int64)[None, :] * stride_o_h
        tl.store(
            out_ptr + o_offsets + dims[:, None],
            as_output(acc / running_sum[None, :], out_ptr, query_bf16),
            mask=dim_valid[:, None] & row_valid[None, :],
        )
    else:
        num_q_heads = tl.num_programs(1) // head_blocks * group
        stat_offsets = (seq.to(tl.int64) * num_q_heads + row_head) * num_splits
        stat_offsets += split
        tl.store(partial_max_ptr + stat_offsets, running_max, mask=row_valid)
        tl.store(partial_sum_ptr + stat_offsets, running_sum, mask=row_valid)
        tl.store(
            partial_acc_ptr + stat_offsets[None, :] * HEAD_SIZE + dims[:, None],
            acc,
            mask=dim_valid[:, None] & row_valid[None, :],
        )


@functools.cache
def decode_spec(
    *,
    head_size: int,
    block_size: int,
    gqa: int,
    model_dtype: torch.dtype,
    cache_dtype: torch.dtype,
    target: str,
    out_dtype: torch.dtype | None = None,
    one_split: bool = False,
    config: DecodeConfig | None = None,
) -> KernelSpec:
    """The decode kernel the launcher compiles; ``target`` also takes "interpreter", out_dtype
    (fp32 for tests) defaults to the model's. ``one_split``: the variant for one split, which
    writes the result itself (no reducer). ``config``: the launch shape, `decode_config`'s if
    None. Cached: launches call it every time."""
    if config is None:
        config = decode_config(
            head_size=head_size,
            block_size=block_size,
            gqa=gqa,
            cache_dtype=cache_dtype,
            target=target,
        )
    elif config.fp16_pv:
        check_fp16_pv(cache_dtype, target)
    constexprs = shared_constexprs(head_size, block_size, cache_dtype, target)
    constexprs["GROUP_PAD"] = config.columns
    if config.fp16_pv:
        # Its fp16 dots, like the 16-bit ones, go to the interpreter in fp32 (exact there).
        constexprs["DOT_IN_FP32"] = target == "interpreter"
    constexprs["TILE_N"] = config.tile_n
    constexprs["ONE_SPLIT"] = one_split
    constexprs["USE_FP16_PV"] = config.fp16_pv
    types = attention_types(_decode_kernel, model_dtype, cache_dtype, out_dtype or model_dtype)
    return make_spec(
        "decode_attention_one_split" if one_split else "decode_attention",
        _decode_kernel,
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
    """Decode attention (split and one-split variants) and its split reducer for one model
    configuration.

    Softcap, sliding window, the split count, the GQA ratio and the block size are runtime
    arguments (except INT8 at block 16, see V_PAGEWISE), as are the INT8 kernels' model dtype and
    the reducer's head size; specs that come out equal are one compiled kernel.
    """
    check_target(target)
    geometry = {
        "head_size": head_size,
        "block_size": block_size,
        "gqa": gqa,
        "model_dtype": model_dtype,
        "cache_dtype": cache_dtype,
        "target": target,
    }
    return [
        decode_spec(**geometry),
        decode_spec(**geometry, one_split=True),
        reduce_spec(head_size=head_size, model_dtype=model_dtype),
    ]
