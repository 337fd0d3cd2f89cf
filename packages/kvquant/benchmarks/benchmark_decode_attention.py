"""Decode attention on the H200: INT8 cache vs our 16-bit cache vs PyTorch SDPA on a dense cache.

Run on a CUDA device:
  python benchmarks/benchmark_decode_attention.py [--sweep | --splits | --budget | --flush]
(other model geometries, the fixed and streaming parts, a profiler's run:
benchmark_decode_geometry.py).

Shapes are the issue's: bf16 model, 32 query heads, 8 kv heads, head size 128, block size 16,
batch 1/16/64 x context 1k/8k/32k. Every sequence has the full context. Times are medians of
CUDA-event timings (`kvquant.timing`, which kvbench's kernel cells use too), each call after a
256 MB read that clears the L2, so no call finds the previous call's bytes there. Inputs are random
and non-zero (`kvquant.timing.random_sequences`); validation (one host sync) is off in the timed
calls. GB/s counts the KV bytes a decode must read, scales included.

Each call is timed as a replayed CUDA graph (kernel time, as vLLM runs decode), and the INT8 call
also eagerly ("eager ms": the Python launch path included, which bounds the small shapes). A graph
of one call still pays a graph launch and an event pair (~4 us on the H200; docs/measurements/
2026-12-02-kvquant-decode.md, "Timing"), which a decode inside a model's graph does not: "in
graph" is the time per call of a graph of
GRAPH_CALLS decodes, each over its own cache, so each still reads its bytes from DRAM.

The chunked prefill has its own benchmark, benchmark_prefill_attention.py.
"""

# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (the @triton.jit gather kernel takes Triton tensors, which have no Python types)

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools

import torch
import triton
import triton.language as tl
from _shapes import (
    BATCHES,
    BLOCK_SIZE,
    CONTEXTS,
    GRAPH_CALLS,
    HEAD_SIZE,
    MODEL_DTYPE,
    NUM_KV_HEADS,
    NUM_Q_HEADS,
    DecodeSetup,
    kv_bytes,
    reducer_ms,
    us_text,
)

from kvquant.timing import (
    copy_bandwidth,
    graph_ms,
    median_ms,
    plain_read_ms,
    read_clear,
    zero_clear,
)


def sdpa_ms(batch: int, context: int) -> float:
    q = torch.randn(batch, NUM_Q_HEADS, 1, HEAD_SIZE, device="cuda", dtype=MODEL_DTYPE)
    k = torch.randn(batch, NUM_KV_HEADS, context, HEAD_SIZE, device="cuda", dtype=MODEL_DTYPE)
    v = torch.randn_like(k)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return graph_ms(lambda: sdpa(q, k, v, enable_gqa=True))


def table(copy_gbs: float) -> None:
    print(f"device copy bandwidth: {copy_gbs:.0f} GB/s (read + write)")
    print(f"in graph: per call of a graph of {GRAPH_CALLS} decodes over {GRAPH_CALLS} caches")
    print(
        f"{'batch':>5} {'context':>7} {'int8 ms':>8} {'KV MB':>8} {'GB/s':>6} {'of copy':>7} "
        f"{'bf16 ms':>8} {'bf16 GB/s':>9} {'vs bf16':>7} {'sdpa ms':>8} {'vs sdpa':>7} "
        f"{'eager ms':>8} {'in graph':>8} {'GB/s':>6} {'bf16':>8} {'vs bf16':>7}"
    )
    for batch, context in itertools.product(BATCHES, CONTEXTS):
        int8 = [DecodeSetup(batch, context, torch.int8) for _ in range(GRAPH_CALLS)]
        int8_ms = graph_ms(int8[0].run)
        eager_ms = median_ms(int8[0].run)
        int8_each_ms = graph_ms(*(setup.run for setup in int8))
        del int8
        bf16 = [DecodeSetup(batch, context, MODEL_DTYPE) for _ in range(GRAPH_CALLS)]
        bf16_ms = graph_ms(bf16[0].run)
        bf16_each_ms = graph_ms(*(setup.run for setup in bf16))
        del bf16
        dense_ms = sdpa_ms(batch, context)
        int8_bytes = kv_bytes(batch, context, torch.int8)
        gbs = int8_bytes / int8_ms / 1e6
        bf16_gbs = kv_bytes(batch, context, MODEL_DTYPE) / bf16_ms / 1e6
        print(
            f"{batch:>5} {context:>7} {int8_ms:>8.3f} {int8_bytes / 1e6:>8.1f} {gbs:>6.0f} "
            f"{gbs / copy_gbs:>7.2f} {bf16_ms:>8.3f} {bf16_gbs:>9.0f} {bf16_ms / int8_ms:>6.2f}x "
            f"{dense_ms:>8.3f} {dense_ms / int8_ms:>6.2f}x {eager_ms:>8.3f} "
            f"{int8_each_ms:>8.3f} {int8_bytes / int8_each_ms / 1e6:>6.0f} {bf16_each_ms:>8.3f} "
            f"{bf16_each_ms / int8_each_ms:>6.2f}x",
            flush=True,
        )


SWEEP_SHAPES = ((16, 8192), (16, 32768), (64, 32768))


def sweep() -> None:
    """Time INT8 and bf16 decode for launch shapes around the chosen one (first of each cache)."""
    setups = {
        (dtype, shape): DecodeSetup(*shape, dtype)
        for dtype in (torch.int8, MODEL_DTYPE)
        for shape in SWEEP_SHAPES
    }
    shape_names = " ".join(f"{f'{b}/{c // 1024}k ms':>10}" for b, c in SWEEP_SHAPES)
    print(f"{'cache':>8} {'tile':>4} {'warps':>5} {'stages':>6} {shape_names} {'64/32k GB/s':>11}")
    for dtype in (torch.int8, MODEL_DTYPE):
        shipped = setups[dtype, SWEEP_SHAPES[0]].config()
        tile, warps, stages = shipped.tile_n, shipped.num_warps, shipped.num_stages
        settings = [
            (tile, warps, stages),
            (tile, warps, stages - 1),
            (tile // 2, warps, stages),
            (tile * 2, warps, stages),
            (tile, warps * 2, stages),
        ]
        # The 16-bit decode's P x V dot has the tile's keys as its K: tl.dot needs K >= 16.
        settings = [setting for setting in settings if setting[0] >= 16]
        for tile_n, num_warps, num_stages in settings:
            config = dataclasses.replace(
                shipped, tile_n=tile_n, num_warps=num_warps, num_stages=num_stages
            )
            times = [
                graph_ms(functools.partial(setups[dtype, shape].run, config=config))
                for shape in SWEEP_SHAPES
            ]
            gbs = kv_bytes(*SWEEP_SHAPES[-1], dtype) / times[-1] / 1e6
            name = str(dtype).removeprefix("torch.")
            print(
                f"{name:>8} {tile_n:>4} {num_warps:>5} {num_stages:>6} "
                + " ".join(f"{t:>10.3f}" for t in times)
                + f" {gbs:>11.0f}",
                flush=True,
            )


# Shapes of the split-count sweep: the rows of the table under the 3.8 TB/s and 1.7x targets.
SPLIT_SHAPES = ((16, 8192), (64, 8192), (16, 32768), (64, 32768))
SPLIT_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16)


def split_sweep() -> None:
    """Each cache's decode at forced split counts against the launcher's choice (graph-timed).

    The 16-bit rows check the baseline of the "vs bf16" columns: its split count comes from the
    same model as the INT8 one, with other tiles and another register budget.
    """
    print(
        f"{'cache':>8} {'batch':>5} {'context':>7} {'chosen':>6}  "
        + " ".join(f"{s or 'auto':>12}" for s in (None, *SPLIT_COUNTS))
    )
    print(f"{'':>31}(each: us / GB/s)")
    for dtype, (batch, context) in itertools.product((torch.int8, MODEL_DTYPE), SPLIT_SHAPES):
        setup = DecodeSetup(batch, context, dtype)
        cells = []
        for splits in (None, *SPLIT_COUNTS):
            ms = graph_ms(functools.partial(setup.run, splits))
            cells.append(f"{ms * 1e3:>6.1f}/{kv_bytes(batch, context, dtype) / ms / 1e6:<5.0f}")
        name = str(dtype).removeprefix("torch.")
        chosen = setup.plan().num_splits
        print(f"{name:>8} {batch:>5} {context:>7} {chosen:>6}  " + " ".join(cells), flush=True)
        del setup


@triton.jit
def _paged_gather_kernel(
    out_ptr,
    k_ptr,  # int32 words of the K codes, [num_blocks, kv_heads, PAGE_WORDS] with strides
    v_ptr,  # the same for V
    k_scale_ptr,  # the K scales' bits, [num_blocks, kv_heads, PAGE_TOKENS]
    v_scale_ptr,
    block_table_ptr,
    seq_lens_ptr,
    pages_per_split,
    stride_b,  # words between pages in K and V
    stride_h,  # words between kv heads of a page in K and V
    stride_s_b,
    stride_s_h,
    stride_bt,
    PAGE_WORDS: tl.constexpr,
    PAGE_TOKENS: tl.constexpr,  # keys per page, one K and one V scale each
    PAGES: tl.constexpr,
):
    """XOR of every word an INT8 decode program reads: program (sequence, kv head, split) walks
    its split's pages through the block table, PAGES at a time, and reads each page's K and V
    codes and scales of its kv head, with no attention work."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    first = tl.program_id(2) * pages_per_split
    last = tl.minimum(first + pages_per_split, tl.cdiv(seq_len, PAGE_TOKENS))
    words = tl.arange(0, PAGE_WORDS)
    scales = tl.arange(0, PAGE_TOKENS)
    folded = tl.zeros([PAGES, PAGE_WORDS], tl.int32)
    folded_scales = tl.zeros([PAGES, PAGE_TOKENS], tl.int32)
    for step in range(first, last, PAGES):
        pages = step + tl.arange(0, PAGES)
        valid = pages < last
        block = tl.load(block_table_ptr + seq.to(tl.int64) * stride_bt + pages, mask=valid, other=0)
        base = tl.multiple_of(block.to(tl.int64) * stride_b + kv_head * stride_h, 16)
        codes = base[:, None] + words[None, :]
        folded ^= tl.load(k_ptr + codes, mask=valid[:, None], other=0)
        folded ^= tl.load(v_ptr + codes, mask=valid[:, None], other=0)
        s_base = block.to(tl.int64) * stride_s_b + kv_head * stride_s_h
        scale_at = s_base[:, None] + scales[None, :]
        folded_scales ^= tl.load(k_scale_ptr + scale_at, mask=valid[:, None], other=0)
        folded_scales ^= tl.load(v_scale_ptr + scale_at, mask=valid[:, None], other=0)
    program = (seq * tl.num_programs(1) + kv_head) * tl.num_programs(2) + tl.program_id(2)
    folded_all = tl.xor_sum(tl.xor_sum(folded, axis=1), axis=0)
    tl.store(out_ptr + program, folded_all ^ tl.xor_sum(tl.xor_sum(folded_scales, axis=1), axis=0))


# Tied fastest (with 8 pages on 8 warps) of 16 reader settings on the H200 at every budget shape (4
# or 8 pages a step, 1-8 warps, 2 or 3 stages; DESIGN.md, "Why 16/8k misses 3.8 TB/s"). With one
# warp and 4 pages, the decode's own shape, this kernel (plain loads: with no dot, Triton uses no
# cp.async) took up to 12% longer, by machine.
GATHER_PAGES, GATHER_WARPS, GATHER_STAGES = 4, 4, 3


def paged_gather(setup: DecodeSetup, splits: int) -> functools.partial[object]:
    """A launch of _paged_gather_kernel over ``setup``'s INT8 cache on the decode's grid."""
    cache = setup.cache
    assert cache.k_scale is not None and cache.v_scale is not None
    # K, V and both scales are views of one page buffer (16-byte aligned runs): address them as
    # int32 words from where each starts, with their strides in words.
    words = cache.pages.view(torch.int32).view(-1)

    def word_view(part: torch.Tensor) -> torch.Tensor:
        return words[(part.data_ptr() - cache.pages.data_ptr()) // 4 :]

    pages_per_seq = setup.block_table.shape[1]
    pages_per_split = triton.cdiv(triton.cdiv(pages_per_seq, splits), GATHER_PAGES) * GATHER_PAGES
    folds = setup.block_table.new_empty(setup.query.shape[0] * NUM_KV_HEADS * splits)
    return functools.partial(
        _paged_gather_kernel[(setup.query.shape[0], NUM_KV_HEADS, splits)],
        folds,
        word_view(cache.k),
        word_view(cache.v),
        word_view(cache.k_scale),
        word_view(cache.v_scale),
        setup.block_table,
        setup.seq_lens,
        pages_per_split,
        cache.k.stride(0) // 4,
        cache.k.stride(1) // 4,
        cache.k_scale.stride(0),
        cache.k_scale.stride(1),
        setup.block_table.stride(0),
        PAGE_WORDS=BLOCK_SIZE * HEAD_SIZE // 4,
        PAGE_TOKENS=BLOCK_SIZE,
        PAGES=GATHER_PAGES,
        num_warps=GATHER_WARPS,
        num_stages=GATHER_STAGES,
    )


# Shapes of the time budget: the 16/8k row misses the bandwidth target; the others meet it.
BUDGET_SHAPES = ((16, 8192), (16, 32768), (64, 32768))
TARGET_TB_S = 3.8


def budget() -> None:
    """Where an INT8 decode's time goes, graph-timed: each cell single call / per call of a graph
    of GRAPH_CALLS, in us.

    "full": the decode as the table times it. "plain read": a kernel that only reads as many
    bytes (`kvquant.timing.plain_read_ms`), the reference for any decode of the shape, and "over
    read" the decode's time beyond it. "paged gather": the decode's own reads (the same pages
    through the block table, on the same grid and split count) with no attention work
    (`_paged_gather_kernel`): what its access pattern allows. "1 key": every
    sequence cut to one key, with the same grid and split count (max_seq_len unchanged), so every
    program still runs its prologue and epilogue and the reducer still runs: the fixed part.
    "reducer": the split reducer alone, on partials of the decode's shape. "floor": a graph of 8 KB
    zero_() calls, the graph launch and event pair that every cell pays. "streaming": full minus 1
    key, and the KV bytes over it. "target": the time the issue's bandwidth target (TARGET_TB_S)
    allows the shape.
    """
    print(f"{'batch':>5} {'context':>7} {'splits':>6} {'full':>13} {'plain read':>13} "
          f"{'over read':>11} {'paged gather':>13} {'1 key':>11} {'reducer':>11} {'floor':>9} "
          f"{'streaming':>11} {'TB/s':>9} {'target':>8}")  # fmt: skip
    floor_buffer = torch.empty(2048, device="cuda")
    floor = [graph_ms(*[floor_buffer.zero_] * calls) for calls in (1, GRAPH_CALLS)]
    for batch, context in BUDGET_SHAPES:
        setups = [DecodeSetup(batch, context, torch.int8) for _ in range(GRAPH_CALLS)]
        runs = [setup.run for setup in setups]
        full = [graph_ms(runs[0]), graph_ms(*runs)]
        splits = setups[0].plan().num_splits
        num_bytes = kv_bytes(batch, context, torch.int8)
        plain_read = [plain_read_ms(num_bytes, calls) for calls in (1, GRAPH_CALLS)]
        over_read = [f - r for f, r in zip(full, plain_read, strict=True)]
        gathers = [paged_gather(setup, splits) for setup in setups]
        gather = [graph_ms(gathers[0]), graph_ms(*gathers)]
        for setup in setups:
            setup.seq_lens.fill_(1)
        one_key = [graph_ms(runs[0]), graph_ms(*runs)]
        reducer = reducer_ms(setups[0].out, splits)
        streaming = [f - k for f, k in zip(full, one_key, strict=True)]
        tbs = [num_bytes / ms / 1e9 for ms in streaming]
        print(
            f"{batch:>5} {context:>7} {splits:>6} {us_text(full):>13} {us_text(plain_read):>13} "
            f"{us_text(over_read):>11} {us_text(gather):>13} {us_text(one_key):>11} "
            f"{us_text([reducer]):>11} {us_text(floor):>9} {us_text(streaming):>11} "
            f"{'/'.join(f'{t:.2f}' for t in tbs):>9} {num_bytes / TARGET_TB_S / 1e6:>8.1f}",
            flush=True,
        )
        del setups


def flush_check() -> None:
    """Single decodes (graph-timed) after each way of clearing the L2, in us: do_bench's zeroing,
    the benchmarks' read, and zeroing then reading. Where "zero" exceeds "read" and "zero + read"
    matches "read", the excess is the zeroing's dirty lines written back during the timed call."""
    print(f"{'cache':>8} {'batch':>5} {'context':>7} {'zero':>8} {'read':>8} {'zero + read':>11}")

    def zero_then_read() -> None:
        zero_clear()
        read_clear()

    for dtype, (batch, context) in itertools.product((torch.int8, MODEL_DTYPE), BUDGET_SHAPES):
        setup = DecodeSetup(batch, context, dtype)
        times = [graph_ms(setup.run, clear=c) for c in (zero_clear, read_clear, zero_then_read)]
        name = str(dtype).removeprefix("torch.")
        print(
            f"{name:>8} {batch:>5} {context:>7} "
            + " ".join(f"{t * 1e3:>{w}.1f}" for t, w in zip(times, (8, 8, 11), strict=True)),
            flush=True,
        )
        del setup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sweep", action="store_true", help="sweep launch settings instead")
    parser.add_argument(
        "--splits", action="store_true", help="time forced split-KV counts of both caches instead"
    )
    parser.add_argument(
        "--budget", action="store_true", help="split INT8 decode time into its parts instead"
    )
    parser.add_argument(
        "--flush", action="store_true", help="time decodes after each way of clearing the L2"
    )
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    if args.sweep:
        sweep()
    elif args.splits:
        split_sweep()
    elif args.budget:
        budget()
    elif args.flush:
        flush_check()
    else:
        table(copy_bandwidth())


if __name__ == "__main__":
    main()
