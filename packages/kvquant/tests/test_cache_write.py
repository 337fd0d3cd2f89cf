"""The cache-write kernel against ``kvquant.reference.cache_write_ref``: bit-exact."""

from __future__ import annotations

import math

import pytest
import torch

from kvquant import InvalidInputError, PagedKVCache, allocate_cache, cache_write
from kvquant import reference as ref

from conftest import require_cuda


def _random_cache(
    shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> PagedKVCache:
    num_blocks, heads, head_size, block_size = shape
    cache = allocate_cache(num_blocks, heads, head_size, block_size, dtype, device)
    if dtype == torch.int8:
        cache.pages.copy_(torch.randint(-128, 128, cache.pages.shape, generator=gen, dtype=dtype))
    else:
        cache.pages.copy_(torch.randn(cache.pages.shape, generator=gen).to(dtype))
    return cache


def _cpu_copy(cache: PagedKVCache) -> PagedKVCache:
    copy = allocate_cache(
        cache.num_blocks, cache.num_kv_heads, cache.head_size, cache.block_size, cache.dtype
    )
    copy.pages.copy_(cache.pages)
    return copy


def _check_write(
    head_size: int,
    block_size: int,
    cache_dtype: torch.dtype,
    model_dtype: torch.dtype,
    num_tokens: int,
    device: torch.device,
    gen: torch.Generator,
) -> None:
    heads, num_blocks = 2, 4 + num_tokens // block_size
    cache = _random_cache((num_blocks, heads, head_size, block_size), cache_dtype, device, gen)
    expected = _random_cache((num_blocks, heads, head_size, block_size), cache_dtype, device, gen)
    expected.pages.copy_(cache.pages)  # poisoned alike: untouched bytes must stay as they were
    key = torch.randn(num_tokens, heads, head_size, generator=gen).to(model_dtype).to(device)
    value = torch.randn(num_tokens, heads, head_size, generator=gen).to(model_dtype).to(device)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens].to(device)
    slots[::7] = -1  # padding tokens
    cache_write(cache, key, value, slots)
    # The reference runs on the CPU: torch on CUDA divides by a Python scalar as a multiply by its
    # reciprocal (absmax * fl(1/127)), which is not the IEEE absmax / 127 of the format and
    # differs in ~4% of scales. The kernel divides exactly (div_rn) on every device.
    expected_cpu = _cpu_copy(expected)
    ref.cache_write_ref(expected_cpu, key.cpu(), value.cpu(), slots.cpu())
    assert torch.equal(cache.pages.cpu(), expected_cpu.pages)
    if cache_dtype == torch.int8:
        # Dequantized values lie within half a scale step of the input (plus fp32 rounding of
        # x * (1 / scale), a few ulps).
        keep = slots >= 0
        blocks, offsets = slots[keep] // block_size, slots[keep] % block_size
        assert cache.k_scale is not None
        scale = cache.k_scale[blocks, :, offsets]
        dequantized = cache.k[blocks, :, offsets].float() * scale[..., None]
        bound = scale[..., None] * (0.5 + 1e-5)
        assert ((dequantized - key[keep].float()).abs() <= bound).all()


@pytest.mark.parametrize("head_size", [64, 80, 96, 128, 256])
@pytest.mark.parametrize(
    ("block_size", "cache_dtype", "model_dtype"),
    [
        (16, torch.int8, torch.bfloat16),
        (32, torch.int8, torch.float16),
        (64, torch.bfloat16, torch.bfloat16),
    ],
)
def test_write_matches_reference_exactly(
    head_size: int,
    block_size: int,
    cache_dtype: torch.dtype,
    model_dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
) -> None:
    _check_write(head_size, block_size, cache_dtype, model_dtype, 37, device, gen)


@pytest.mark.gpu
@require_cuda()
@pytest.mark.parametrize("head_size", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize(
    ("cache_dtype", "model_dtype"),
    [(torch.int8, torch.bfloat16), (torch.int8, torch.float16), (torch.float16, torch.float16)],
)
def test_write_matches_reference_exactly_gpu(
    head_size: int,
    block_size: int,
    cache_dtype: torch.dtype,
    model_dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
) -> None:
    _check_write(head_size, block_size, cache_dtype, model_dtype, 5000, device, gen)


def test_zero_vector_gets_floor_scale(device: torch.device, gen: torch.Generator) -> None:
    cache = allocate_cache(1, 2, 64, 16, torch.int8, device)
    key = torch.randn(2, 2, 64, generator=gen).to(torch.bfloat16).to(device)
    key[1, 1] = 0
    cache_write(cache, key, key, torch.tensor([0, 1], device=device))
    assert cache.k_scale is not None
    assert cache.k_scale[0, 1, 1].item() == torch.tensor(1e-6).item()
    assert (cache.k[0, 1, 1] == 0).all()


@pytest.mark.parametrize(("dtype", "big"), [(torch.float16, 65504.0), (torch.bfloat16, 3e38)])
def test_huge_values_do_not_overflow(
    dtype: torch.dtype, big: float, device: torch.device, gen: torch.Generator
) -> None:
    cache = allocate_cache(1, 1, 128, 16, torch.int8, device)
    x = ((torch.rand(4, 1, 128, generator=gen) * 2 - 1) * big).to(dtype).to(device)
    cache_write(cache, x, x, torch.arange(4, device=device))
    assert cache.k_scale is not None
    assert torch.isfinite(cache.k_scale[0, 0, :4]).all()
    dequantized = cache.k[0, 0, :4].float() * cache.k_scale[0, 0, :4, None]
    bound = cache.k_scale[0, 0, :4, None] * (0.5 + 1e-5)
    assert ((dequantized - x[:, 0].float()).abs() <= bound).all()


@pytest.mark.parametrize("poison", [math.nan, math.inf, -math.inf])
def test_non_finite_vector_is_isolated(
    poison: float, device: torch.device, gen: torch.Generator
) -> None:
    """NaN policy: the bad (token, head) gets scale NaN and zero codes; nothing else changes."""
    clean = allocate_cache(2, 2, 64, 16, torch.int8, device)
    dirty = allocate_cache(2, 2, 64, 16, torch.int8, device)
    key = torch.randn(5, 2, 64, generator=gen).to(torch.float16).to(device)
    slots = torch.arange(5, device=device)
    cache_write(clean, key, key, slots)
    key[2, 1, 7] = poison
    cache_write(dirty, key, key, slots)
    assert dirty.k_scale is not None and clean.k_scale is not None
    assert math.isnan(dirty.k_scale[0, 1, 2].item()) and (dirty.k[0, 1, 2] == 0).all()
    changed = dirty.k_scale.isnan() | (dirty.k_scale != clean.k_scale)
    assert changed.sum() == 1
    dirty.k[0, 1, 2] = clean.k[0, 1, 2]
    assert torch.equal(dirty.k, clean.k)


def test_round_half_away_from_zero(device: torch.device) -> None:
    cache = allocate_cache(1, 1, 64, 16, torch.int8, device)
    x = torch.zeros(1, 1, 64)
    x[0, 0, :7] = torch.tensor([127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -127.0])  # scale is exactly 1
    x = x.to(torch.bfloat16).to(device)
    cache_write(cache, x, x, torch.tensor([3], device=device))
    assert cache.k[0, 0, 3, :7].tolist() == [127, 3, -3, 1, -1, 2, -127]


def test_empty_batch_writes_nothing(device: torch.device) -> None:
    cache = allocate_cache(1, 1, 64, 16, torch.int8, device)
    empty = torch.zeros(0, 1, 64, dtype=torch.float16, device=device)
    cache_write(cache, empty, empty, torch.zeros(0, dtype=torch.int32, device=device))
    assert (cache.pages == 0).all()


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ("slot_too_large", "slot_mapping"),
        ("key_fp32", "key"),
        ("value_shape", "value"),
        ("slots_int16", "slot_mapping"),
        ("slots_on_meta", "slot_mapping"),
    ],
)
def test_bad_input_is_one_line_error(change: str, argument: str, device: torch.device) -> None:
    cache = allocate_cache(2, 1, 64, 16, torch.int8, device)
    key = torch.ones(3, 1, 64, dtype=torch.float16, device=device)
    value, slots = key.clone(), torch.arange(3, device=device)
    before = cache.pages.clone()
    if change == "slot_too_large":
        slots[1] = 32
    elif change == "key_fp32":
        key = key.float()
    elif change == "value_shape":
        value = torch.ones(3, 1, 80, dtype=torch.float16, device=device)
    elif change == "slots_int16":
        slots = slots.to(torch.int16)
    else:
        slots = slots.to("meta")
    with pytest.raises(InvalidInputError, match=f"^`{argument}`[^\n]*$"):
        cache_write(cache, key, value, slots)
    assert torch.equal(cache.pages, before)
