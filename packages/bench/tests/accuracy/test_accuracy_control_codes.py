"""The controls' caches: codes of fewer bits written into a kvquant INT8 cache, so the INT8
kernels read them, must read back as exactly what the torch-emulated control reads back."""

from __future__ import annotations

import pytest
import torch

from kvbench.accuracy._kv_attention import (
    _BatchKernelCache,
    _coarse_read_back,
    coarse_codes,
)
from kvquant import reference

_KV_HEADS, _HEAD_SIZE, _MAX_TOKENS, _BATCH = 3, 64, 40, 2


@pytest.mark.parametrize("bits", [4, 6])
def test_control_codes_in_the_int8_cache_read_back_as_the_emulated_control(bits: int) -> None:
    generator = torch.Generator().manual_seed(bits)
    shape = (_BATCH, 24, _KV_HEADS, _HEAD_SIZE)
    key = torch.randn(shape, generator=generator).to(torch.bfloat16)
    value = (3 * torch.randn(shape, generator=generator)).to(torch.bfloat16)
    cache = _BatchKernelCache(
        torch.int8, bits, _BATCH, _KV_HEADS, _HEAD_SIZE, _MAX_TOKENS, torch.device("cpu")
    )
    cache.write(key[:, :17], value[:, :17], 0)  # a prefill, then one decode step's token
    cache.write(key[:, 17:18], value[:, 17:18], 17)
    paged = cache._cache
    codes = torch.cat([paged.k.flatten(), paged.v.flatten()])
    assert int(codes.min()) >= -(1 << (bits - 1)) and int(codes.max()) <= (1 << (bits - 1)) - 1
    assert int(codes.min()) == -(1 << (bits - 1)) or int(codes.max()) == (1 << (bits - 1)) - 1
    for b in range(_BATCH):
        emulated = _coarse_read_back(bits)(torch.int8, _KV_HEADS, _HEAD_SIZE, 18, "cpu")
        emulated.write(key[b, :18], value[b, :18], 0)
        k, v = reference.gather_kv(paged, cache._block_table[b], 18)
        assert torch.equal(k, emulated._k) and torch.equal(v, emulated._v)


def test_fewer_bits_round_more_coarsely() -> None:
    x = torch.randn(64, _KV_HEADS, _HEAD_SIZE, generator=torch.Generator().manual_seed(0))
    errors = []
    for bits in (4, 6, 8):
        codes, scale = coarse_codes(x, bits)
        errors.append(float((codes * scale[..., None] - x).pow(2).mean()))
    # Each 2 bits quarter the step, so the squared error falls ~16x.
    assert errors[0] > 8 * errors[1] > 64 * errors[2]
    # 8 bits is kvquant's INT8 itself.
    codes, scale = coarse_codes(x, 8)
    int8_codes, int8_scale = reference.quantize_per_token_head(x)
    assert torch.equal(codes, int8_codes) and torch.equal(scale, int8_scale)
