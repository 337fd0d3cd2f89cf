"""Chunked prefill on the H200: INT8 cache (through its fp16 workspace, and fused) vs our 16-bit
cache vs PyTorch's dense SDPA flash.

Run on a CUDA device:
  python benchmarks/benchmark_prefill_attention.py [--sweep | --profile]

Shapes (PREFILL_SHAPES, batch x (cached + new tokens)) in the decode benchmark's geometry: bf16
model, 32 query heads, 8 kv heads, head size 128, block size 16; random, non-zero inputs. Each
time is kernel time, the median of CUDA-event timings of a replayed CUDA graph after a 256 MB
read that clears the L2 (`kvquant.timing`): the prefill's checked launch (`plan_prefill`, which
reads cu_seqlens_q on the host once) for our kernels, and for SDPA the flash backend on a dense
bf16 cache, GQA by repeating K and V and a cached prefix by the lower-right causal mask. TFLOP/s
counts the causal FLOPs of the new tokens. ``--sweep`` times both caches at each launch shape of
PREFILL_SWEEP instead; ``--profile`` launches each prefill twice at the first shape, untimed, for
Nsight Compute.
"""

from __future__ import annotations

import argparse
import functools
import itertools

import torch
import triton
from _shapes import (
    HEAD_SIZE,
    MODEL_DTYPE,
    NUM_KV_HEADS,
    NUM_Q_HEADS,
    PREFILL_SHAPES,
    SOFTMAX_SCALE,
    DecodeSetup,
    prefill_flops,
)

from kvquant import PrefillConfig
from kvquant.ops.prefill import WORKSPACE_LIMIT_BYTES, PrefillPlan, plan_prefill
from kvquant.timing import graph_ms

# Launch shapes `--sweep` times (`PrefillConfig`: rows, tile_n, warps, stages).
PREFILL_SWEEP = (
    PrefillConfig(64, 64, 4, 1),
    PrefillConfig(128, 64, 8, 1),
    PrefillConfig(64, 64, 4, 2),
    PrefillConfig(64, 64, 8, 2),
    PrefillConfig(128, 64, 8, 2),
    PrefillConfig(128, 64, 8, 3),
    PrefillConfig(128, 32, 8, 3),
    PrefillConfig(128, 128, 8, 2),
    PrefillConfig(128, 64, 4, 3),
    PrefillConfig(256, 64, 8, 2),
)


def planned_prefill(
    batch: int,
    cached: int,
    new: int,
    cache_dtype: torch.dtype,
    config: PrefillConfig | None = None,
    workspace_limit_bytes: int = WORKSPACE_LIMIT_BYTES,
) -> PrefillPlan:
    """One chunked prefill of random data, its checked launch (`plan_prefill`), which a CUDA
    graph replays for the timings (`graph_ms`)."""
    setup = DecodeSetup(batch, cached + new, cache_dtype)
    query = torch.randn(batch * new, NUM_Q_HEADS, HEAD_SIZE, device="cuda", dtype=MODEL_DTYPE)
    cu_seqlens_q = torch.arange(0, (batch + 1) * new, new, device="cuda", dtype=torch.int32)
    return plan_prefill(
        query, setup.cache, setup.block_table, setup.seq_lens, cu_seqlens_q, SOFTMAX_SCALE,
        config=config, workspace_limit_bytes=workspace_limit_bytes,
    )  # fmt: skip


def sdpa_prefill_ms(batch: int, cached: int, new: int) -> float:
    """The same attention on a dense bf16 cache through PyTorch's flash backend: GQA by
    repeating K and V, a cached prefix by the lower-right causal mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    group = NUM_Q_HEADS // NUM_KV_HEADS
    q = torch.randn(batch, NUM_Q_HEADS, new, HEAD_SIZE, device="cuda", dtype=MODEL_DTYPE)
    k, v = (
        torch.randn(
            batch, NUM_KV_HEADS, cached + new, HEAD_SIZE, device="cuda", dtype=MODEL_DTYPE
        ).repeat_interleave(group, dim=1)
        for _ in range(2)
    )
    mask = causal_lower_right(new, cached + new) if cached else None
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def run() -> None:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            sdpa(q, k, v, attn_mask=mask, is_causal=not cached)

    return graph_ms(run)


def prefill_table() -> None:
    """Chunked prefill of both caches at their shipped launch shapes (INT8 through its fp16
    workspace, and fused: reading the INT8 pages in the prefill), and dense SDPA flash; "expand
    ms": the INT8 workspace's fill alone, part of the INT8 time."""
    print("prefill: batch x (cached + new), kernel time (CUDA graph), TFLOP/s of causal FLOPs")
    print(
        f"{'shape':>18} {'int8 ms':>8} {'TFLOP/s':>7} {'fused ms':>8} {'TFLOP/s':>7} "
        f"{'bf16 ms':>8} {'TFLOP/s':>7} {'sdpa ms':>8} {'TFLOP/s':>7} "
        f"{'int8/bf16':>9} {'int8/sdpa':>9} {'bf16/sdpa':>9} {'expand ms':>9}"
    )
    for batch, cached, new in PREFILL_SHAPES:
        flops = prefill_flops(batch, cached, new)
        int8_plan = planned_prefill(batch, cached, new, torch.int8)
        assert int8_plan.workspace is not None
        int8_ms = graph_ms(int8_plan.run)
        expand_ms = graph_ms(functools.partial(int8_plan.step.fill, int8_plan.cache))
        fused_ms = graph_ms(planned_prefill(batch, cached, new, torch.int8, None, 0).run)
        bf16_ms = graph_ms(planned_prefill(batch, cached, new, MODEL_DTYPE).run)
        dense_ms = sdpa_prefill_ms(batch, cached, new)
        shape = f"{batch} x ({cached} + {new})"
        times = (int8_ms, fused_ms, bf16_ms, dense_ms)
        ratios = ((int8_ms, bf16_ms), (int8_ms, dense_ms), (bf16_ms, dense_ms))
        print(
            f"{shape:>18} "
            + " ".join(f"{t:>8.3f} {flops / t / 1e9:>7.0f}" for t in times)
            + "".join(f" {a / b:>8.2f}x" for a, b in ratios)
            + f" {expand_ms:>9.3f}",
            flush=True,
        )


def prefill_sweep() -> None:
    """INT8 and bf16 chunked prefill at each launch shape of PREFILL_SWEEP, every shape."""
    names = " ".join(f"{f'{b}x({c}+{n})':>14}" for b, c, n in PREFILL_SHAPES)
    print(f"{'cache':>8} {'rows':>4} {'tile':>4} {'warps':>5} {'stages':>6} {names}  (ms)")
    for dtype, config in itertools.product((torch.int8, MODEL_DTYPE), PREFILL_SWEEP):
        times = (graph_ms(planned_prefill(*shape, dtype, config).run) for shape in PREFILL_SHAPES)
        cells = [f"{t:>14.3f}" for t in times]
        launch_shape = (
            f"{config.rows:>4} {config.tile_n:>4} {config.num_warps:>5} {config.num_stages:>6}"
        )
        print(f"{str(dtype)[6:]:>8} {launch_shape} " + " ".join(cells), flush=True)


def profiled_launches() -> None:
    """Each cache's prefill launched twice at the first shape, untimed, for a profiler: INT8's two
    runs (each the workspace's two passes, `_expand_kernel`, then the prefill), then the 16-bit
    cache's (``ncu --kernel-name regex:prefill --launch-skip 1`` skips the first prefill, which
    also compiles)."""
    for cache_dtype in (torch.int8, MODEL_DTYPE):
        plan = planned_prefill(*PREFILL_SHAPES[0], cache_dtype)
        for _ in range(2):
            plan.run()
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--sweep", action="store_true", help="sweep launch shapes instead")
    mode.add_argument(
        "--profile", action="store_true", help="launch each prefill twice, untimed, for ncu"
    )
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    if args.profile:
        profiled_launches()
    elif args.sweep:
        prefill_sweep()
    else:
        prefill_table()


if __name__ == "__main__":
    main()
