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


@pytest.mark.parametrize(
    ("cache_dtype", "bits"), [(torch.int8, None), (torch.int8, 4), (torch.bfloat16, None)]
)
def test_the_batch_kernel_cache_attends_as_the_reference_does(
    cache_dtype: torch.dtype, bits: int | None
) -> None:
    """A prefill of 2 sequences through kvquant's prefill kernel, then a decode step through its
    decode kernel (Triton's interpreter on the CPU), each sequence against kvquant's torch
    reference over what its own pages hold."""
    from kvquant.ops._common import interpreted

    if not interpreted() and not torch.cuda.is_available():
        pytest.skip("kvquant's kernels need a GPU or Triton's interpreter")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    generator = torch.Generator().manual_seed(7)
    q_heads, scale = 9, _HEAD_SIZE**-0.5

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator).to(torch.bfloat16).to(device)

    cache = _BatchKernelCache(torch.int8, bits, _BATCH, _KV_HEADS, _HEAD_SIZE, _MAX_TOKENS, device)
    for start, n in ((0, 5), (5, 1)):
        key, value = rand(_BATCH, n, _KV_HEADS, _HEAD_SIZE), rand(_BATCH, n, _KV_HEADS, _HEAD_SIZE)
        query = rand(_BATCH, n, q_heads, _HEAD_SIZE)
        cache.write(key, value, start)
        out = cache.attend(query, start + n, scale, None, None)
        assert out.shape == query.shape
        for b in range(_BATCH):
            k, v = reference.gather_kv(cache._cache, cache._block_table[b], start + n)
            expected = reference.attention_ref(query[b], k, v, scale, None, None)
            torch.testing.assert_close(out[b].float(), expected.float(), atol=2e-2, rtol=2e-2)
