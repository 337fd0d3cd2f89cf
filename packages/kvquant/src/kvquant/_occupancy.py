"""CDNA2 (gfx90a) occupancy from a kernel's resource use: how many of its waves a SIMD holds.

Pure arithmetic on register and LDS counts, with no torch or Triton: the ahead-of-time build
records it per compiled kernel (``kvquant.build``), and the runtime sizes its decode splits by
it on a HIP device.
"""

from __future__ import annotations

import math

# ---- CDNA2 (gfx90a) limits; sources: LLVM AMDGPUUsage / AMDGPUBaseInfo, AMD CDNA2 ISA guide ----
CDNA2_VGPRS_PER_LANE = 512  # one unified file per SIMD lane, shared by VGPRs and AGPRs
CDNA2_VGPR_GRANULE = 8  # registers are allocated to a wave in blocks of 8
CDNA2_AGPR_ALIGN = 4  # AGPRs start at the next multiple of 4 after the last VGPR
CDNA2_MAX_WAVES_PER_SIMD = 8
CDNA2_SGPR_LIMIT_FOR_8_WAVES = 100  # more SGPRs than this: 7 waves (SGPRs never limit below 7)
CDNA2_SIMDS_PER_CU = 4
CDNA2_LDS_BYTES_PER_CU = 65536
CDNA2_LDS_GRANULE = 512  # LDS is allocated to a workgroup in blocks of 128 dwords
CDNA2_MAX_WORKGROUPS_PER_CU = 16  # barrier resources, for workgroups of more than one wave


def _align(value: int, granule: int) -> int:
    return -(-value // granule) * granule


def cdna2_waves_per_simd(
    *, vgprs: int, agprs: int, sgprs: int, lds_bytes: int, num_warps: int
) -> int:
    """Waves per SIMD that one CU of a gfx90a holds for this kernel (0: it does not fit).

    Triton's ``num_warps`` are wave64 waves; a workgroup of ``W = num_warps`` waves is spread over
    the CU's 4 SIMDs.

    1. Registers: ``total = align(vgprs, 4) + agprs`` (just ``vgprs`` without AGPRs), allocated
       as ``align(total, 8)`` from the 512-entry unified file of each lane:
       ``waves_regs = min(8, 512 // align(total, 8))``; with more than 100 SGPRs at most 7.
    2. Workgroups per CU: ``wg = min(4 * waves_regs // W, 65536 // align(lds_bytes, 512),
       16)`` (the LDS term is dropped when the kernel uses no LDS; the 16-workgroup barrier limit
       only when ``W > 1``; single-wave
       workgroups are limited by the 32 wave slots of the CU instead).
    3. ``waves_per_simd = min(waves_regs, ceil(wg * W / 4))``: the busiest SIMD's wave count.
    """
    if min(vgprs, agprs, sgprs, lds_bytes) < 0 or num_warps < 1:
        raise ValueError("register counts and LDS bytes must be >= 0 and num_warps >= 1")
    total = _align(vgprs, CDNA2_AGPR_ALIGN) + agprs if agprs else vgprs
    allocated = _align(max(total, 1), CDNA2_VGPR_GRANULE)
    waves_regs = min(CDNA2_MAX_WAVES_PER_SIMD, CDNA2_VGPRS_PER_LANE // allocated)
    if sgprs > CDNA2_SGPR_LIMIT_FOR_8_WAVES:
        waves_regs = min(waves_regs, CDNA2_MAX_WAVES_PER_SIMD - 1)
    workgroups = CDNA2_SIMDS_PER_CU * waves_regs // num_warps
    if lds_bytes:
        workgroups = min(workgroups, CDNA2_LDS_BYTES_PER_CU // _align(lds_bytes, CDNA2_LDS_GRANULE))
    barrier_limit = (
        CDNA2_MAX_WORKGROUPS_PER_CU
        if num_warps > 1
        else CDNA2_SIMDS_PER_CU * CDNA2_MAX_WAVES_PER_SIMD
    )
    workgroups = min(workgroups, barrier_limit)
    return min(waves_regs, math.ceil(workgroups * num_warps / CDNA2_SIMDS_PER_CU))
