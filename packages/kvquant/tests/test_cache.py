"""Allocation, page size and the converters to and from upstream vLLM's record layout."""

from __future__ import annotations

import pytest
import torch

from kvquant import (
    InvalidInputError,
    allocate_cache,
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
