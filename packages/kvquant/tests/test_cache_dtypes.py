"""The cache-dtype table: every name resolves, and an unknown one lists the known names."""

from __future__ import annotations

import pytest
import torch

from kvquant import page_bytes
from kvquant.cache_dtypes import (
    ACCURACY,
    CACHE_DTYPES,
    INT8_KV_CACHE_DTYPE,
    KERNELS,
    PATHS,
    UnknownCacheDTypeError,
    cache_dtype,
    cache_dtype_names,
    vllm_cache_dtype,
)


def test_every_row_names_a_torch_dtype_of_its_size() -> None:
    for row in CACHE_DTYPES:
        assert row.paths and row.paths <= set(PATHS), row
        if row.torch_dtype is not None and row.name != "int4":
            assert getattr(torch, row.torch_dtype).itemsize == row.element_bytes, row


def test_every_vllm_name_reads_back_its_row() -> None:
    for row in CACHE_DTYPES:
        for name in row.vllm:
            assert vllm_cache_dtype(name) is row
    assert vllm_cache_dtype(INT8_KV_CACHE_DTYPE).name == "int8"
    assert vllm_cache_dtype("fp8").torch_dtype == "float8_e4m3fn"


def test_an_int8_page_is_one_byte_a_value_and_a_scale_a_token() -> None:
    """The page bytes agree with the table's element size plus the fp32 scales."""
    heads, block, head = 2, 16, 64
    int8 = cache_dtype("int8", KERNELS)
    values = 2 * heads * block * head * int8.element_bytes
    assert page_bytes(heads, block, head, torch.int8) == values + 2 * heads * block * 4


def test_unknown_name_lists_the_names_the_path_knows() -> None:
    with pytest.raises(UnknownCacheDTypeError) as raised:
        cache_dtype("fp8_e5m2", ACCURACY)
    assert str(raised.value) == (
        "cache dtype 'fp8_e5m2' is not known for accuracy; "
        f"expected one of {', '.join(cache_dtype_names(ACCURACY))}"
    )
    with pytest.raises(UnknownCacheDTypeError, match="expected one of auto, "):
        vllm_cache_dtype("int7")
