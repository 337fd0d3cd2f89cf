"""Decode attention on the H200: INT8 cache vs our 16-bit cache vs PyTorch SDPA on a dense cache.

Run on a CUDA device:
  python benchmarks/benchmark_decode_attention.py [--sweep | --splits | --budget | --flush]
  python benchmarks/benchmark_decode_attention.py [--geometry ... | --parts | --profile B CONTEXT]

Shapes are the issue's: bf16 model, 32 query heads, 8 kv heads, head size 128, block size 16,
batch 1/16/64 x context 1k/8k/32k. Every sequence has the full context. Times are medians of
CUDA-event timings (`kvquant.timing`, which kvbench's kernel cells use too), each call after a
256 MB read that clears the L2, so no call finds the previous call's bytes there. Inputs are random
and non-zero (`kvquant.timing.random_sequences`); validation (one host sync) is off in the timed
calls. GB/s counts the KV bytes a decode must read, scales included.

Each call is timed as a replayed CUDA graph (kernel time, as vLLM runs decode), and the INT8 call
also eagerly ("eager ms": the Python launch path included, which bounds the small shapes). A graph
of one call still pays a graph launch and an event pair (~4 us on the H200, DESIGN.md), which a
decode inside a model's graph does not: "in graph" is the time per call of a graph of
GRAPH_CALLS decodes, each over its own cache, so each still reads its bytes from DRAM.

The chunked prefill has its own benchmark, benchmark_prefill_attention.py.
"""

# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (the @triton.jit gather kernel takes Triton tensors, which have no Python types)

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import itertools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
)

from kvquant import DecodeConfig, DecodePlan, decode_config
from kvquant.ops._common import launch
from kvquant.ops.decode.reduce import reduce_spec
from kvquant.timing import (
    copy_bandwidth,
    graph_ms,
    median_ms,
    paged_kv_bytes,
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
            f"{batch:>5} {context:>7} {splits:>6} {_us(full):>13} {_us(plain_read):>13} "
            f"{_us(over_read):>11} {_us(gather):>13} {_us(one_key):>11} "
            f"{_us([reducer]):>11} {_us(floor):>9} {_us(streaming):>11} "
            f"{'/'.join(f'{t:.2f}' for t in tbs):>9} {num_bytes / TARGET_TB_S / 1e6:>8.1f}",
            flush=True,
        )
        del setups


def reducer_ms(out: torch.Tensor, splits: int) -> float:
    """The split reducer alone, graph-timed, on random partials of ``splits`` splits for ``out``
    ([batch, query heads, head size])."""
    batch, num_q_heads, head_size = out.shape
    reduce = reduce_spec(head_size=head_size, model_dtype=out.dtype)
    partial_acc = torch.randn(batch, num_q_heads, splits, head_size, device="cuda")
    partial_max = torch.randn(batch, num_q_heads, splits, device="cuda")
    partial_sum = torch.rand(batch, num_q_heads, splits, device="cuda") + 1
    reduce_arguments = reduce.arguments(
        out_ptr=out,
        partial_acc_ptr=partial_acc,
        partial_max_ptr=partial_max,
        partial_sum_ptr=partial_sum,
        num_splits=splits,
        head_size=head_size,
        stride_o_t=out.stride(0),
        stride_o_h=out.stride(1),
    )
    return graph_ms(functools.partial(launch, reduce, (batch, num_q_heads), reduce_arguments))


def parts_table(groups: list[tuple[int, int]]) -> None:
    """Fixed and streaming parts of our INT8 and 16-bit decodes on each of GEOMETRIES x
    GEOMETRY_SHAPES (those of ``groups`` if any), in us per call of a graph of GRAPH_CALLS
    calls over GRAPH_CALLS caches, at the shipped launch shape and split count.

    "full": the decode as --geometry's graph column times it. "1 key": every sequence cut to one
    key, with the same plan (grid, split count, reducer), so every program still runs its
    prologue and epilogue: the part that does not grow with the context. "reducer": full minus
    the same graph without the split reducer's launches, the most that combining the partials
    any other way could save (part of "1 key"). "streaming": full minus 1 key, and the KV bytes
    over it. The ratios are 16-bit over INT8; "without reducers" compares both decodes with
    their reducers removed, "INT8 without" the INT8 decode without its reducer against the
    16-bit decode with.
    """
    print(
        f"us per call of a graph of {GRAPH_CALLS} calls; full = 1 key + streaming; "
        "ratios 16-bit / INT8"
    )
    print(
        f"{'q/kv':>5} {'head':>4} {'batch x ctx':>11} {'cache':>5} {'splits':>6} {'full':>6} "
        f"{'1 key':>6} {'reducer':>7} {'streaming':>9} {'TB/s':>5}"
    )
    for geometry, (batch, context) in itertools.product(GEOMETRIES, GEOMETRY_SHAPES):
        if groups and geometry[:2] not in groups:
            continue
        parts = {}
        for cache_dtype in (torch.int8, MODEL_DTYPE):
            setups = [
                DecodeSetup(batch, context, cache_dtype, geometry=geometry)
                for _ in range(GRAPH_CALLS)
            ]
            planned = [planned_run(setup) for setup in setups]
            full = graph_ms(*[run for run, _ in planned])
            without_reducer = graph_ms(*[decode_alone(setup, plan) for setup, (_, plan) in
                                         zip(setups, planned, strict=True)])  # fmt: skip
            for setup in setups:
                setup.seq_lens.fill_(1)
            one_key = graph_ms(*[run for run, _ in planned])
            splits = planned[0][1].num_splits
            reducer = full - without_reducer
            num_bytes = paged_kv_bytes(
                batch,
                context,
                num_kv_heads=geometry[1],
                head_size=geometry[2],
                block_size=BLOCK_SIZE,
                cache_dtype=cache_dtype,
            )
            parts[cache_dtype] = (full, one_key, full - one_key, without_reducer)
            print(
                f"{geometry[0]:>2}/{geometry[1]:<2} {geometry[2]:>4} "
                f"{batch:>3} x {context // 1024:>3}k "
                f"{'int8' if cache_dtype == torch.int8 else '16b':>5} {splits:>6} "
                f"{full * 1e3:>6.1f} {one_key * 1e3:>6.1f} {reducer * 1e3:>7.1f} "
                f"{(full - one_key) * 1e3:>9.1f} {num_bytes / (full - one_key) / 1e9:>5.2f}",
                flush=True,
            )
            del setups, planned
        ratios = [b / a for a, b in zip(parts[torch.int8], parts[MODEL_DTYPE], strict=True)]
        int8_without = parts[MODEL_DTYPE][0] / parts[torch.int8][3]
        print(f"{'':>24} ratio: full {ratios[0]:.2f}x, 1 key {ratios[1]:.2f}x, "
              f"streaming {ratios[2]:.2f}x, without reducers {ratios[3]:.2f}x, "
              f"INT8 without {int8_without:.2f}x")  # fmt: skip


def decode_alone(setup: DecodeSetup, plan: DecodePlan) -> Callable[[], object]:
    """``plan``'s decode kernel without the split reducer's launch (its output left as the
    partials): what a decode that combined its partials for free would take."""
    without_reducer = dataclasses.replace(plan, _reduce=lambda *arguments: None)
    run, _ = planned_run(setup, plan=without_reducer)
    return run


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


# ---- The geometry table of graph and eager time (--geometry) ----

# (query heads, kv heads, head size): Llama-3-8B, Qwen2-7B (GQA 7), head 64, MQA, and GQA 16 on
# one and GQA 16 on two kv heads; each at both shapes (batch, context).
GEOMETRIES = ((32, 8, 128), (28, 4, 128), (32, 8, 64), (32, 1, 128), (16, 1, 128), (32, 2, 128))
GEOMETRY_SHAPES = ((32, 8192), (8, 32768))
# Calls per eager timing: back to back, round robin over GRAPH_CALLS caches, no sync between.
EAGER_CALLS = 50


def eager_ms(calls: Sequence[Callable[[], object]]) -> float:
    """Median over 5 runs of the time per call of EAGER_CALLS back-to-back calls (round robin
    over ``calls``, each over its own cache), the L2 cleared before each run: the kernels' time,
    or the host's launch path where that is slower."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        read_clear()
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for index in range(EAGER_CALLS):
            calls[index % len(calls)]()
        end.record()
        torch.cuda.synchronize()
        times.append(float(start.elapsed_time(end)) / EAGER_CALLS)
    return statistics.median(times)


def planned_run(
    setup: DecodeSetup,
    config: DecodeConfig | None = None,
    num_splits: int | None = None,
    plan: DecodePlan | None = None,
) -> tuple[Callable[[], object], DecodePlan]:
    """The decode as the vLLM plugin launches it: a DecodePlan and a scratch made once, at
    ``config``'s launch shape (None: the shipped one) and ``num_splits`` (None: the launcher's),
    or ``plan`` where given."""
    plan = plan or setup.plan(config, num_splits)
    run = functools.partial(
        plan.run,
        setup.query,
        setup.cache,
        setup.block_table,
        setup.seq_lens,
        setup.geometry[2] ** -0.5,
        out=setup.out,
        scratch=plan.new_scratch(),
    )
    return run, plan


def upstream_bf16() -> Callable[[DecodeSetup], Callable[[], None]] | None:
    """benchmark_upstream's bf16 decode of a setup, or None where vLLM is not importable."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from benchmark_upstream import bf16_decode

    return bf16_decode


@dataclass(frozen=True)
class PvChoice:
    """One INT8 decode of the geometry table (--pv): its P x V dot ("auto": the launch's
    choice, "int8", "fp16"), and for fp16 optionally a forced launch shape,
    "fp16@TILExWARPS[xSTAGES]"."""

    name: str
    fp16_pv: bool | None
    shape: tuple[int, ...] | None = None


def pv_choice(text: str) -> PvChoice:
    """--pv's argument type: auto, int8, fp16 or fp16@TILExWARPS[xSTAGES]."""
    kind, _, shape = text.partition("@")
    choices = {"auto": None, "int8": False, "fp16": True}
    if kind not in choices or (shape and kind != "fp16"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected auto, int8, fp16 or fp16@TILExWARPS[xSTAGES]"
        )
    if not shape:
        return PvChoice(text, choices[kind])
    parts = shape.split("x")
    if len(parts) not in (2, 3) or not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected fp16@TILExWARPS[xSTAGES], e.g. fp16@32x2 or fp16@64x2x4"
        )
    return PvChoice(text, True, tuple(map(int, parts)))


def group_filter(text: str) -> tuple[int, int]:
    """--groups' argument type: Q/KV, query and kv heads of rows of GEOMETRIES."""
    query, _, kv = text.partition("/")
    if not (query.isdigit() and kv.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected query/kv heads, e.g. 32/1")
    return int(query), int(kv)


def int8_config(geometry: tuple[int, int, int], cap: int, choice: PvChoice) -> DecodeConfig:
    """The INT8 decode's launch shape for a geometry row: the integer decode's column cap (0:
    none), the P x V dot ``choice`` names, and its forced launch shape if any."""
    num_q_heads, num_kv_heads, head_size = geometry
    config = decode_config(
        head_size=head_size,
        block_size=BLOCK_SIZE,
        gqa=num_q_heads // num_kv_heads,
        cache_dtype=torch.int8,
        target="cuda",
        fp16_pv=choice.fp16_pv,
        max_columns=cap,
    )
    if choice.shape is None:
        return config
    tile_n, num_warps, *stages = choice.shape
    return dataclasses.replace(
        config,
        tile_n=tile_n,
        num_warps=num_warps,
        num_stages=stages[0] if stages else config.num_stages,
    )


def geometry_table(
    column_caps: list[int],
    choices: list[PvChoice],
    groups: list[tuple[int, int]],
    split_counts: list[int],
) -> None:
    """Graph and eager time per call of our INT8 and 16-bit decodes (and upstream's bf16 where
    vLLM is importable) on each of GEOMETRIES x GEOMETRY_SHAPES (those of ``groups`` if any),
    once per cap on the integer decode's query-head columns (0: none; `_decode_columns`) and
    per choice of the INT8 decode's P x V dot (--pv) and per forced split count (--num-splits; 0:
    the launcher's, the grid's last dimension shows the count).

    "graph": per call of a graph of GRAPH_CALLS decodes over GRAPH_CALLS caches, replayed.
    "eager": per call of EAGER_CALLS back-to-back launches (`eager_ms`): through the plan as the
    plugin launches it, and ("call") through decode_attention at the same launch shape (its
    checks and plan lookup per call). The 16-bit decode takes neither
    setting: it is timed once per geometry and shape, and its figures repeat.
    """
    upstream = upstream_bf16()
    print(
        f"graph: per call of a graph of {GRAPH_CALLS} calls over {GRAPH_CALLS} caches; eager: per "
        f"call of {EAGER_CALLS} back-to-back calls; ms. upstream: "
        + ("vLLM's unified_attention, bf16" if upstream else "skipped, vLLM is not importable")
    )
    print(
        f"{'cols':>4} {'pv':>10} {'q/kv':>5} {'head':>4} {'batch x ctx':>11} {'grid':>13} "
        f"{'int8 graph':>10} {'GB/s':>5} {'eager':>6} {'call':>6} "
        f"{'16b graph':>9} {'eager':>6} {'vs 16b':>6} {'up eager':>8} {'up graph':>8} "
        f"{'int8/up':>7}"
    )
    rows = [
        (geometry, shape)
        for geometry, shape in itertools.product(GEOMETRIES, GEOMETRY_SHAPES)
        if not groups or geometry[:2] in groups
    ]
    baseline: dict[tuple[object, ...], dict[str, float]] = {}
    for cap, choice, splits in itertools.product(column_caps, choices, split_counts):
        for geometry, (batch, context) in rows:
            key = (geometry, batch, context)
            if key not in baseline:
                baseline[key] = sixteen_bit_times(geometry, batch, context, upstream)
            geometry_row(cap, choice, splits or None, geometry, batch, context, baseline[key])


def sixteen_bit_times(
    geometry: tuple[int, int, int],
    batch: int,
    context: int,
    upstream: Callable[[DecodeSetup], Callable[[], None]] | None,
) -> dict[str, float]:
    """Graph and eager ms of our 16-bit decode of one geometry row, and upstream's bf16."""
    setups = [
        DecodeSetup(batch, context, MODEL_DTYPE, geometry=geometry) for _ in range(GRAPH_CALLS)
    ]
    runs = [planned_run(setup)[0] for setup in setups]
    times = {"16b graph": graph_ms(*runs), "16b eager": eager_ms(runs)}
    if upstream is not None:
        calls = [upstream(setup) for setup in setups]
        times["up eager"], times["up graph"] = eager_ms(calls), graph_ms(*calls)
    return times


def geometry_row(
    cap: int,
    choice: PvChoice,
    num_splits: int | None,
    geometry: tuple[int, int, int],
    batch: int,
    context: int,
    baseline: dict[str, float],
) -> None:
    num_q_heads, num_kv_heads, head_size = geometry
    setups = [
        DecodeSetup(batch, context, torch.int8, geometry=geometry) for _ in range(GRAPH_CALLS)
    ]
    config = int8_config(geometry, cap, choice)
    planned = [planned_run(setup, config, num_splits) for setup in setups]
    runs = [run for run, _ in planned]
    times = dict(baseline)
    times["int8 graph"] = graph_ms(*runs)
    times["int8 eager"] = eager_ms(runs)
    calls = [functools.partial(setup.run, num_splits=num_splits, config=config) for setup in setups]
    call = f"{eager_ms(calls):>6.3f}"
    plan = planned[0][1]
    del setups, planned, runs
    per_token_head = 2 * head_size + 8
    gbs = batch * context * num_kv_heads * per_token_head / times["int8 graph"] / 1e6
    grid = "x".join(map(str, plan._decode_grid))
    pv = ("fp16" if plan.fp16_pv else "int8") + (choice.name[4:] if choice.shape else "")
    upstream_cells = (
        f"{times['up eager']:>8.3f} {times['up graph']:>8.3f} "
        f"{times['int8 eager'] / times['up eager']:>6.2f}x"
        if "up eager" in times
        else f"{'-':>8} {'-':>8} {'-':>7}"
    )
    print(
        f"{cap or 'none':>4} {pv:>10} {num_q_heads:>2}/{num_kv_heads:<2} {head_size:>4} "
        f"{batch:>3} x {context // 1024:>3}k {grid:>13} {times['int8 graph']:>10.3f} {gbs:>5.0f} "
        f"{times['int8 eager']:>6.3f} {call:>6} {times['16b graph']:>9.3f} "
        f"{times['16b eager']:>6.3f} {times['16b graph'] / times['int8 graph']:>5.2f}x "
        + upstream_cells,
        flush=True,
    )


def _us(times_ms: list[float]) -> str:
    return "/".join(f"{t * 1e3:.1f}" for t in times_ms)


def profile_target(batch: int, context: int, groups: Sequence[tuple[int, int]]) -> None:
    """Three INT8 and three bf16 decodes of one shape, for a profiler (ncu --launch-skip), in the
    geometry of the one ``groups`` entry (query/kv heads, head size HEAD_SIZE), else the default."""
    geometry = (*groups[0], HEAD_SIZE) if groups else (NUM_Q_HEADS, NUM_KV_HEADS, HEAD_SIZE)
    for dtype in (torch.int8, MODEL_DTYPE):
        setup = DecodeSetup(batch, context, dtype, geometry=geometry)
        for _ in range(3):
            setup.run()
        torch.cuda.synchronize()
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
    parser.add_argument(
        "--geometry",
        action="store_true",
        help="time graph and eager decodes over the issue's geometry table instead",
    )
    parser.add_argument(
        "--parts",
        action="store_true",
        help="split both decodes' time into the fixed and the streaming part per geometry row "
        "instead (--groups selects rows)",
    )
    parser.add_argument(
        "--columns",
        nargs="+",
        type=int,
        default=[8],
        metavar="CAP",
        help="--geometry: caps on the integer INT8 decode's query-head columns to time, in turn "
        "(0: no cap)",
    )
    parser.add_argument(
        "--pv",
        nargs="+",
        type=pv_choice,
        default=[PvChoice("auto", None)],
        metavar="CHOICE",
        help="--geometry: the INT8 decode's P x V dot to time, in turn: auto (the launch's "
        "choice), int8, fp16, or fp16@TILExWARPS[xSTAGES] (a forced launch shape)",
    )
    parser.add_argument(
        "--groups",
        nargs="+",
        type=group_filter,
        default=[],
        metavar="Q/KV",
        help="--geometry: only the rows of these query/kv heads (e.g. 32/1 16/1); --profile: its "
        "geometry",
    )
    parser.add_argument(
        "--num-splits",
        nargs="+",
        type=int,
        default=[0],
        metavar="S",
        help="--geometry: split-KV counts of the INT8 decode to time, in turn (0: the launcher's "
        "choice)",
    )
    parser.add_argument(
        "--profile",
        nargs=2,
        type=int,
        metavar=("BATCH", "CONTEXT"),
        help="run a few decodes of one shape for a profiler instead (in the one --groups "
        "geometry, if given)",
    )
    args = parser.parse_args()
    if args.profile and len(args.groups) > 1:
        parser.error("--profile takes at most one --groups entry")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    if args.profile:
        profile_target(*args.profile, args.groups)
    elif args.sweep:
        sweep()
    elif args.splits:
        split_sweep()
    elif args.budget:
        budget()
    elif args.flush:
        flush_check()
    elif args.parts:
        parts_table(args.groups)
    elif args.geometry:
        geometry_table(args.columns, args.pv, args.groups, args.num_splits)
    else:
        table(copy_bandwidth())


if __name__ == "__main__":
    main()
