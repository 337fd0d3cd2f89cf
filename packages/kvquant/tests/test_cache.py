"""Allocation, page size and the converters to and from upstream vLLM's record layout."""

from __future__ import annotations

import pytest
import torch

from kvquant import (
    InvalidInputError,
    allocate_cache,
    cache_from_pages,
    from_upstream_layout,
    page_bytes,
    to_upstream_layout,
)


@pytest.mark.parametrize("head_size", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_int8_page_has_upstreams_bytes(head_size: int, block_size: int) -> None:
    cache = allocate_cache(2, 8, head_size, block_size, torch.int8)
    upstream_record = 2 * (head_size + 4)  # codes + fp32 scale, for K and for V
    assert cache.pages.shape[1] == block_size * 8 * upstream_record
    assert page_bytes(8, block_size, head_size, torch.int8) == block_size * 8 * upstream_record
    assert cache.k.data_ptr() % 16 == 0 and cache.v.data_ptr() % 16 == 0
    assert cache.k_scale is not None and cache.k_scale.data_ptr() % 16 == 0


def test_upstream_round_trip_is_bit_exact(gen: torch.Generator) -> None:
    # Random bytes everywhere, so scales include NaN payloads and denormals.
    records = torch.randint(-128, 128, (3, 16, 4, 2 * 128 + 8), generator=gen, dtype=torch.int8)
    ours = from_upstream_layout(records)
    assert torch.equal(to_upstream_layout(ours), records)
    assert torch.equal(from_upstream_layout(to_upstream_layout(ours)).pages, ours.pages)


def test_upstream_record_fields(gen: torch.Generator) -> None:
    records = torch.randint(-128, 128, (2, 16, 2, 2 * 64 + 8), generator=gen, dtype=torch.int8)
    ours = from_upstream_layout(records)
    assert ours.k_scale is not None and ours.v_scale is not None
    block, slot, head = 1, 5, 1
    record = records[block, slot, head]
    assert torch.equal(ours.k[block, head, slot], record[:64])
    assert torch.equal(ours.v[block, head, :, slot], record[68:132])
    assert (
        ours.k_scale[block, head, slot].view(1).view(torch.int8).tolist() == record[64:68].tolist()
    )
    assert (
        ours.v_scale[block, head, slot].view(1).view(torch.int8).tolist() == record[132:].tolist()
    )


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"head_size": 72}, "head_size"),
        ({"block_size": 8}, "block_size"),
        ({"num_blocks": 0}, "num_blocks"),
        ({"dtype": torch.float32}, "dtype"),
    ],
)
def test_allocate_rejects_bad_geometry(kwargs: dict[str, object], argument: str) -> None:
    args: dict[str, object] = {"num_blocks": 1, "num_kv_heads": 1, "head_size": 64}
    args.update(kwargs)
    with pytest.raises(InvalidInputError, match=f"`{argument}`"):
        allocate_cache(**args)  # type: ignore[arg-type]


def test_to_upstream_needs_int8() -> None:
    with pytest.raises(InvalidInputError, match="`cache`"):
        to_upstream_layout(allocate_cache(1, 1, 64, 16, torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16])
def test_cache_from_pages_views_pages_that_lie_apart(dtype: torch.dtype) -> None:
    # Three pages at a stride past their length, as an engine's tensor may hold them.
    elems = page_bytes(2, 16, 64, dtype) // dtype.itemsize
    storage = torch.zeros(3, elems + 64, dtype=dtype)
    cache = cache_from_pages(storage[:, :elems], 2, 16, 64)
    assert cache.pages.data_ptr() == storage.data_ptr()  # a view: no copy
    assert (cache.num_blocks, cache.num_kv_heads, cache.block_size, cache.head_size) == (
        3,
        2,
        16,
        64,
    )
    # Its views sit where an allocated cache's do, page by page.
    allocated = allocate_cache(3, 2, 64, 16, dtype)
    allocated.pages.view(-1).copy_(torch.arange(allocated.pages.numel()) % 100)
    storage[:, :elems] = allocated.pages
    assert torch.equal(cache.k, allocated.k) and torch.equal(cache.v, allocated.v)
    if dtype == torch.int8:
        assert cache.k_scale is not None and allocated.k_scale is not None
        assert torch.equal(cache.k_scale.view(torch.int32), allocated.k_scale.view(torch.int32))
    assert storage[:, elems:].count_nonzero() == 0  # nothing past a page is part of it


@pytest.mark.parametrize(
    ("pages", "message"),
    [
        (torch.zeros(4 * 544, dtype=torch.int8), "`pages` is torch.int8 with 1 dims"),
        (torch.zeros(2, 4 * 544, dtype=torch.float32), "`pages` is torch.float32 with 2 dims"),
        (torch.zeros(2, 4 * 544 + 1, dtype=torch.int8), "pages of 2177 elements at stride 1"),
        (torch.zeros(4 * 544, 2, dtype=torch.int8).t(), "pages of 2176 elements at stride 2"),
        (torch.zeros(0, 4 * 544, dtype=torch.int8), "`num_blocks` is 0"),
    ],
)
def test_cache_from_pages_rejects_storage_that_is_not_pages(
    pages: torch.Tensor, message: str
) -> None:
    # One kv head, block size 16, head size 64: 16 * (2 * 64 + 8) = 2176 = 4 * 544 bytes a page.
    with pytest.raises(InvalidInputError, match=message):
        cache_from_pages(pages, 1, 16, 64)
