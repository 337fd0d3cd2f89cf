"""Decode attention (`kvquant.ops.decode`) against ``kvquant.reference``: the kernel on every
geometry, the split-KV and fp16 P x V paths, and its refusals of bad input. Plans and their
launches: test_decode_plan.py.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from kvquant import (
    DecodePlan,
    InvalidInputError,
    decode_attention,
    decode_config,
)
from kvquant import reference as ref
from kvquant._batch import PagedBatch, make_paged_batch
from kvquant.ops._common import runtime_target
from kvquant.ops.decode import decode_spec

from attention_cases import (
    ATTENTION_TOLERANCE,
    BASELINE_TOLERANCE,
    assert_close,
    decode_out,
    mixed_lens,
    paged_batch,
    plan_for,
    reference_out,
    rel_l2,
)
from conftest import DEVICE, require_cuda


def plan_target() -> str:
    """The target plans on this machine's test device launch for."""
    return runtime_target(DEVICE)


# Head size x block size x GQA x dtypes, covered in a diagonal rather than a full product so the
# interpreter run stays short; the GPU test below runs the product.
_CPU_DECODE_MATRIX = [
    (64, 16, 1, torch.int8, torch.bfloat16),
    (80, 32, 4, torch.int8, torch.float16),
    (96, 64, 8, torch.int8, torch.bfloat16),
    (128, 16, 8, torch.int8, torch.float16),
    (256, 32, 1, torch.int8, torch.bfloat16),
    (128, 64, 4, torch.bfloat16, torch.bfloat16),
    (80, 16, 8, torch.float16, torch.float16),
    # 16 query heads per kv head: twice the decode's 8 columns on CUDA, two warps.
    (128, 16, 16, torch.int8, torch.bfloat16),
]


@pytest.mark.parametrize(
    ("head_size", "block_size", "group", "cache_dtype", "model_dtype"), _CPU_DECODE_MATRIX
)
def test_decode_matches_reference(
    head_size: int,
    block_size: int,
    group: int,
    cache_dtype: torch.dtype,
    model_dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
) -> None:
    batch = paged_batch(
        mixed_lens(block_size, 300),
        device,
        gen,
        head_size=head_size,
        block_size=block_size,
        group=group,
        cache_dtype=cache_dtype,
        model_dtype=model_dtype,
    )
    tolerance = ATTENTION_TOLERANCE if cache_dtype == torch.int8 else BASELINE_TOLERANCE
    assert_close(decode_out(batch), reference_out(batch), tolerance)


# (32, 1600): the longest sequence's 25 tiles each get a split, more than the reducer combines
# per step.
@pytest.mark.parametrize(("num_splits", "longest"), [(1, 129), (2, 129), (3, 129), (32, 1600)])
def test_decode_split_kv_matches_reference(
    num_splits: int, longest: int, device: torch.device, gen: torch.Generator
) -> None:
    batch = paged_batch([1, 200, 383, longest], device, gen)
    assert_close(
        decode_out(batch, num_splits=num_splits), reference_out(batch), ATTENTION_TOLERANCE
    )


@pytest.mark.parametrize(("window", "softcap"), [(1, None), (50, None), (None, 5.0), (140, 30.0)])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_decode_window_and_softcap(
    window: int | None,
    softcap: float | None,
    num_splits: int,
    device: torch.device,
    gen: torch.Generator,
) -> None:
    batch = paged_batch([1, 15, 17, 300], device, gen, group=2)
    out = decode_out(batch, sliding_window=window, softcap=softcap, num_splits=num_splits)
    assert_close(out, reference_out(batch, window, softcap), ATTENTION_TOLERANCE)


@pytest.mark.parametrize(("head_size", "group"), [(256, 1), (128, 16)])
def test_decode_one_split_in_two_warp_layouts(
    head_size: int, group: int, device: torch.device, gen: torch.Generator
) -> None:
    """One split, whose decode writes the result itself, where a CUDA program takes two warps."""
    batch = paged_batch([1, 17, 300], device, gen, head_size=head_size, group=group)
    assert_close(decode_out(batch, num_splits=1), reference_out(batch), ATTENTION_TOLERANCE)


@pytest.mark.parametrize(
    ("cache_dtype", "model_dtype"),
    [(torch.int8, torch.bfloat16), (torch.int8, torch.float16), (torch.bfloat16, torch.bfloat16)],
)
@pytest.mark.parametrize("num_splits", [1, 2])
def test_decode_16_bit_output(
    cache_dtype: torch.dtype,
    model_dtype: torch.dtype,
    num_splits: int,
    device: torch.device,
    gen: torch.Generator,
) -> None:
    """Output in the model dtype, written by the decode itself (one split) or by the reducer:
    the rounding to bf16 adds its ~2e-3 (4e-3 truncating)."""
    batch = paged_batch([5, 70], device, gen, cache_dtype=cache_dtype, model_dtype=model_dtype)
    out = decode_out(batch, out_dtype=model_dtype, num_splits=num_splits)
    assert_close(out, reference_out(batch), 1e-2)


def _wide_batch(
    seq_lens: list[int],
    device: torch.device,
    gen: torch.Generator,
    *,
    group: int,
    num_kv_heads: int,
    head_size: int = 128,
    block_size: int = 16,
    model_dtype: torch.dtype = torch.bfloat16,
) -> PagedBatch:
    return make_paged_batch(
        seq_lens=seq_lens, num_kv_heads=num_kv_heads, group=group, head_size=head_size,
        block_size=block_size, cache_dtype=torch.int8, model_dtype=model_dtype, device=device,
        generator=gen,
    )  # fmt: skip


def _run_plan(
    batch: PagedBatch, max_seq_len: int, softcap: float | None = None, **plan_options: Any
) -> tuple[DecodePlan, torch.Tensor]:
    """A plan's decode of ``batch`` (fp32 output, poisoned with NaN first) and the plan."""
    plan = plan_for(batch, max_seq_len, out_dtype=torch.float32, **plan_options)
    out = torch.full(batch.query.shape, math.nan, device=batch.query.device)
    scale = batch.query.shape[-1] ** -0.5
    seq_lens = batch.seq_lens.to(torch.int32)
    plan.run(batch.query, batch.cache, batch.block_table, seq_lens, scale, softcap=softcap, out=out)
    return plan, out


# GQA 16 and 32 on one and two kv heads (MQA 32/1 included), ragged lengths, one split and
# several, head and block sizes; 24 pads to 32 columns and head 96 to 128; 64 query heads per
# kv head are two programs of 32.
@pytest.mark.parametrize(
    ("group", "num_kv_heads", "head_size", "block_size", "model_dtype", "num_splits"),
    [
        (32, 1, 128, 16, torch.bfloat16, None),
        (16, 1, 128, 32, torch.float16, 1),
        (16, 2, 64, 16, torch.bfloat16, 3),
        (32, 2, 64, 32, torch.bfloat16, 1),
        (24, 1, 96, 16, torch.float16, None),
        (64, 1, 64, 16, torch.bfloat16, 2),
    ],
)
def test_fp16_pv_decode_matches_reference(
    group: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    model_dtype: torch.dtype,
    num_splits: int | None,
    device: torch.device,
    gen: torch.Generator,
) -> None:
    batch = _wide_batch(
        mixed_lens(block_size, 300), device, gen, group=group, num_kv_heads=num_kv_heads,
        head_size=head_size, block_size=block_size, model_dtype=model_dtype,
    )  # fmt: skip
    plan, out = _run_plan(batch, 300, num_splits=num_splits)
    assert plan.fp16_pv and (num_splits is None or plan.num_splits == num_splits)
    assert plan._decode_grid[1] == num_kv_heads * -(-group // 32)
    assert_close(out, reference_out(batch), ATTENTION_TOLERANCE)


@pytest.mark.parametrize(("window", "softcap"), [(1, None), (50, None), (None, 5.0), (140, 30.0)])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_fp16_pv_decode_window_and_softcap(
    window: int | None,
    softcap: float | None,
    num_splits: int,
    device: torch.device,
    gen: torch.Generator,
) -> None:
    batch = _wide_batch([1, 15, 17, 300], device, gen, group=16, num_kv_heads=2, head_size=64)
    plan, out = _run_plan(batch, 300, softcap=softcap, sliding_window=window, num_splits=num_splits)
    assert plan.fp16_pv
    assert_close(out, reference_out(batch, window, softcap), ATTENTION_TOLERANCE)


def test_fp16_pv_decode_rescales_when_later_keys_dominate(
    device: torch.device, gen: torch.Generator
) -> None:
    """The running max and the V reference move only when a tile passes them: here keys 100 to
    139 carry 1000x larger V scales, and keys from 200 on score 30x higher (far past the
    headroom), so the accumulator is rescaled mid-split once for each; without either, P
    would pass fp16's range. One split over all the keys, and several."""
    batch = _wide_batch([300, 260], device, gen, group=32, num_kv_heads=1)
    assert batch.cache.k_scale is not None and batch.cache.v_scale is not None
    for seq, length in enumerate((300, 260)):
        for position in (*range(100, 140), *range(200, length)):
            page, slot = int(batch.block_table[seq, position // 16]), position % 16
            if position < 200:
                batch.cache.v_scale[page, 0, slot] *= 1000.0
            else:
                batch.cache.k_scale[page, 0, slot] *= 30.0
    expected = reference_out(batch)
    for num_splits in (1, 3):
        plan, out = _run_plan(batch, 300, num_splits=num_splits)
        assert plan.fp16_pv
        assert_close(out, expected, ATTENTION_TOLERANCE)


def test_fp16_pv_decode_nan_reaches_only_the_query_heads_that_see_it(
    device: torch.device, gen: torch.Generator
) -> None:
    """A NaN V scale of one token of kv head 1 (sequence 0), a NaN query row and an inf one
    (sequence 1): NaN exactly in kv head 1's query heads of sequence 0 and in those rows; every
    other output the bits of the clean decode."""
    seed = int(torch.randint(0, 2**31 - 1, (), generator=gen))
    clean, dirty = (
        _wide_batch([300, 200], device, torch.Generator().manual_seed(seed), group=16,
                    num_kv_heads=2)
        for _ in range(2)
    )  # fmt: skip
    assert dirty.cache.v_scale is not None
    dirty.cache.v_scale[int(dirty.block_table[0, 150 // 16]), 1, 150 % 16] = math.nan
    dirty.query[1, 5, 7] = math.nan
    dirty.query[1, 9, 3] = math.inf
    got, want = _run_plan(dirty, 300, num_splits=2)[1], _run_plan(clean, 300, num_splits=2)[1]
    poisoned = torch.zeros(got.shape[:2], dtype=torch.bool, device=got.device)
    poisoned[0, 16:32] = True
    poisoned[1, 5] = True
    poisoned[1, 9] = True
    assert got[poisoned].isnan().all()
    assert torch.equal(got[~poisoned], want[~poisoned])


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_fp16_pv_decode_query_rows_of_zeros_attend_evenly(
    softcap: float | None, device: torch.device, gen: torch.Generator
) -> None:
    """Query rows of zeros (one head of sequence 0, every head of sequence 1) score 0 at every
    key they see: their outputs are the mean of those V rows, as the reference's, not NaN (the
    row scale is 0, and no 0 x -inf may reach a key that is not valid)."""
    batch = _wide_batch([300, 37], device, gen, group=32, num_kv_heads=1)
    batch.query[0, 3] = 0.0
    batch.query[1] = 0.0
    for num_splits in (1, 3):
        plan, out = _run_plan(batch, 300, softcap=softcap, num_splits=num_splits)
        assert plan.fp16_pv and not out.isnan().any()
        assert_close(out, reference_out(batch, None, softcap), ATTENTION_TOLERANCE)


def test_int8_groups_of_16_and_more_take_the_fp16_pv_decode() -> None:
    """The launch's choice by target and GQA ratio, and a forced choice it cannot serve refused
    in one line (the fp16 P x V decode widens codes in PTX, and needs an INT8 cache)."""
    geometry: dict[str, Any] = {"head_size": 128, "block_size": 16, "model_dtype": torch.bfloat16}

    def chosen(gqa: int, target: str, cache_dtype: torch.dtype = torch.int8) -> tuple[bool, int]:
        spec = decode_spec(**geometry, gqa=gqa, cache_dtype=cache_dtype, target=target)
        return bool(spec.constexprs["USE_FP16_PV"]), int(spec.constexprs["GROUP_PAD"])

    for target in ("cuda", "interpreter"):
        assert [chosen(g, target) for g in (4, 8, 9, 16, 32, 64)] == [
            (False, 8), (False, 8), (True, 16), (True, 16), (True, 32), (True, 32)
        ]  # fmt: skip
    assert [chosen(g, "hip") for g in (16, 32)] == [(False, 16), (False, 32)]
    assert chosen(32, "cuda", torch.bfloat16) == (False, 32)
    forced_config = decode_config(
        head_size=128, block_size=16, gqa=4, cache_dtype=torch.int8, target="cuda", fp16_pv=True
    )
    forced = decode_spec(
        **geometry, gqa=4, cache_dtype=torch.int8, target="cuda", config=forced_config
    )
    assert (forced.constexprs["USE_FP16_PV"], forced.constexprs["GROUP_PAD"]) == (True, 8)
    for target, cache_dtype in (("hip", torch.int8), ("cuda", torch.bfloat16)):
        with pytest.raises(InvalidInputError, match=r"^`fp16_pv`[^\n]*$"):
            decode_config(
                head_size=128, block_size=16, gqa=32, cache_dtype=cache_dtype, target=target,
                fp16_pv=True,
            )  # fmt: skip


def test_quantization_error_is_small(device: torch.device, gen: torch.Generator) -> None:
    """The INT8 cache's own error against unquantized K/V: ~7e-3 on N(0, 1) data."""
    batch = paged_batch([64, 300], device, gen, head_size=128)
    unquantized = torch.cat(
        [
            ref.attention_ref(batch.query[i : i + 1], batch.key[a:b], batch.value[a:b], 128**-0.5)
            for i, (a, b) in enumerate(
                zip(batch.cu_seqlens_k[:-1].tolist(), batch.cu_seqlens_k[1:].tolist(), strict=True)
            )
        ]
    )
    assert rel_l2(decode_out(batch), unquantized) < 2e-2


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ("table_past_cache", "block_table"),
        ("table_too_short", "seq_lens"),
        ("query_heads", "query"),
        ("query_dtype", "query"),
        ("table_int64", "block_table"),
        ("zero_len", "seq_lens"),
        ("window", "sliding_window"),
    ],
)
def test_decode_bad_input_is_one_line_error(
    change: str, argument: str, device: torch.device, gen: torch.Generator
) -> None:
    batch = paged_batch([20, 33], device, gen)
    query, table, lens = batch.query, batch.block_table.clone(), batch.seq_lens.clone()
    window = None
    if change == "table_past_cache":
        table[1, 2] = batch.cache.num_blocks
    elif change == "table_too_short":
        lens[0] = 16 * table.shape[1] + 1
    elif change == "query_heads":
        query = query[:, :7]
    elif change == "query_dtype":
        query = query.float()
    elif change == "table_int64":
        table = table.long()
    elif change == "zero_len":
        lens[1] = 0
    else:
        window = 0
    with pytest.raises(InvalidInputError, match=f"^`{argument}`[^\n]*$"):
        decode_attention(query, batch.cache, table, lens, 0.1, sliding_window=window)


@pytest.mark.gpu
@require_cuda()
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
def test_16_bit_baseline_gpu(
    cache_dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> None:
    batch = paged_batch(
        [1, 15, 17, 4000],
        device,
        gen,
        head_size=128,
        cache_dtype=cache_dtype,
        model_dtype=cache_dtype,
    )
    assert_close(decode_out(batch), reference_out(batch), BASELINE_TOLERANCE)


def test_empty_decode(device: torch.device, gen: torch.Generator) -> None:
    batch = paged_batch([], device, gen)
    assert decode_out(batch).shape == (0, 8, 64)


@pytest.mark.gpu
@require_cuda()
@pytest.mark.parametrize("head_size", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("group", [1, 4, 8, 16, 32])
def test_decode_matrix_gpu(
    head_size: int, block_size: int, group: int, device: torch.device, gen: torch.Generator
) -> None:
    decode = paged_batch(
        mixed_lens(block_size, 5000),
        device,
        gen,
        head_size=head_size,
        block_size=block_size,
        group=group,
    )
    assert_close(decode_out(decode), reference_out(decode), ATTENTION_TOLERANCE)
