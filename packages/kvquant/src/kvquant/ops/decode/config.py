"""The decode's launch shapes: `DecodeConfig`, and `decode_config`, which chooses one per geometry
and target (the kernels in `kernels` compile whatever shape they are given)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..._errors import InvalidInputError
from .._common import next_power_of_2
from .._paged_tiles import PAGE_RUN, shared_constexprs

# Decode launch shape on CUDA and under the interpreter (`_decode_shape`): one warp per program
# where its state fits, so no barrier crosses warps inside the tile loop. A second warp comes in
# when the fp32 accumulator [head, query-head columns] passes _DECODE_ACC_ELEMENTS per lane of one
# warp (16 columns, or head 256). The K tile of a program holds _DECODE_TILE_BYTES[cache bytes] per
# lane of one warp, half that on two warps, within 16 keys per warp and _DECODE_TILE_N_MAX. The
# fastest of the H200 sweep, and every cell of the sm_90 build without a stack frame (DESIGN.md,
# "Launch shape per geometry").
_DECODE_ACC_ELEMENTS = 32
_DECODE_TILE_BYTES = {1: 256, 2: 128}
_DECODE_TILE_N_MAX = 64
# HIP keeps the 4-warp, 128-token layout (not timed on a gfx90a).
_DECODE_TILE_N_HIP = 128
# Query-head columns of one integer INT8 decode program, at most (`_decode_columns`), by target; a
# wider group is split over programs that each read the kv head's tiles (the others from L2). 8
# was the fastest cap on the H200; the 16-bit decode keeps the whole group (DESIGN.md, "Wide
# groups"). HIP has no cap (not timed on a gfx90a). Groups of _FP16_PV_MIN_COLUMNS take the fp16
# P x V decode instead, which keeps up to _FP16_PV_COLUMNS_MAX columns in a program.
_DECODE_COLUMNS_MAX: dict[str, int] = {"cuda": 8, "interpreter": 8}
# INT8 decodes of groups that pad to at least _FP16_PV_MIN_COLUMNS[target] query heads run the
# P x V dot in fp16 (USE_FP16_PV, `_fp16_pv_tiles`): the whole group (up to
# _FP16_PV_COLUMNS_MAX columns) in one program, which loads each K/V tile once, where the integer
# decode's programs of 8 columns each load it and redo the per-key work; faster than the integer
# decode at MQA, 16/1 and 32/2 on the H200 (DESIGN.md, "Wide groups"). CUDA only: the V codes are
# widened by PTX (`widen_codes`); gfx90a keeps the integer dots (its MFMA takes int8 at the fp16
# rate; nothing timed there). The interpreter follows CUDA.
_FP16_PV_MIN_COLUMNS: dict[str, int] = {"cuda": 16, "interpreter": 16}
_FP16_PV_COLUMNS_MAX = 32
# Launch shape of the fp16 P x V decode (`_fp16_pv_shape`): two warps, more where the accumulator
# passes _FP16_PV_ACC_ELEMENTS fp32 per lane (head 256 at 32 columns); KV tiles of
# _DECODE_TILE_N_MAX keys, half that at head 256 and where a program without page-wise V loads
# holds more than _FP16_PV_V_LOAD_COLUMNS head dims x columns. No stack frame in the sm_90 build
# at any head size, and 64 keys on 2 warps the fastest shape timed on the H200 (DESIGN.md, "Wide
# groups").
_FP16_PV_ACC_ELEMENTS = 64
_FP16_PV_V_LOAD_COLUMNS = 2048
# Warps of the HIP decode, as the 4-warp CUDA decode was fastest at 4 (DESIGN.md, "Launch shape
# per geometry"). Not timed on a gfx90a.
_NUM_WARPS_HIP = 4
# Decode pipeline stages on CUDA: 3 beat 2 with one warp per program, and 4 or 5 add no overlap
# (DESIGN.md, "Launch shape per geometry").
_DECODE_STAGES = 3
# On HIP (gfx90a) the attention kernels take no software pipelining: CDNA hides latency with
# waves per SIMD, and the pipeliner's buffers cost registers (3 stages: 1 wave per SIMD at head
# 128, 1 stage: 3). Chosen on resource use; not timed on a gfx90a.
_NUM_STAGES_HIP = 1


def _decode_stages(target: str) -> int:
    return _NUM_STAGES_HIP if target == "hip" else _DECODE_STAGES


def _decode_shape(
    head_pad: int, columns: int, cache_dtype: torch.dtype, target: str
) -> tuple[int, int]:
    """(KV tile, warps) of a decode program; see _DECODE_TILE_BYTES."""
    if target == "hip":
        return _DECODE_TILE_N_HIP, _NUM_WARPS_HIP
    num_warps = min(max(head_pad * columns // (_DECODE_ACC_ELEMENTS * 32), 1), 2)
    lane_bytes = _DECODE_TILE_BYTES[cache_dtype.itemsize]
    tile_n = lane_bytes * 32 // (head_pad * cache_dtype.itemsize) // num_warps
    return min(max(tile_n, PAGE_RUN.value * num_warps), _DECODE_TILE_N_MAX), num_warps


def _decode_columns(
    gqa: int, target: str, quantized: bool, fp16_pv: bool, max_columns: int | None
) -> int:
    """Decode query heads per program, the dots' N: the group padded to a power of two, at least
    the narrowest integer MMA (n8 on CUDA; gfx90a's MFMA takes 16, narrower falls back to FMA),
    at most _FP16_PV_COLUMNS_MAX for the fp16 P x V decode, else for INT8 at most
    ``max_columns`` (0: no cap), _DECODE_COLUMNS_MAX[target] if None; a wider group is split
    over programs (`head_blocks`)."""
    columns = max(next_power_of_2(gqa), 16 if target == "hip" else 8)
    if fp16_pv:
        cap: int | None = _FP16_PV_COLUMNS_MAX
    elif not quantized:
        cap = None
    elif max_columns is None:
        cap = _DECODE_COLUMNS_MAX.get(target)
    else:
        cap = max_columns or None
    return columns if cap is None else min(columns, cap)


def _fp16_pv_default(gqa: int, quantized: bool, target: str) -> bool:
    """Whether an INT8 decode of this group takes the fp16 P x V dot (_FP16_PV_MIN_COLUMNS)."""
    least = _FP16_PV_MIN_COLUMNS.get(target)
    return quantized and least is not None and next_power_of_2(gqa) >= least


def _fp16_pv_shape(head_pad: int, columns: int, v_pagewise: bool) -> tuple[int, int]:
    """(KV tile, warps) of the fp16 P x V decode; see _FP16_PV_ACC_ELEMENTS."""
    num_warps = max(2, head_pad * columns // (32 * _FP16_PV_ACC_ELEMENTS))
    halve = head_pad > 128 or (not v_pagewise and head_pad * columns > _FP16_PV_V_LOAD_COLUMNS)
    return _DECODE_TILE_N_MAX // (2 if halve else 1), num_warps


@dataclass(frozen=True)
class DecodeConfig:
    """Launch shape of one decode program (`decode_config` chooses it; sweeps pass their own).

    Attributes:
        columns: query heads per program, the dots' N (GROUP_PAD): a power of two; a wider group
            is split over programs.
        tile_n: keys per KV tile (a multiple of 16: whole runs of a page).
        num_warps, num_stages: launch options.
        fp16_pv: INT8 only: the P x V dot in fp16 (USE_FP16_PV), else on integer MMAs.
    """

    columns: int
    tile_n: int
    num_warps: int
    num_stages: int
    fp16_pv: bool = False

    def __post_init__(self) -> None:
        for name in ("columns", "tile_n", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise InvalidInputError(f"`{name}` is {value}; expected a power of two")
        if self.tile_n < PAGE_RUN.value or self.num_stages < 1:
            raise InvalidInputError(
                f"decode config {self}: expected tile_n >= {PAGE_RUN.value} and num_stages >= 1"
            )


def check_fp16_pv(cache_dtype: torch.dtype, target: str) -> None:
    """Refuse the fp16 P x V decode where it is not built: a 16-bit cache, or gfx90a."""
    if not (cache_dtype == torch.int8 and target in _FP16_PV_MIN_COLUMNS):
        raise InvalidInputError(
            f"`fp16_pv` is True for a {cache_dtype} cache on {target}; the fp16 P x V decode "
            f"takes an INT8 cache on {' or '.join(_FP16_PV_MIN_COLUMNS)}"
        )


@functools.cache
def decode_config(
    *,
    head_size: int,
    block_size: int,
    gqa: int,
    cache_dtype: torch.dtype,
    target: str,
    fp16_pv: bool | None = None,
    max_columns: int | None = None,
) -> DecodeConfig:
    """The launch shape the decode ships with for this geometry on ``target`` ("cuda", "hip" or
    "interpreter"). ``fp16_pv``: the INT8 decode with the P x V dot in fp16, or the integer one;
    None: the shipped choice (_FP16_PV_MIN_COLUMNS). ``max_columns``: another cap on the integer
    INT8 decode's query-head columns than _DECODE_COLUMNS_MAX (a sweep's; 0: none)."""
    quantized = cache_dtype == torch.int8
    if fp16_pv is None:
        fp16_pv = _fp16_pv_default(gqa, quantized, target)
    elif fp16_pv:
        check_fp16_pv(cache_dtype, target)
    columns = _decode_columns(gqa, target, quantized, fp16_pv, max_columns)
    head_pad = next_power_of_2(head_size)
    if fp16_pv:
        constexprs = shared_constexprs(head_size, block_size, cache_dtype, target)
        tile_n, num_warps = _fp16_pv_shape(head_pad, columns, bool(constexprs["V_PAGEWISE"]))
    else:
        tile_n, num_warps = _decode_shape(head_pad, columns, cache_dtype, target)
    return DecodeConfig(columns, tile_n, num_warps, _decode_stages(target), fp16_pv)
