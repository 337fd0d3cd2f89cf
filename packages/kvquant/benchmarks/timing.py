"""Timing shared by the benchmarks: CUDA-event medians with the L2 cleared before every call.

Every timed call starts with an L2 that holds none of its bytes: a kernel reads a buffer over
four times the L2's size first. Triton's do_bench clears it by zeroing that buffer instead, and
the dirty lines the zeroing leaves are written back to DRAM while the next timed call runs. On
the H200 that added 7.6-9.8 us to every decode of either cache, a tenth of the INT8 batch 16 / 8k
call (NOTES.md, session 10; `benchmark_paged_attention.py --flush` shows both).

Two references are timed the same way: the device's copy bandwidth, and a plain read of a given
number of bytes by a kernel that does nothing else, against which a kernel that must read as
many bytes can be judged at its own size (launch and ramp included).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable

import torch
import triton
import triton.language as tl

# Over four times the H200's L2 (60 MiB, as torch reports it).
_CLEAR_BYTES = 256 * 2**20
# do_bench's defaults as the benchmarks used them: warm up for 25 ms, then time for 200 ms.
_WARMUP_MS, _REPEAT_MS = 25.0, 200.0
# The plain read's launch: the fastest of 180 settings (programs per SM, words per step, warps,
# stages) reading 277 MB on the H200, graph-timed: 66.0 us, 4.19 TB/s; 4.52 TB/s at 8x the bytes
# (NOTES.md, session 11). Several others came within 0.3 us of it.
_READ_PROGRAMS_PER_SM, _READ_BLOCK, _READ_WARPS, _READ_STAGES = 8, 1024, 8, 2


@functools.cache
def _clear_buffers() -> tuple[torch.Tensor, torch.Tensor]:
    """The buffer read to clear the L2, and the scalar its sum goes to."""
    return torch.ones(_CLEAR_BYTES // 4, device="cuda"), torch.empty((), device="cuda")


def read_clear() -> None:
    """Evict the L2 by reading the clear buffer: it is left holding clean lines only."""
    buffer, total = _clear_buffers()
    torch.sum(buffer, dim=0, out=total)


def zero_clear() -> None:
    """do_bench's clear: zero the buffer, which leaves the L2 full of dirty lines."""
    _clear_buffers()[0].zero_()


def median_ms(fn: Callable[[], object], clear: Callable[[], None] = read_clear) -> float:
    """Median time of ``fn`` in ms, each call timed alone with events after ``clear()``."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()  # type: ignore[no-untyped-call]
    for _ in range(5):
        clear()
        fn()
    end.record()  # type: ignore[no-untyped-call]
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)  # type: ignore[no-untyped-call]
    for _ in range(max(1, int(_WARMUP_MS / estimate_ms))):
        fn()
    repeats = max(1, int(_REPEAT_MS / estimate_ms))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for call_start, call_end in zip(starts, ends, strict=True):
        clear()
        call_start.record()  # type: ignore[no-untyped-call]
        fn()
        call_end.record()  # type: ignore[no-untyped-call]
    torch.cuda.synchronize()
    return statistics.median(
        s.elapsed_time(e)  # type: ignore[no-untyped-call]
        for s, e in zip(starts, ends, strict=True)
    )


def graph_ms(*calls: Callable[[], object], clear: Callable[[], None] = read_clear) -> float:
    """Median time per call of ``calls`` captured in order in one CUDA graph and replayed."""
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
    return median_ms(graph.replay, clear) / len(calls)


def copy_bandwidth() -> float:
    """Device copy bandwidth in GB/s, bytes read plus bytes written, on a 2 GiB buffer."""
    src = torch.randn(2**29, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / median_ms(lambda: dst.copy_(src)) / 1e6


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
    `graph_ms` times it: the reference for a kernel that must read that many bytes once.

    ``calls`` > 1: a graph of that many reads, each over its own buffer (no L2 reuse).
    """
    if num_bytes % 16:
        raise ValueError(f"num_bytes is {num_bytes}; expected a multiple of 16")
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
