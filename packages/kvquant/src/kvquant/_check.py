"""The correctness stage: kernels against the fp32 references, plus the edge-case checks.

Kernels on the CPU run in Triton's interpreter, which is chosen when Triton is imported: set
``TRITON_INTERPRET=1`` before importing kvquant (the ``kvquant check`` CLI does this itself).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton

from . import reference
from ._batch import PagedBatch, make_paged_batch
from ._cache import allocate_cache, from_upstream_layout, to_upstream_layout
from ._correctness import CaseResult, CorrectnessResult, EdgeResult
from ._errors import InvalidInputError, KernelUnavailableError
from .ops._common import interpreted
from .ops.cache_write import cache_write
from .ops.decode import decode_attention
from .ops.prefill import prefill_attention

# Kernel output against the fp32 reference on the same dequantized cache (DESIGN.md, "Correctness").
ATTENTION_TOLERANCE = 2e-3
# The 16-bit baseline rounds P to bf16/fp16 before the P.V dot, as bf16 flash kernels do; that
# alone measures 1e-3 to 2e-3 here (the interpreter truncates rather than rounds to nearest).
BASELINE_TOLERANCE = 4e-3
_SEED = 20261129


@dataclass(frozen=True)
class _Shape:
    kernel: str  # "cache_write", "decode_attention" or "prefill_attention"
    cache_dtype: torch.dtype
    model_dtype: torch.dtype
    head_size: int
    block_size: int
    gqa: int
    sliding_window: int | None = None
    softcap: float | None = None
    num_splits: int | None = None  # decode: forced split-KV count; None lets the launcher choose

    @property
    def label(self) -> str:
        """The kernel as the report names it: a forced split count is part of the name."""
        return self.kernel if self.num_splits is None else f"{self.kernel}, {self.num_splits} split"


def _dtype_name(cache_dtype: torch.dtype, model_dtype: torch.dtype) -> str:
    cache, model = (str(d).removeprefix("torch.") for d in (cache_dtype, model_dtype))
    return f"{cache} cache, {model}"


def _shapes(quick: bool) -> list[_Shape]:
    i8, bf16, f16 = torch.int8, torch.bfloat16, torch.float16
    if quick:
        return [
            _Shape("cache_write", i8, bf16, 128, 16, 1),
            _Shape("cache_write", i8, f16, 80, 32, 1),
            _Shape("cache_write", bf16, bf16, 64, 16, 1),
            _Shape("decode_attention", i8, bf16, 128, 16, 4),
            _Shape("decode_attention", i8, f16, 80, 32, 1),
            _Shape("decode_attention", i8, bf16, 256, 64, 8),
            _Shape("decode_attention", i8, bf16, 96, 16, 8, sliding_window=40, softcap=30.0),
            _Shape("decode_attention", bf16, bf16, 128, 16, 4),
            # Large batches get one split, whose decode writes the result itself (no reducer).
            _Shape("decode_attention", i8, bf16, 128, 16, 4, num_splits=1),
            _Shape("prefill_attention", i8, bf16, 128, 16, 4),
            _Shape("prefill_attention", i8, f16, 64, 32, 8, sliding_window=24, softcap=20.0),
            _Shape("prefill_attention", bf16, bf16, 96, 64, 1),
        ]
    shapes = []
    for kernel in ("cache_write", "decode_attention", "prefill_attention"):
        for head_size in (64, 80, 96, 128, 256):
            for block_size in (16, 32, 64):
                for gqa in (1, 4, 8) if kernel != "cache_write" else (1,):
                    for cache_dtype, model_dtype in ((i8, bf16), (i8, f16), (bf16, bf16)):
                        shapes.append(
                            _Shape(kernel, cache_dtype, model_dtype, head_size, block_size, gqa)
                        )
    return shapes


def _rel_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    diff = (actual.double() - expected.double()).norm()
    norm = expected.double().norm()
    return float(diff / norm) if norm > 0 else float(diff)


def _seq_lens(block_size: int, long: int) -> list[int]:
    """The issue's mix: 1, block_size - 1, block_size + 1 and a long sequence."""
    return [1, block_size - 1, block_size + 1, long]


def _run_case(shape: _Shape, device: torch.device, quick: bool, gen: torch.Generator) -> CaseResult:
    long = 200 if quick else 1100
    seq_lens = _seq_lens(shape.block_size, long)
    prefill = shape.kernel == "prefill_attention"
    q_lens = [1, shape.block_size - 1, 2, 37] if prefill else None
    batch = make_paged_batch(
        seq_lens=seq_lens,
        q_lens=q_lens,
        num_kv_heads=2,
        group=shape.gqa,
        head_size=shape.head_size,
        block_size=shape.block_size,
        cache_dtype=shape.cache_dtype,
        model_dtype=shape.model_dtype,
        device=device,
        generator=gen,
    )
    if shape.kernel == "cache_write":
        tolerance = 0.0  # bit-exact, on every device (reference.quantize_per_token_head)
    else:
        quantized = shape.cache_dtype == torch.int8
        tolerance = ATTENTION_TOLERANCE if quantized else BASELINE_TOLERANCE
    error = None
    try:
        if shape.kernel == "cache_write":
            rel, quant = _cache_write_errors(batch)
        else:
            rel, quant = _attention_errors(batch, shape, prefill)
    except Exception as failure:  # a kernel that cannot compile or launch fails its case alone
        rel, quant = math.inf, math.nan
        error = f"{type(failure).__name__}: {' '.join(str(failure).split())}"[:300]
    return CaseResult(
        kernel=shape.label,
        dtype=_dtype_name(shape.cache_dtype, shape.model_dtype),
        head_size=shape.head_size,
        block_size=shape.block_size,
        gqa=shape.gqa,
        rel_l2=rel,
        tolerance=tolerance,
        quant_rel_l2=quant,
        passed=rel <= tolerance,
        error=error,
    )


def _all_slots(batch: PagedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantized K, V of every written token, in write order."""
    keys, values = [], []
    for i, n in enumerate(batch.seq_lens.tolist()):
        k, v = reference.gather_kv(batch.cache, batch.block_table[i], n)
        keys.append(k)
        values.append(v)
    return torch.cat(keys), torch.cat(values)


def _cache_write_errors(batch: PagedBatch) -> tuple[float, float]:
    """Fraction of cache bytes that differ from the reference cache, and quantization error."""
    expected = allocate_cache(
        batch.cache.num_blocks,
        batch.cache.num_kv_heads,
        batch.cache.head_size,
        batch.cache.block_size,
        batch.cache.dtype,
        batch.cache.device,
    )
    expected.pages.copy_(batch.cache.pages)  # same bytes in the pages nothing writes
    slots = _slot_mapping(batch)
    reference.cache_write_ref(expected, batch.key, batch.value, slots)
    mismatch = int((expected.pages != batch.cache.pages).sum())
    k, v = _all_slots(batch)
    quant = _rel_l2(torch.cat([k, v]), torch.cat([batch.key, batch.value]).float())
    return mismatch / batch.cache.pages.numel(), quant


def _slot_mapping(batch: PagedBatch) -> torch.Tensor:
    slots = []
    bs = batch.cache.block_size
    for i, n in enumerate(batch.seq_lens.tolist()):
        row = batch.block_table[i].long()
        positions = torch.arange(n, device=row.device)
        slots.append(row[positions // bs] * bs + positions % bs)
    return torch.cat(slots)


def _attend(batch: PagedBatch, shape: _Shape, prefill: bool, out: torch.Tensor) -> torch.Tensor:
    scale = shape.head_size**-0.5
    if prefill:
        return prefill_attention(
            batch.query,
            batch.cache,
            batch.block_table,
            batch.seq_lens,
            batch.cu_seqlens_q,
            scale,
            sliding_window=shape.sliding_window,
            softcap=shape.softcap,
            out=out,
        )
    return decode_attention(
        batch.query,
        batch.cache,
        batch.block_table,
        batch.seq_lens,
        scale,
        sliding_window=shape.sliding_window,
        softcap=shape.softcap,
        out=out,
        num_splits=shape.num_splits,
    )


def _attention_errors(batch: PagedBatch, shape: _Shape, prefill: bool) -> tuple[float, float]:
    """Kernel (fp32 output) against the reference on the dequantized cache; quantization error.

    The output is poisoned with NaN first, so an unwritten element fails the case.
    """
    out = torch.full(batch.query.shape, math.nan, dtype=torch.float32, device=batch.query.device)
    _attend(batch, shape, prefill, out)
    scale = shape.head_size**-0.5
    args = (shape.sliding_window, shape.softcap)
    expected = reference.paged_attention_ref(
        batch.query,
        batch.cache,
        batch.block_table,
        batch.seq_lens,
        batch.cu_seqlens_q,
        scale,
        *args,
    )
    unquantized = torch.zeros_like(expected)
    starts, key_starts = batch.cu_seqlens_q.tolist(), batch.cu_seqlens_k.tolist()
    for i in range(batch.seq_lens.shape[0]):
        rows = slice(starts[i], starts[i + 1])
        keys = slice(key_starts[i], key_starts[i + 1])
        unquantized[rows] = reference.attention_ref(
            batch.query[rows], batch.key[keys], batch.value[keys], scale, *args
        )
    rel = _rel_l2(out, expected) if not torch.isnan(out).any() else math.inf
    return rel, _rel_l2(expected, unquantized)


# ---- Edge cases: each returns (passed, detail) ----


def _edge_zero_head(device: torch.device, gen: torch.Generator) -> tuple[bool, str]:
    cache = allocate_cache(2, 2, 64, 16, torch.int8, device)
    key = torch.randn(3, 2, 64, generator=gen).to(torch.bfloat16).to(device)
    key[1, 0] = 0
    value = torch.zeros(3, 2, 64, dtype=torch.bfloat16, device=device)
    cache_write(cache, key, value, torch.tensor([0, 1, 2], device=device))
    assert cache.k_scale is not None and cache.v_scale is not None
    floor_ok = bool(cache.k_scale[0, 0, 1] == torch.tensor(1e-6, dtype=torch.float32))
    codes_ok = bool((cache.k[0, 0, 1] == 0).all()) and bool((cache.v[0, :, :, :3] == 0).all())
    out = decode_attention(
        torch.randn(1, 2, 64, generator=gen).to(torch.bfloat16).to(device),
        cache,
        torch.tensor([[0]], dtype=torch.int32, device=device),
        torch.tensor([3], dtype=torch.int32, device=device),
        0.125,
    )
    zeros_ok = bool((out == 0).all())
    detail = f"floor scale {floor_ok}, zero codes {codes_ok}, exact zero output {zeros_ok}"
    return floor_ok and codes_ok and zeros_ok, detail


def _edge_huge_values(device: torch.device, gen: torch.Generator) -> tuple[bool, str]:
    results = []
    for dtype, big in ((torch.float16, 65504.0), (torch.bfloat16, 1.0e30)):
        cache = allocate_cache(1, 1, 128, 16, torch.int8, device)
        x = (torch.rand(4, 1, 128, generator=gen) * 2 - 1) * big
        x[:, :, 0] = big
        x = x.to(dtype).to(device)
        cache_write(cache, x, -x, torch.arange(4, device=device))
        k, v = reference.gather_kv(cache, torch.tensor([0], device=device), 4)
        assert cache.k_scale is not None
        within = bool(((k - x.float()).abs() <= cache.k_scale[0, :, :4].T[..., None] / 2).all())
        finite = bool(torch.isfinite(k).all() and torch.isfinite(v).all())
        out = decode_attention(
            x[:1].repeat(1, 4, 1) / big,
            cache,
            torch.tensor([[0]], dtype=torch.int32, device=device),
            torch.tensor([4], dtype=torch.int32, device=device),
            0.1,
        )
        results.append(within and finite and bool(torch.isfinite(out).all()))
    return all(results), f"fp16 65504 ok {results[0]}, bf16 1e30 ok {results[1]}"


def _edge_nan_inf_isolation(device: torch.device, gen: torch.Generator) -> tuple[bool, str]:
    def build() -> PagedBatch:
        return make_paged_batch(
            seq_lens=[40, 17],
            num_kv_heads=2,
            group=2,
            head_size=64,
            block_size=16,
            cache_dtype=torch.int8,
            model_dtype=torch.bfloat16,
            device=device,
            generator=torch.Generator().manual_seed(7),
        )

    clean, dirty = build(), build()
    key, value = dirty.key.clone(), dirty.value.clone()
    key[5, 1, 3] = math.nan  # sequence 0, token 5, kv head 1
    value[30, 1, 0] = math.inf  # sequence 0, token 30, kv head 1
    cache_write(dirty.cache, key, value, _slot_mapping(dirty))
    cache_ok = bool((dirty.cache.pages != clean.cache.pages).sum() > 0)
    assert dirty.cache.k_scale is not None and clean.cache.k_scale is not None
    same_elsewhere = torch.equal(dirty.cache.k[:, 0], clean.cache.k[:, 0]) and torch.equal(
        dirty.cache.v[:, 0], clean.cache.v[:, 0]
    )
    args = (dirty.block_table, dirty.seq_lens, 0.125)
    out_clean = decode_attention(clean.query, clean.cache, *args)
    out_dirty = decode_attention(dirty.query, dirty.cache, *args)
    poisoned = torch.zeros_like(out_dirty, dtype=torch.bool)
    poisoned[0, 2:4] = True  # sequence 0, the query heads of kv head 1
    nan_where_expected = bool(torch.isnan(out_dirty[poisoned]).all())
    rest_identical = torch.equal(out_dirty[~poisoned], out_clean[~poisoned])
    passed = cache_ok and same_elsewhere and nan_where_expected and rest_identical
    detail = (
        f"other heads' codes unchanged {same_elsewhere}, attending outputs NaN "
        f"{nan_where_expected}, all other outputs bit-identical {rest_identical}"
    )
    return passed, detail


def _edge_padding_slots(device: torch.device, gen: torch.Generator) -> tuple[bool, str]:
    cache = allocate_cache(2, 1, 64, 16, torch.int8, device)
    before = cache.pages.clone()
    x = torch.randn(3, 1, 64, generator=gen).to(torch.float16).to(device)
    cache_write(cache, x, x, torch.tensor([-1, 5, -1], device=device))
    changed = (cache.pages != before).nonzero()[:, 1]
    ok = bool((cache.pages[1] == before[1]).all()) and changed.numel() > 0
    return ok, "only slot 5 written; padding tokens (slot -1) skipped"


def _edge_empty_batch(device: torch.device, gen: torch.Generator) -> tuple[bool, str]:
    del gen
    cache = allocate_cache(1, 1, 64, 16, torch.int8, device)
    empty = torch.zeros(0, 1, 64, dtype=torch.bfloat16, device=device)
    cache_write(cache, empty, empty, torch.zeros(0, dtype=torch.int64, device=device))
    no_seqs = torch.zeros(0, dtype=torch.int32, device=device)
    table = torch.zeros(0, 1, dtype=torch.int32, device=device)
    decoded = decode_attention(empty, cache, table, no_seqs, 0.125)
    prefilled = prefill_attention(
        empty, cache, table, no_seqs, torch.zeros(1, dtype=torch.int32, device=device), 0.125
    )
    ok = decoded.shape == (0, 1, 64) and prefilled.shape == (0, 1, 64)
    return ok, "0 tokens written, 0 sequences decoded and prefilled"


def _edge_upstream_round_trip(device: torch.device, gen: torch.Generator) -> tuple[bool, str]:
    records = torch.randint(-128, 128, (3, 16, 2, 2 * 96 + 8), generator=gen, dtype=torch.int8)
    records = records.to(device)
    back = to_upstream_layout(from_upstream_layout(records))
    batch = make_paged_batch(
        seq_lens=[20],
        num_kv_heads=2,
        group=1,
        head_size=96,
        block_size=16,
        cache_dtype=torch.int8,
        model_dtype=torch.bfloat16,
        device=device,
        generator=gen,
    )
    again = from_upstream_layout(to_upstream_layout(batch.cache))
    ok = torch.equal(back, records) and torch.equal(again.pages, batch.cache.pages)
    return ok, "records -> ours -> records and ours -> records -> ours are bit-exact"


def _edge_rounding_ties(device: torch.device, gen: torch.Generator) -> tuple[bool, str]:
    del gen
    cache = allocate_cache(1, 1, 64, 16, torch.int8, device)
    x = torch.zeros(1, 1, 64)
    x[0, 0, :6] = torch.tensor([127.0, 2.5, -2.5, 0.5, -0.5, 1.5])  # scale is exactly 1
    x = x.to(torch.bfloat16).to(device)
    cache_write(cache, x, x, torch.tensor([0], device=device))
    got = cache.k[0, 0, 0, :6].tolist()
    return got == [127, 3, -3, 1, -1, 2], f"codes {got}, expected [127, 3, -3, 1, -1, 2]"


def _edge_bad_input(device: torch.device, gen: torch.Generator) -> tuple[bool, str]:
    batch = make_paged_batch(
        seq_lens=[20],
        num_kv_heads=1,
        group=1,
        head_size=64,
        block_size=16,
        cache_dtype=torch.int8,
        model_dtype=torch.bfloat16,
        device=device,
        generator=gen,
    )
    past = batch.block_table.clone()
    past[0, 0] = batch.cache.num_blocks
    x = torch.zeros(1, 1, 64, dtype=torch.bfloat16, device=device)
    calls: dict[str, Callable[[], object]] = {
        "slot_mapping": lambda: cache_write(
            batch.cache, x, x, torch.tensor([10**6], device=device)
        ),
        "key": lambda: cache_write(batch.cache, x.float(), x, torch.tensor([0], device=device)),
        "block_table": lambda: decode_attention(
            batch.query, batch.cache, past, batch.seq_lens, 0.125
        ),
        "head_size": lambda: allocate_cache(1, 1, 72, 16),
    }
    missed = []
    for argument, call in calls.items():
        try:
            call()
            missed.append(f"{argument}: accepted")
        except InvalidInputError as error:
            if f"`{argument}`" not in str(error) or "\n" in str(error):
                missed.append(f"{argument}: {error}")
    return not missed, "; ".join(missed) or f"{len(calls)} bad calls rejected with one-line errors"


_EDGE_CASES: dict[str, Callable[[torch.device, torch.Generator], tuple[bool, str]]] = {
    "zero_head_floor_scale": _edge_zero_head,
    "huge_values_no_overflow": _edge_huge_values,
    "nan_inf_isolated": _edge_nan_inf_isolation,
    "padding_slots_skipped": _edge_padding_slots,
    "empty_batch": _edge_empty_batch,
    "upstream_round_trip": _edge_upstream_round_trip,
    "round_half_away_from_zero": _edge_rounding_ties,
    "bad_input_rejected": _edge_bad_input,
}


def _resolve_device(device: str | None) -> torch.device:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = torch.device(device)
    if resolved.type == "cpu" and not interpreted():
        raise KernelUnavailableError(
            "the CPU run needs Triton's interpreter: set TRITON_INTERPRET=1 before importing "
            "kvquant (the `kvquant check` CLI does this)"
        )
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise KernelUnavailableError("`device` is cuda but torch sees no CUDA device")
    return resolved


def run_correctness(device: str | None = None, quick: bool = True) -> CorrectnessResult:
    """Run every kernel against its fp32 reference, then the edge cases.

    Args:
        device: "cuda", "cpu" (interpreter; TRITON_INTERPRET=1 must be set before kvquant is
            imported) or None for cuda when available, else cpu.
        quick: a small shape set (about a minute on 2 CPU cores); False runs the full matrix of
            head sizes, block sizes, GQA ratios and dtypes.
    """
    resolved = _resolve_device(device)
    gen = torch.Generator().manual_seed(_SEED)
    cases = [_run_case(shape, resolved, quick, gen) for shape in _shapes(quick)]
    edges = []
    for name, check in _EDGE_CASES.items():
        try:
            passed, detail = check(resolved, gen)
        except Exception as error:
            passed, detail = False, f"{type(error).__name__}: {error}"
        edges.append(EdgeResult(name, passed, detail))
    return CorrectnessResult(
        device=str(resolved) if resolved.type == "cpu" else torch.cuda.get_device_name(resolved),
        triton=triton.__version__,
        cases=cases,
        edge_cases=edges,
    )
