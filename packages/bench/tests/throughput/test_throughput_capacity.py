"""Computed KV capacity: whole pages in the budget, rows named as vLLM names the caches."""

from __future__ import annotations

from kvbench.throughput import load_matrix
from kvbench.throughput._capacity import computed_capacity
from kvbench.throughput._matrix import CapacitySettings
from kvbench.throughput._model import ModelShape
from kvquant.vllm_plugin import INT8_KV_CACHE_DTYPE


def test_computed_rows_count_whole_pages_and_line_up_with_the_engine_cells() -> None:
    # SmolLM2-135M's KV geometry; one GiB of pages of 32 tokens.
    shape = ModelShape(num_layers=30, num_kv_heads=3, head_size=64)
    rows = computed_capacity(shape, CapacitySettings(kv_budget_gib=1.0, seq_len=256, block_size=32))
    by_dtype = {row["kv_cache_dtype"]: row for row in rows}
    assert list(by_dtype) == ["16-bit", INT8_KV_CACHE_DTYPE]
    # A 16-bit page per layer: 32 tokens * 3 heads * 64 * 2 bytes, for K and V: 24576 bytes;
    # 2**30 // (30 * 24576) = 1456 pages. INT8 stores 64 codes and one fp32 scale per vector:
    # 32 * 3 * (64 + 4) * 2 = 13056 bytes; 2**30 // (30 * 13056) = 2741 pages.
    assert by_dtype["16-bit"]["max_tokens"] == 1456 * 32
    assert by_dtype[INT8_KV_CACHE_DTYPE]["max_tokens"] == 2741 * 32
    assert by_dtype[INT8_KV_CACHE_DTYPE]["max_seqs"] == 2741 // 8
    # The nightly matrix's INT8 cells name the same dtype, so its engine rows pair with these.
    assert INT8_KV_CACHE_DTYPE in {cell.kv_cache_dtype for cell in load_matrix().cells}
