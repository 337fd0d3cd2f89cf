"""The kernel driver: kvquant's cache write, decode and prefill attention, INT8 against 16-bit,
and the baselines beside them (`_upstream`: upstream vLLM's Triton kernels, SDPA flash).

Every cell builds its inputs with ``kvquant.timing.random_sequences`` (a paged cache of random,
non-zero data, every page once in a shuffled block table), times the kernel, and reports the bytes
it must move, the bandwidth that achieves and its fraction of the device copy bandwidth measured
in the same run. That copy bandwidth counts the bytes a copy reads and writes, while a decode only
reads: a decode that reads at the memory's full speed shows a fraction a little above 1. INT8
cells also get the ratio of their bytes to the 16-bit cell's of the same op and shape. Each of
kvquant's cells gets its speed-up over each timed baseline of the same op and shape: its 16-bit
twin (INT8 cells), upstream's bf16 and INT8 kernels, SDPA flash (the baseline's time over its own).

On a GPU the cells are timed as kvquant's benchmarks time the same shapes (``kvquant.timing``:
every call after a read that clears the L2; decode and prefill as replayed CUDA graphs, the cache
write eagerly, as ``benchmark_decode_attention.py``, ``benchmark_prefill_attention.py`` and
``benchmark_cache_write.py`` do), so a cell's figure is the benchmark's. On the CPU the kernels
run in Triton's interpreter: such a cell is a functional check, timed by the clock, and never
compared for speed.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvquant.cache_dtypes import KERNELS, cache_dtype

from ._errors import BaselineUnavailableError
from ._matrix import KernelCell, KernelShape
from ._measurement import INTERPRETER_CHECK, TIMED
from ._upstream import baseline_name, load_upstream, sdpa_call, upstream_call

if TYPE_CHECKING:
    import torch

# On the CPU, the copy ceiling's buffer: the interpreter's cells are tiny too.
_CPU_COPY_BUFFER_MIB = 64


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


def copy_bandwidth_gbs(device: str, shape: KernelShape) -> float:
    """Device copy bandwidth in GB/s (bytes read plus written), the ceiling for every cell."""
    from kvquant.timing import copy_bandwidth

    mib = shape.copy_buffer_mib if device == "cuda" else _CPU_COPY_BUFFER_MIB
    return copy_bandwidth(mib * 2**20, device=device, cpu_runs=shape.cpu_runs)


def _dtypes(cell: KernelCell) -> tuple[torch.dtype, torch.dtype]:
    """The cell's cache dtype, and its activations': the model's for an INT8 cache; a 16-bit
    cache holds the model's dtype, so its activations are the cache's dtype."""
    import torch

    stored = cache_dtype(cell.cache_dtype, KERNELS).torch_dtype or cell.shape.model_dtype
    cache: torch.dtype = getattr(torch, stored)
    int8 = cache == torch.int8
    return cache, getattr(torch, cell.shape.model_dtype) if int8 else cache


def moved_bytes(cell: KernelCell) -> int:
    """The bytes a cell's kernel must move at least, as kvquant's benchmarks count them.

    decode: every K/V byte of every sequence's pages (scales included), read once; queries are
    negligible. cache_write: the new K and V read, their pages written. prefill: the pages read
    once, the new tokens' queries read and outputs written.
    """
    from kvquant.timing import paged_kv_bytes

    s = cell.shape
    cache_dtype, activation = _dtypes(cell)
    pages = paged_kv_bytes(
        cell.batch,
        cell.context,
        num_kv_heads=s.num_kv_heads,
        head_size=s.head_size,
        block_size=s.block_size,
        cache_dtype=cache_dtype,
    )
    if cell.op == "cache_write":
        new_kv = 2 * cell.batch * cell.context * s.num_kv_heads * s.head_size
        return new_kv * activation.itemsize + pages
    if cell.op == "prefill":
        queries = cell.batch * (cell.context - cell.prefix) * s.num_q_heads * s.head_size
        return pages + 2 * queries * activation.itemsize
    return pages


@dataclass(frozen=True)
class _Call:
    """One cell's kernel call, and whether a CUDA graph can hold it."""

    fn: Callable[[], object]
    graphable: bool


def _times_ms(call: _Call, device: str, shape: KernelShape) -> tuple[list[float], str]:
    """The timed calls in ms and how they were timed."""
    from kvquant import timing

    if device != "cuda":
        return timing.cpu_times_ms(call.fn, shape.cpu_runs), "wall-clock"
    if call.graphable:
        return timing.graph_times_ms(call.fn, repeat_ms=shape.rep_ms), "cuda-graph"
    return timing.event_times_ms(call.fn, repeat_ms=shape.rep_ms), "cuda-events"


def _spread(times: list[float]) -> float:
    """Interquartile range: robust against the odd preempted call."""
    if len(times) < 2:
        return 0.0
    quartiles = statistics.quantiles(times, n=4)
    return quartiles[2] - quartiles[0]


class _Setup:
    """A full paged cache of random data for ``batch`` sequences of ``context`` tokens."""

    def __init__(self, cell: KernelCell, device: str) -> None:
        from kvquant.timing import random_sequences

        s = cell.shape
        cache_dtype, self.activation = _dtypes(cell)
        self.sequences = random_sequences(
            cell.batch,
            cell.context,
            num_kv_heads=s.num_kv_heads,
            head_size=s.head_size,
            block_size=s.block_size,
            cache_dtype=cache_dtype,
            device=device,
        )
        self.device = device


def _cache_write(cell: KernelCell, setup: _Setup) -> _Call:
    import torch

    from kvquant import cache_write

    s = cell.shape
    tokens = cell.batch * cell.context
    kv_shape = (tokens, s.num_kv_heads, s.head_size)
    key = torch.randn(kv_shape, device=setup.device, dtype=setup.activation)
    value = torch.randn_like(key)
    # Slots in order, as a prefill fills fresh pages (benchmark_cache_write.py's "in order").
    slots = torch.arange(tokens, device=setup.device)
    cache = setup.sequences.cache
    return _Call(lambda: cache_write(cache, key, value, slots, validate=False), graphable=False)


def _decode(cell: KernelCell, setup: _Setup) -> _Call:
    import torch

    from kvquant import decode_attention

    s = cell.shape
    seqs = setup.sequences
    query = torch.randn(
        cell.batch, s.num_q_heads, s.head_size, device=setup.device, dtype=setup.activation
    )
    out = torch.empty_like(query)
    return _Call(
        lambda: decode_attention(
            query,
            seqs.cache,
            seqs.block_table,
            seqs.seq_lens,
            s.head_size**-0.5,
            out=out,
            max_seq_len=cell.context,
            validate=False,
        ),
        graphable=True,
    )


def _prefill(cell: KernelCell, setup: _Setup) -> _Call:
    import torch

    from kvquant.ops.prefill import plan_prefill

    s = cell.shape
    seqs = setup.sequences
    new_tokens = cell.context - cell.prefix
    query = torch.randn(
        cell.batch * new_tokens,
        s.num_q_heads,
        s.head_size,
        device=setup.device,
        dtype=setup.activation,
    )
    cu_seqlens_q = torch.arange(cell.batch + 1, device=setup.device, dtype=torch.int32)
    cu_seqlens_q *= new_tokens
    # The plan reads cu_seqlens_q on the host once; its launch is what a CUDA graph holds.
    plan = plan_prefill(
        query,
        seqs.cache,
        seqs.block_table,
        seqs.seq_lens,
        cu_seqlens_q,
        s.head_size**-0.5,
        out=torch.empty_like(query),
    )
    return _Call(plan.run, graphable=True)


_OPS = {"cache_write": _cache_write, "decode": _decode, "prefill": _prefill}


def _call(cell: KernelCell, device: str) -> _Call:
    """The cell's kernel call: kvquant's, or its baseline's, which may be unavailable here."""
    if cell.impl == "sdpa":
        _, activation = _dtypes(cell)
        return _Call(sdpa_call(cell, activation, device), graphable=True)
    setup = _Setup(cell, device)
    if cell.impl == "vllm":
        fn, graphable = upstream_call(cell, setup.sequences, setup.activation, device)
        return _Call(fn, graphable)
    return _OPS[cell.op](cell, setup)


def baseline_version(impl: str) -> str | None:
    """What a baseline cell ran, by name and version; None for kvquant's own cells."""
    if impl == "vllm":
        found = load_upstream()
        return None if isinstance(found, str) else baseline_name(found)
    if impl == "sdpa":
        import torch

        return f"PyTorch {torch.__version__} SDPA flash"
    return None


def run_kernel_cell(cell: KernelCell, device: str, copy_gbs: float) -> dict[str, Any]:
    """Time one kernel cell; returns the cell's result fields (status "ok", or "not-measured"
    with why for a baseline that cannot run here)."""
    try:
        call = _call(cell, device)
    except BaselineUnavailableError as why:
        return {"status": "not-measured", "error": str(why), "device": device}
    times, method = _times_ms(call, device, cell.shape)
    median = statistics.median(times)
    moved = moved_bytes(cell)
    gbs = moved / median / 1e6
    measurement = TIMED if device == "cuda" else INTERPRETER_CHECK
    return {
        "status": "ok",
        "value": median,
        "spread": _spread(times),
        "bytes": moved,
        "gbs": gbs,
        "copy_fraction": gbs / copy_gbs,
        "copy_gbs": copy_gbs,
        "device": device,
        "timing_method": method,
        "measurement": measurement,
        "functional_check": measurement != TIMED,
        "baseline": baseline_version(cell.impl),
    }


# A kvquant cell's speed-up over each baseline: its field, and the baseline's (impl, cache).
SPEEDUPS = {
    "speedup_vs_16bit": ("kvquant", "16-bit"),
    "speedup_vs_upstream_bf16": ("vllm", "16-bit"),
    "speedup_vs_upstream_int8": ("vllm", "int8"),
    "speedup_vs_sdpa": ("sdpa", "16-bit"),
}


def add_ratios(cells: list[dict[str, Any]]) -> None:
    """Give each of kvquant's kernel cells its baselines of the same op and shape: for an INT8
    cell, ``bytes_vs_16bit``, its bytes over its 16-bit twin's (what a token costs, measured or
    not); for every kvquant cell each `SPEEDUPS` field, the baseline's time over its own, only when
    both were timed (None otherwise: a functional check's time is no speed, and a baseline not
    measured is none). An INT8 cell has no 16-bit speed-up over itself, nor a 16-bit one over an
    INT8 baseline."""

    def shape(cell: dict[str, Any]) -> tuple[Any, ...]:
        return (cell["op"], cell["heads"], cell["batch"], cell["context"], cell["prefix"])

    def kind(cell: dict[str, Any]) -> tuple[str, str]:
        return cell.get("impl", "kvquant"), "int8" if cell["cache_dtype"] == "int8" else "16-bit"

    ok = [c for c in cells if c["kind"] == "kernel" and c["status"] == "ok"]
    baselines = {(kind(c), shape(c)): c for c in ok}
    for cell in ok:
        impl, cache = kind(cell)
        if impl != "kvquant":
            continue
        if cache == "int8":
            twin = baselines.get((("kvquant", "16-bit"), shape(cell)))
            cell["bytes_vs_16bit"] = twin and cell["bytes"] / twin["bytes"]
        for field, wanted in SPEEDUPS.items():
            cell[field] = None
            if wanted == ("kvquant", cache) or (cache == "16-bit" and wanted[1] == "int8"):
                continue
            baseline = baselines.get((wanted, shape(cell)))
            if baseline is not None and not (
                baseline["functional_check"] or cell["functional_check"]
            ):
                cell[field] = baseline["value"] / cell["value"]
