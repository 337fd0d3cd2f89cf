"""The kernel driver: kvquant's cache write, decode and prefill attention, INT8 against 16-bit.

Every cell builds a paged cache of random, non-zero data with kvquant's public API, times the
kernel (median and interquartile range of many calls), and reports the bytes it must move, the
bandwidth that achieves and its fraction of the device copy bandwidth measured in the same run.
INT8 cells also get their speedup over the 16-bit cell of the same op and shape.

On a GPU, times come from ``triton.testing.do_bench``, which clears the L2 cache before each
call. On the CPU the kernels run in Triton's interpreter: the figures prove the driver works and
mean nothing about speed.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._matrix import KernelCell, KernelShape

if TYPE_CHECKING:
    import torch

_CACHE_DTYPES = ("int8", "float16", "bfloat16")


def select_device() -> str:
    """CUDA (or ROCm) when present; otherwise the CPU through Triton's interpreter.

    Triton reads TRITON_INTERPRET when kvquant's kernels are first imported, so this has to run
    before that import.
    """
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if "kvquant.ops" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    return "cpu"


def timings_ms(fn: Callable[[], object], device: str, shape: KernelShape) -> list[float]:
    """Milliseconds of repeated calls of ``fn`` after a warm-up call."""
    if device == "cuda":
        import triton.testing  # type: ignore[import-untyped]

        times = triton.testing.do_bench(fn, warmup=25, rep=shape.rep_ms, return_mode="all")
        return [float(t) for t in times]
    fn()  # compiles (or, interpreted, traces) outside the timed calls
    times = []
    for _ in range(shape.cpu_runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def copy_bandwidth_gbs(device: str, shape: KernelShape) -> float:
    """Device copy bandwidth in GB/s (bytes read plus written), the ceiling for every cell."""
    import torch

    # On the CPU a small buffer: the interpreter's cells are tiny too.
    mib = shape.copy_buffer_mib if device == "cuda" else 64
    src = torch.randn(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    median = statistics.median(timings_ms(lambda: dst.copy_(src), device, shape))
    return 2 * src.numel() * src.element_size() / median / 1e6


def _spread(times: list[float]) -> float:
    """Interquartile range: robust against the odd preempted call."""
    if len(times) < 2:
        return 0.0
    quartiles = statistics.quantiles(times, n=4)
    return quartiles[2] - quartiles[0]


class _Setup:
    """A full paged cache of random data for ``batch`` sequences of ``context`` tokens."""

    def __init__(self, cell: KernelCell, device: str) -> None:
        import torch

        from kvquant import allocate_cache, page_bytes

        if cell.cache_dtype not in _CACHE_DTYPES:
            msg = f"`cache_dtype` is {cell.cache_dtype!r}; expected one of {_CACHE_DTYPES}"
            raise ValueError(msg)
        s = cell.shape
        self.cache_dtype: torch.dtype = getattr(torch, cell.cache_dtype)
        model_dtype = getattr(torch, s.model_dtype)
        # A 16-bit cache holds the model's dtype; INT8 cells still take model-dtype activations.
        activation = model_dtype if self.cache_dtype == torch.int8 else self.cache_dtype
        self.pages_per_seq = -(-cell.context // s.block_size)
        num_blocks = cell.batch * self.pages_per_seq
        self.page_bytes = page_bytes(s.num_kv_heads, s.block_size, s.head_size, self.cache_dtype)
        self.cache = allocate_cache(
            num_blocks, s.num_kv_heads, s.head_size, s.block_size, self.cache_dtype, device
        )
        if self.cache.k_scale is not None and self.cache.v_scale is not None:
            self.cache.pages.random_(-128, 128)
            self.cache.k_scale.uniform_(0.005, 0.02)
            self.cache.v_scale.uniform_(0.005, 0.02)
        else:
            self.cache.pages.normal_()
        order = torch.randperm(num_blocks, device=device)
        self.block_table = order.view(cell.batch, self.pages_per_seq).to(torch.int32)
        self.seq_lens = torch.full((cell.batch,), cell.context, dtype=torch.int32, device=device)
        self.activation = activation
        self.device = device


def _cache_write(cell: KernelCell, setup: _Setup) -> tuple[Callable[[], object], int]:
    import torch

    from kvquant import cache_write

    s = cell.shape
    tokens = cell.batch * cell.context
    kv_shape = (tokens, s.num_kv_heads, s.head_size)
    key = torch.randn(kv_shape, device=setup.device, dtype=setup.activation)
    value = torch.randn_like(key)
    # Each token to its own slot, pages in the shuffled block-table order.
    positions = torch.arange(cell.context, device=setup.device)
    pages = setup.block_table.long()[:, positions // s.block_size]
    slots = (pages * s.block_size + positions % s.block_size).reshape(-1)
    written = cell.batch * setup.pages_per_seq * setup.page_bytes
    moved = 2 * key.numel() * key.element_size() + written
    return lambda: cache_write(setup.cache, key, value, slots, validate=False), moved


def _decode(cell: KernelCell, setup: _Setup) -> tuple[Callable[[], object], int]:
    import torch

    from kvquant import decode_attention

    s = cell.shape
    query = torch.randn(
        cell.batch, s.num_q_heads, s.head_size, device=setup.device, dtype=setup.activation
    )
    out = torch.empty_like(query)
    # A decode must read every K/V byte (scales included) once; queries are negligible.
    moved = cell.batch * setup.pages_per_seq * setup.page_bytes
    return (
        lambda: decode_attention(
            query,
            setup.cache,
            setup.block_table,
            setup.seq_lens,
            s.head_size**-0.5,
            out=out,
            max_seq_len=cell.context,
            validate=False,
        ),
        moved,
    )


def _prefill(cell: KernelCell, setup: _Setup) -> tuple[Callable[[], object], int]:
    import torch

    from kvquant import prefill_attention

    s = cell.shape
    query = torch.randn(
        cell.batch * cell.context,
        s.num_q_heads,
        s.head_size,
        device=setup.device,
        dtype=setup.activation,
    )
    out = torch.empty_like(query)
    cu_seqlens_q = torch.arange(cell.batch + 1, device=setup.device, dtype=torch.int32)
    cu_seqlens_q *= cell.context
    # The whole context is new: the cache is read at least once, queries read, outputs written.
    moved = cell.batch * setup.pages_per_seq * setup.page_bytes + 2 * query.numel() * 2
    return (
        lambda: prefill_attention(
            query,
            setup.cache,
            setup.block_table,
            setup.seq_lens,
            cu_seqlens_q,
            s.head_size**-0.5,
            out=out,
        ),
        moved,
    )


_OPS = {"cache_write": _cache_write, "decode": _decode, "prefill": _prefill}


def run_kernel_cell(cell: KernelCell, device: str, copy_gbs: float) -> dict[str, Any]:
    """Time one kernel cell; returns the cell's result fields (status "ok")."""
    setup = _Setup(cell, device)
    fn, moved = _OPS[cell.op](cell, setup)
    times = timings_ms(fn, device, cell.shape)
    median = statistics.median(times)
    gbs = moved / median / 1e6
    return {
        "status": "ok",
        "value": median,
        "spread": _spread(times),
        "bytes": moved,
        "gbs": gbs,
        "copy_fraction": gbs / copy_gbs,
        "copy_gbs": copy_gbs,
        "device": device,
    }


def add_speedups(cells: list[dict[str, Any]]) -> None:
    """Give each INT8 kernel cell ``speedup_vs_16bit``: the 16-bit cell's time over its own."""
    sixteen_bit = {
        (c["op"], c["batch"], c["context"]): c["value"]
        for c in cells
        if c["kind"] == "kernel" and c["status"] == "ok" and c["cache_dtype"] != "int8"
    }
    for cell in cells:
        if cell["kind"] != "kernel" or cell["status"] != "ok" or cell["cache_dtype"] != "int8":
            continue
        baseline = sixteen_bit.get((cell["op"], cell["batch"], cell["context"]))
        cell["speedup_vs_16bit"] = baseline / cell["value"] if baseline else None
