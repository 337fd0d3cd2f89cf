"""How kvquant's kernels are timed: by its benchmarks and by kvbench's kernel cells alike.

On a CUDA device every timed call starts with an L2 that holds none of its bytes: a kernel reads
a buffer over four times the L2's size first (``read_clear``). Triton's ``do_bench`` clears it by
zeroing that buffer instead, and the dirty lines the zeroing leaves are written back to DRAM while
the next timed call runs: on the H200 that added 7.6-9.8 us to every decode of either cache, a
tenth of the INT8 batch 16 / 8k call (``benchmarks/benchmark_decode_attention.py --flush`` shows
both). Each call is timed alone with a pair of CUDA events, eagerly (``median_ms``) or as the
replay of a CUDA graph (``graph_ms``: the kernel time, as vLLM runs a decode step).

Two references are timed the same way: the device's copy bandwidth, and a plain read of a given
number of bytes by a kernel that does nothing else, against which a kernel that must read as many
bytes can be judged at its own size (launch and ramp included).

On the CPU the kernels run in Triton's interpreter, and ``cpu_times_ms`` times them with a plain
clock: such a figure shows that a kernel runs, never how fast it is.

The inputs of every timed attention call come from here too (``random_sequences``), so that two
programs timing the same shape time the same work on the same kind of data.

Importing this module needs torch and Triton only; CUDA work happens when a function is called.
"""

# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (the @triton.jit plain-read kernel takes Triton tensors, which have no Python types)

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._cache import PagedKVCache, allocate_cache, page_bytes

# Over four times the H200's L2 (60 MiB, as torch reports it).
CLEAR_BYTES = 256 * 2**20
# do_bench's defaults, as the benchmarks have always used them: warm up for 25 ms, time for 200 ms.
WARMUP_MS, REPEAT_MS = 25.0, 200.0
# The copy ceiling's buffer: large enough that no cache level holds it on the H200.
COPY_BUFFER_BYTES = 2**31
# The plain read's launch: the fastest of 180 settings (programs per SM, words per step, warps,
# stages) reading 277 MB on the H200, graph-timed: 66.0 us, 4.19 TB/s; 4.52 TB/s at 8x the bytes.
# Several others came within 0.3 us of it.
_READ_PROGRAMS_PER_SM, _READ_BLOCK, _READ_WARPS, _READ_STAGES = 8, 1024, 8, 2


@functools.cache
def _clear_buffers() -> tuple[torch.Tensor, torch.Tensor]:
    """The buffer read to clear the L2, and the scalar its sum goes to."""
    return torch.ones(CLEAR_BYTES // 4, device="cuda"), torch.empty((), device="cuda")


def read_clear() -> None:
    """Evict the L2 by reading the clear buffer: it is left holding clean lines only."""
    buffer, total = _clear_buffers()
    torch.sum(buffer, dim=0, out=total)


def zero_clear() -> None:
    """do_bench's clear: zero the buffer, which leaves the L2 full of dirty lines."""
    _clear_buffers()[0].zero_()


def _event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def event_times_ms(
    fn: Callable[[], object],
    clear: Callable[[], None] = read_clear,
    *,
    repeat_ms: float = REPEAT_MS,
) -> list[float]:
    """Each timed call of ``fn`` in ms, timed alone with CUDA events after ``clear()``.

    After a first call (compiling), calls run for about ``WARMUP_MS``, then are timed for about
    ``repeat_ms``, as estimated from five cleared calls.
    """
    fn()
    torch.cuda.synchronize()
    start, end = _event(), _event()
    start.record()
    for _ in range(5):
        clear()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(float(start.elapsed_time(end)) / 5, 1e-3)
    for _ in range(max(1, int(WARMUP_MS / estimate_ms))):
        fn()
    repeats = max(1, int(repeat_ms / estimate_ms))
    starts = [_event() for _ in range(repeats)]
    ends = [_event() for _ in range(repeats)]
    for call_start, call_end in zip(starts, ends, strict=True):
        clear()
        call_start.record()
        fn()
        call_end.record()
    torch.cuda.synchronize()
    return [float(s.elapsed_time(e)) for s, e in zip(starts, ends, strict=True)]


def median_ms(
    fn: Callable[[], object],
    clear: Callable[[], None] = read_clear,
    *,
    repeat_ms: float = REPEAT_MS,
) -> float:
    """Median of ``event_times_ms``: the eager time of one call, Python launch path included."""
    return statistics.median(event_times_ms(fn, clear, repeat_ms=repeat_ms))


def graph_times_ms(
    *calls: Callable[[], object],
    clear: Callable[[], None] = read_clear,
    repeat_ms: float = REPEAT_MS,
) -> list[float]:
    """Time per call of ``calls``, captured in order in one CUDA graph, for each timed replay.

    A graph of one call still pays a graph launch and an event pair (~4 us on the H200), which a
    call inside a model's graph does not.
    """
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()  # compiles and allocates outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    replays = event_times_ms(graph.replay, clear, repeat_ms=repeat_ms)
    return [replay / len(calls) for replay in replays]


def graph_ms(
    *calls: Callable[[], object],
    clear: Callable[[], None] = read_clear,
    repeat_ms: float = REPEAT_MS,
) -> float:
    """Median of ``graph_times_ms``: the kernel time per call."""
    return statistics.median(graph_times_ms(*calls, clear=clear, repeat_ms=repeat_ms))


def cpu_times_ms(fn: Callable[[], object], runs: int) -> list[float]:
    """``runs`` calls of ``fn`` in ms by the wall clock, after one untimed call (which compiles,
    or in Triton's interpreter traces): the CPU path, where the figure says only that it runs."""
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def copy_bandwidth(
    buffer_bytes: int = COPY_BUFFER_BYTES, *, device: str = "cuda", cpu_runs: int = 3
) -> float:
    """Device copy bandwidth in GB/s, bytes read plus bytes written, of one ``buffer_bytes`` copy.

    On a CUDA device timed as ``median_ms`` times it; on the CPU by ``cpu_times_ms``.
    """
    src = torch.randn(buffer_bytes // 4, device=device)
    dst = torch.empty_like(src)

    def copy() -> None:
        dst.copy_(src)

    ms = median_ms(copy) if device == "cuda" else statistics.median(cpu_times_ms(copy, cpu_runs))
    return 2 * src.numel() * src.element_size() / ms / 1e6


@triton.jit
def _plain_read_kernel(words_ptr, out_ptr, num_words, words_per_program, BLOCK: tl.constexpr):
    """XOR of one program's span of int32 words: a read whose result depends on every byte."""
    start = tl.program_id(0).to(tl.int64) * words_per_program
    end = tl.multiple_of(tl.minimum(start + words_per_program, num_words), 4)  # 16-byte loads
    folded = tl.zeros([BLOCK], tl.int32)
    for offset in range(start, end, BLOCK):
        words = offset + tl.arange(0, BLOCK)
        folded ^= tl.load(words_ptr + words, mask=words < end, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(folded, axis=0))


def plain_read_ms(num_bytes: int, calls: int = 1) -> float:
    """Time per call of reading ``num_bytes`` (a multiple of 16) with nothing else to do, as
    ``graph_ms`` times it: the reference for a kernel that must read that many bytes once.

    ``calls`` > 1: a graph of that many reads, each over its own buffer (no L2 reuse).
    """
    if num_bytes % 16:
        raise ValueError(f"`num_bytes` is {num_bytes}; expected a multiple of 16")
    num_words = num_bytes // 4
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    programs = sms * _READ_PROGRAMS_PER_SM
    per_program = triton.cdiv(triton.cdiv(num_words, programs), _READ_BLOCK) * _READ_BLOCK
    folds = torch.empty(programs, dtype=torch.int32, device="cuda")
    buffers = [torch.ones(num_words, dtype=torch.int32, device="cuda") for _ in range(calls)]
    reads = [
        functools.partial(
            _plain_read_kernel[(programs,)],
            buffer,
            folds,
            num_words,
            per_program,
            BLOCK=_READ_BLOCK,
            num_warps=_READ_WARPS,
            num_stages=_READ_STAGES,
        )
        for buffer in buffers
    ]
    return graph_ms(*reads)


@dataclass(frozen=True)
class RandomSequences:
    """``batch`` sequences of ``context`` tokens each, every one held whole in a paged cache.

    Attributes:
        cache: random, non-zero pages (``fill_random``), exactly the pages the sequences use.
        block_table: int32 ``[batch, pages_per_seq]``, every page once, in a random order.
        seq_lens: int32 ``[batch]``, all ``context``.
    """

    cache: PagedKVCache
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    context: int


def fill_random(cache: PagedKVCache) -> None:
    """Random, non-zero pages: INT8 codes over the whole int8 range with scales in [0.005, 0.02];
    16-bit values from N(0, 1). Zeros would let a kernel or the memory system take shortcuts."""
    if cache.k_scale is not None and cache.v_scale is not None:
        cache.pages.random_(-128, 128)
        cache.k_scale.uniform_(0.005, 0.02)
        cache.v_scale.uniform_(0.005, 0.02)
    else:
        cache.pages.normal_()


def random_sequences(
    batch: int,
    context: int,
    *,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    cache_dtype: torch.dtype,
    device: torch.device | str,
) -> RandomSequences:
    """The cache, block table and lengths of ``batch`` full sequences of random data."""
    pages_per_seq = -(-context // block_size)
    num_blocks = batch * pages_per_seq
    cache = allocate_cache(num_blocks, num_kv_heads, head_size, block_size, cache_dtype, device)
    fill_random(cache)
    order = torch.randperm(num_blocks, device=device, dtype=torch.int64)
    return RandomSequences(
        cache=cache,
        block_table=order.view(batch, pages_per_seq).to(torch.int32),
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device=device),
        context=context,
    )


def paged_kv_bytes(
    batch: int,
    context: int,
    *,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    cache_dtype: torch.dtype,
) -> int:
    """Bytes of the pages holding ``batch`` sequences of ``context`` tokens (scales included):
    what a decode over them must read, and what a write of them must store."""
    pages = batch * -(-context // block_size)
    return pages * page_bytes(num_kv_heads, block_size, head_size, cache_dtype)


__all__ = [
    "CLEAR_BYTES",
    "COPY_BUFFER_BYTES",
    "REPEAT_MS",
    "WARMUP_MS",
    "RandomSequences",
    "copy_bandwidth",
    "cpu_times_ms",
    "event_times_ms",
    "fill_random",
    "graph_ms",
    "graph_times_ms",
    "median_ms",
    "paged_kv_bytes",
    "plain_read_ms",
    "random_sequences",
    "read_clear",
    "zero_clear",
]
