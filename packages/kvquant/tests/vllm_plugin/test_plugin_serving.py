"""The plugin's vLLM-free parts: page views, cache write, attention, refusals, version table.

These need no vLLM and run in every CPU test session.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from kvquant import PagedKVCache, allocate_cache, page_bytes
from kvquant._cache import SUPPORTED_HEAD_SIZES
from kvquant.reference import cache_write_ref, paged_attention_ref
from kvquant.vllm_plugin import (
    SUPPORTED_VLLM_VERSIONS,
    UnsupportedConfigError,
    UnsupportedVLLMError,
    VLLMPluginError,
    hook_module_for,
)
from kvquant.vllm_plugin._serving import (
    attend,
    cache_view,
    check_attention_layer,
    check_block_size,
    check_model,
    int8_content_bytes,
    write,
)

HEADS, KV_HEADS, HEAD, BLOCK = 8, 2, 64, 32


def _engine_tensor(num_blocks: int, head_size: int = HEAD) -> torch.Tensor:
    """What vLLM 0.32 binds to a layer for int8_per_token_head: int8 [blocks, H, N, C bytes]."""
    return torch.zeros(num_blocks, KV_HEADS, BLOCK, int8_content_bytes(head_size), dtype=torch.int8)


def _one_line_refusal(error: pytest.ExceptionInfo[VLLMPluginError]) -> str:
    message = str(error.value)
    assert message.startswith("kvquant: ")
    assert "\n" not in message
    return message


def test_int8_record_is_upstreams_264_bytes_at_head_128() -> None:
    assert int8_content_bytes(128) == 264
    assert int8_content_bytes(64) * KV_HEADS * BLOCK == page_bytes(KV_HEADS, BLOCK, 64, torch.int8)


def test_write_through_engine_view_matches_kvquant_reference_bit_for_bit(
    gen: torch.Generator,
) -> None:
    engine = _engine_tensor(6)
    cache = cache_view(engine, HEAD)
    assert cache.pages.data_ptr() == engine.data_ptr()  # a view: the engine's bytes, no copy
    key = torch.randn(40, KV_HEADS, HEAD, generator=gen) * 3
    value = torch.randn(40, KV_HEADS, HEAD, generator=gen)
    slots = torch.randperm(6 * BLOCK, generator=gen)[:40]
    slots[5] = -1  # a padding token: never written
    write(cache, key, value, slots)
    expected = allocate_cache(6, KV_HEADS, HEAD, BLOCK, torch.int8)
    cache_write_ref(expected, key, value, slots)
    assert torch.equal(engine.view(6, -1), expected.pages)


def test_write_ignores_padded_rows_past_the_slot_mapping(gen: torch.Generator) -> None:
    engine = _engine_tensor(2)
    key = torch.randn(8, KV_HEADS, HEAD, generator=gen)
    slots = torch.arange(5)
    write(cache_view(engine, HEAD), key, key, slots)
    expected = allocate_cache(2, KV_HEADS, HEAD, BLOCK, torch.int8)
    cache_write_ref(expected, key[:5], key[:5], slots)
    assert torch.equal(engine.view(2, -1), expected.pages)


def _filled_cache(
    gen: torch.Generator, seq_lens: list[int]
) -> tuple[PagedKVCache, torch.Tensor, torch.Tensor]:
    blocks_per_seq = 4
    num_blocks = len(seq_lens) * blocks_per_seq + 2
    cache = cache_view(_engine_tensor(num_blocks), HEAD)
    block_table = torch.randperm(num_blocks, generator=gen)[: len(seq_lens) * blocks_per_seq]
    block_table = block_table.view(len(seq_lens), blocks_per_seq).int()
    for i, n in enumerate(seq_lens):
        positions = torch.arange(n)
        slots = block_table[i].long()[positions // BLOCK] * BLOCK + positions % BLOCK
        kv = torch.randn(2, n, KV_HEADS, HEAD, generator=gen)
        write(cache, kv[0], kv[1], slots)
    return cache, block_table, torch.tensor(seq_lens)


@pytest.mark.parametrize(("window", "softcap"), [(None, None), (20, None), (None, 5.0), (7, 3.0)])
def test_attend_matches_reference_on_a_mixed_decode_and_prefill_batch(
    gen: torch.Generator, window: int | None, softcap: float | None
) -> None:
    cache, block_table, seq_lens = _filled_cache(gen, [33, 100, 1, 64, 9])
    query_lens = torch.tensor([1, 5, 1, 1, 9])
    query_start_loc = torch.cat([torch.zeros(1, dtype=torch.long), query_lens.cumsum(0)])
    query = torch.randn(int(query_start_loc[-1]), HEADS, HEAD, generator=gen)
    out = torch.full_like(query, math.nan)
    attend(query, cache, block_table, seq_lens, query_start_loc, HEAD**-0.5, out, window, softcap)
    expected = paged_attention_ref(
        query, cache, block_table, seq_lens, query_start_loc, HEAD**-0.5, window, softcap
    )
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_attend_nan_policy_poisons_only_the_sequence_that_sees_the_bad_token(
    gen: torch.Generator,
) -> None:
    cache, block_table, seq_lens = _filled_cache(gen, [40, 40, 40])
    bad_slot = int(block_table[1, 0]) * BLOCK + 3  # token 3 of sequence 1
    bad = torch.full((1, KV_HEADS, HEAD), math.nan)
    write(cache, bad, bad, torch.tensor([bad_slot]))
    # A NaN in a page slot past sequence 2's end must stay invisible to it.
    tail_slot = int(block_table[2, 1]) * BLOCK + (45 - BLOCK)
    write(cache, bad, bad, torch.tensor([tail_slot]))
    query = torch.randn(3, HEADS, HEAD, generator=gen)
    out = torch.empty_like(query)
    attend(query, cache, block_table, seq_lens, torch.arange(4), HEAD**-0.5, out)
    assert out[1].isnan().all()
    assert out[0].isfinite().all() and out[2].isfinite().all()


def test_cache_view_refuses_pages_that_are_not_kvquants() -> None:
    with pytest.raises(UnsupportedConfigError) as error:
        cache_view(torch.zeros(4, KV_HEADS, BLOCK, 2 * HEAD, dtype=torch.int8), HEAD)
    assert "136" in _one_line_refusal(error)  # the byte count kvquant expected
    with pytest.raises(UnsupportedConfigError) as error:
        cache_view(torch.zeros(4, KV_HEADS, BLOCK, 2 * HEAD, dtype=torch.float16), HEAD)
    assert "float16" in _one_line_refusal(error)
    strided = _engine_tensor(4).transpose(1, 2).contiguous().transpose(1, 2)
    with pytest.raises(UnsupportedConfigError) as error:
        cache_view(strided, HEAD)
    assert "not dense" in _one_line_refusal(error)


@pytest.mark.parametrize("head_size", SUPPORTED_HEAD_SIZES)
def test_supported_head_sizes_pass(head_size: int) -> None:
    check_attention_layer(head_size=head_size, head_size_v=head_size)


@pytest.mark.parametrize(
    ("layer", "expected"),
    [
        ({"head_size": 72}, "head size 72 is not supported"),
        ({"head_size": 32}, "64, 80, 96, 128, 256"),
        ({"head_size": 128, "head_size_v": 64}, "differs"),
        ({"head_size": 64, "use_mla": True}, "MLA"),
        ({"head_size": 64, "has_sink": True}, "sinks"),
        ({"head_size": 64, "has_alibi": True}, "ALiBi"),
        ({"head_size": 64, "is_decoder": False}, "decoder"),
        ({"head_size": 64, "use_sparse": True}, "sparse"),
    ],
)
def test_attention_layers_kvquant_cannot_serve_are_refused(
    layer: dict[str, Any], expected: str
) -> None:
    with pytest.raises(UnsupportedConfigError) as error:
        check_attention_layer(**layer)
    assert expected in _one_line_refusal(error)


def test_hybrid_and_mla_models_and_odd_blocks_are_refused() -> None:
    check_model(is_hybrid=False, use_mla=False)
    with pytest.raises(UnsupportedConfigError) as error:
        check_model(is_hybrid=True, use_mla=False)
    assert "hybrid" in _one_line_refusal(error)
    with pytest.raises(UnsupportedConfigError) as error:
        check_model(is_hybrid=False, use_mla=True)
    assert "MLA" in _one_line_refusal(error)
    check_block_size(32)
    with pytest.raises(UnsupportedConfigError) as error:
        check_block_size(128)
    assert "16, 32, 64" in _one_line_refusal(error)


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu"])
def test_supported_vllm_versions_have_a_hook_module(version: str) -> None:
    assert hook_module_for(version) == "._hooks_v0_32"


@pytest.mark.parametrize("version", ["0.18.0", "0.33.0", "0.32.1", "0.32.0rc1", "dev"])
def test_other_vllm_versions_are_refused_naming_the_supported_ones(version: str) -> None:
    with pytest.raises(UnsupportedVLLMError) as error:
        hook_module_for(version)
    message = _one_line_refusal(error)
    assert f"vLLM {version} is not supported" in message
    assert all(supported in message for supported in SUPPORTED_VLLM_VERSIONS)
