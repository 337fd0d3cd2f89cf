"""Chunked prefill (`kvquant.ops.prefill`) against ``kvquant.reference``: prefixes
of whole and partial pages, every GQA ratio, window and softcap, NaN policy, launch configs and
plans.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from kvquant import InvalidInputError, PrefillConfig, prefill_attention
from kvquant._batch import PagedBatch
from kvquant.ops.prefill import (
    PrefillPlan,
    plan_prefill,
    prefill_config,
    prefill_spec,
    workspace_page_bytes,
)

from attention_cases import (
    ATTENTION_TOLERANCE,
    BASELINE_TOLERANCE,
    assert_close,
    mixed_lens,
    paged_batch,
    prefill_out,
    reference_out,
    rel_l2,
)
from conftest import require_cuda


@pytest.mark.parametrize(
    ("head_size", "block_size", "group", "cache_dtype", "model_dtype"),
    [
        (64, 16, 1, torch.int8, torch.bfloat16),
        (128, 32, 4, torch.int8, torch.float16),
        (80, 64, 8, torch.int8, torch.bfloat16),
        # 3 does not divide the 64 query rows of a program: one row stays idle.
        (96, 16, 3, torch.bfloat16, torch.bfloat16),
    ],
)
def test_chunked_prefill_matches_reference(
    head_size: int,
    block_size: int,
    group: int,
    cache_dtype: torch.dtype,
    model_dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
) -> None:
    """Each sequence: a cached prefix plus new tokens; one sequence has no new tokens."""
    seq_lens = [1, block_size - 1, block_size + 1, 150, 40]
    q_lens = [1, block_size - 1, 2, 70, 0]
    batch = paged_batch(
        seq_lens,
        device,
        gen,
        head_size=head_size,
        block_size=block_size,
        group=group,
        cache_dtype=cache_dtype,
        model_dtype=model_dtype,
        q_lens=q_lens,
    )
    tolerance = ATTENTION_TOLERANCE if cache_dtype == torch.int8 else BASELINE_TOLERANCE
    assert_close(prefill_out(batch), reference_out(batch), tolerance)


@pytest.mark.parametrize(("window", "softcap"), [(7, None), (None, 10.0), (33, 20.0)])
def test_prefill_window_and_softcap(
    window: int | None, softcap: float | None, device: torch.device, gen: torch.Generator
) -> None:
    """The 150-key sequence's 10 queries see none of its first 64 keys through either window:
    the INT8 workspace holds no page for them."""
    batch = paged_batch([90, 150, 17], device, gen, q_lens=[90, 10, 9])
    out = prefill_out(batch, sliding_window=window, softcap=softcap)
    assert_close(out, reference_out(batch, window, softcap), ATTENTION_TOLERANCE)


def test_nan_in_one_head_poisons_only_its_readers(
    device: torch.device, gen: torch.Generator
) -> None:
    """NaN policy (prefill): only outputs that attend the bad (token, kv head) become NaN."""
    seed = int(torch.randint(0, 2**31 - 1, (), generator=gen))
    clean = paged_batch([40, 17], device, torch.Generator().manual_seed(seed), q_lens=[30, 17])
    dirty = paged_batch([40, 17], device, torch.Generator().manual_seed(seed), q_lens=[30, 17])
    # Sequence 0, token 25 (new token 15 of its chunk), kv head 1: rewrite its V with a NaN.
    block, offset = int(dirty.block_table[0, 25 // 16]), 25 % 16
    assert dirty.cache.v_scale is not None
    dirty.cache.v_scale[block, 1, offset] = math.nan
    got, want = prefill_out(dirty), prefill_out(clean)
    poisoned = torch.zeros_like(got, dtype=torch.bool)
    poisoned[15:30, 4:8] = True  # queries at positions >= 25 of sequence 0, kv head 1
    assert got[poisoned].isnan().all()
    # Programs that never load the token (other kv head, other sequence) are bit-identical.
    same_head = torch.zeros_like(poisoned)
    same_head[:30, 4:8] = True
    assert torch.equal(got[~same_head], want[~same_head])
    # The earlier queries of that kv head share its tile, where the NaN scale drops out of the
    # tile's largest V scale and so may move P's int8 grid: rounding-level changes only.
    earlier = same_head & ~poisoned
    rel = (got[earlier] - want[earlier]).norm() / want[earlier].norm()
    assert rel < 3e-4, rel


def _plan(batch: PagedBatch, **kwargs: Any) -> PrefillPlan:
    out = torch.full(batch.query.shape, math.nan, dtype=torch.float32, device=batch.query.device)
    return plan_prefill(
        batch.query, batch.cache, batch.block_table, batch.seq_lens, batch.cu_seqlens_q,
        batch.query.shape[-1] ** -0.5, out=out, **kwargs,
    )  # fmt: skip


def test_the_int8_prefill_reads_its_workspace_within_the_limit(
    device: torch.device, gen: torch.Generator
) -> None:
    """By default the INT8 prefill expands the pages its queries see into an fp16 workspace; at
    a limit below that workspace's size it reads the INT8 pages itself. Both stay within the
    tolerance, and within it of each other."""
    batch = paged_batch([150, 40, 17], device, gen, q_lens=[70, 0, 5])
    planned = _plan(batch)
    assert planned.workspace is not None
    # Sequence 0: 3 pages of 64 keys, sequence 1 (no queries): none, sequence 2: 1.
    assert planned.workspace.cache.num_blocks == 4
    assert planned.step.spec.name == "prefill_attention_expanded"
    needed = 4 * workspace_page_bytes(batch.cache.num_kv_heads, batch.cache.head_size)
    fused = _plan(batch, workspace_limit_bytes=needed - 1)
    assert fused.workspace is None and fused.step.spec.name == "prefill_attention"
    assert _plan(batch, workspace_limit_bytes=needed).workspace is not None
    expected = reference_out(batch)
    via_workspace, direct = planned.run(), fused.run()
    assert_close(via_workspace, expected, ATTENTION_TOLERANCE)
    assert_close(direct, expected, ATTENTION_TOLERANCE)
    assert rel_l2(via_workspace, direct) <= ATTENTION_TOLERANCE


def test_the_workspace_keeps_heads_of_any_scale(device: torch.device, gen: torch.Generator) -> None:
    """fp16 holds 5 exponent bits: a head whose values reach 1e5 and one whose values stay near
    1e-6 are each expanded in their own power of two and keep the tolerance; a plan run again
    finds the units of the cache's new contents."""
    batch = paged_batch([150, 17], device, gen, q_lens=[70, 9])
    plan = _plan(batch)
    assert batch.cache.k_scale is not None and batch.cache.v_scale is not None
    batch.cache.k_scale[:, 0] *= 1e5
    batch.cache.v_scale[:, 0] *= 1e5
    batch.cache.k_scale[:, 1] *= 1e-6
    batch.cache.v_scale[:, 1] *= 1e-6
    # Head 0's scores grow 1e5-fold: scale its queries down so its softmax stays as spread.
    batch.query[:, :4] *= 1e-5
    got = plan.run()
    assert_close(got, reference_out(batch), ATTENTION_TOLERANCE)
    for head in (slice(0, 4), slice(4, 8)):
        assert rel_l2(got[:, head], reference_out(batch)[:, head]) <= ATTENTION_TOLERANCE


def test_prefill_bad_cu_seqlens(device: torch.device, gen: torch.Generator) -> None:
    batch = paged_batch([20, 33], device, gen, q_lens=[3, 4])
    bad = batch.cu_seqlens_q.clone()
    bad[1] = 9
    with pytest.raises(InvalidInputError, match=r"^`cu_seqlens_q`"):
        prefill_attention(batch.query, batch.cache, batch.block_table, batch.seq_lens, bad, 0.1)
    with pytest.raises(InvalidInputError, match=r"^`seq_lens\[0\]`"):
        prefill_attention(
            batch.query,
            batch.cache,
            batch.block_table,
            batch.seq_lens * 0 + 2,
            batch.cu_seqlens_q,
            0.1,
        )


def test_empty_prefill(device: torch.device, gen: torch.Generator) -> None:
    batch = paged_batch([], device, gen)
    assert prefill_out(batch).shape == (0, 8, 64)


@pytest.mark.gpu
@require_cuda()
@pytest.mark.parametrize("head_size", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("group", [1, 4, 8, 16, 32])
def test_prefill_matrix_gpu(
    head_size: int, block_size: int, group: int, device: torch.device, gen: torch.Generator
) -> None:
    batch = paged_batch(
        [*mixed_lens(block_size, 3000), 700],
        device,
        gen,
        head_size=head_size,
        block_size=block_size,
        group=group,
        q_lens=[1, block_size - 1, 2, 300, 1],
    )
    assert_close(prefill_out(batch), reference_out(batch), ATTENTION_TOLERANCE)


# ---- Launch configs and plans ----


@pytest.mark.parametrize(
    ("field", "value"), [("rows", 48), ("tile_n", 8), ("num_warps", 3), ("num_stages", 0)]
)
def test_a_bad_launch_config_is_one_line_error(field: str, value: int) -> None:
    shipped = {"rows": 64, "tile_n": 64, "num_warps": 4, "num_stages": 2}
    with pytest.raises(InvalidInputError, match=r"^[^\n]*(`" + field + r"`|prefill config)"):
        PrefillConfig(**(shipped | {field: value}))


@pytest.mark.parametrize("cache_dtype", [torch.int8, torch.bfloat16])
def test_an_explicit_config_reaches_the_kernel_and_keeps_the_numerics(
    cache_dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> None:
    """Tiles of 16 keys and 32 rows: more tiles on the causal diagonal and the window's edge,
    and a group of 8 rows per 4 tokens; the result stays within the reference's tolerance."""
    config = PrefillConfig(rows=32, tile_n=16, num_warps=4, num_stages=1)
    spec = prefill_spec(
        head_size=64, block_size=16, gqa=8, model_dtype=torch.bfloat16,
        cache_dtype=torch.int8, target="cuda", config=config,
    )  # fmt: skip
    assert (spec.constexprs["ROWS"], spec.constexprs["TILE_N"], spec.num_stages) == (32, 16, 1)
    wide = prefill_spec(
        head_size=64, block_size=16, gqa=64, model_dtype=torch.bfloat16,
        cache_dtype=torch.int8, target="cuda", config=config,
    )  # fmt: skip
    assert wide.constexprs["ROWS"] == 64  # a program always holds its whole group
    batch = paged_batch(
        [150, 40, 17], device, gen, group=8, q_lens=[70, 40, 5], cache_dtype=cache_dtype
    )
    tolerance = ATTENTION_TOLERANCE if cache_dtype == torch.int8 else BASELINE_TOLERANCE
    out = prefill_out(batch, config=config, sliding_window=33, softcap=20.0)
    assert_close(out, reference_out(batch, 33, 20.0), tolerance)


def test_the_shipped_configs_by_target() -> None:
    """gfx90a takes smaller tiles than CUDA (2 waves per SIMD) and no pipelining; the INT8
    prefill on CUDA one stage, the 16-bit one two; head 256 takes its own shape on both."""
    assert prefill_config(128, "cuda", quantized=False) == PrefillConfig(64, 64, 4, 2)
    assert prefill_config(128, "cuda", quantized=True) == PrefillConfig(64, 64, 4, 1)
    for quantized in (False, True):
        assert prefill_config(128, "hip", quantized) == PrefillConfig(64, 32, 4, 1)
        assert prefill_config(256, "cuda", quantized).tile_n == 32
        assert prefill_config(256, "hip", quantized).tile_n == 32
        assert {prefill_config(h, "hip", quantized).num_stages for h in (64, 128, 256)} == {1}


def test_a_plan_runs_again_over_new_contents(device: torch.device, gen: torch.Generator) -> None:
    """`plan_prefill` reads the lengths once; each `run` launches over what the tensors hold
    then, as a CUDA graph replay does."""
    batch = paged_batch([150, 40], device, gen, q_lens=[70, 9])
    out = torch.full(batch.query.shape, math.nan, dtype=torch.float32, device=device)
    plan = plan_prefill(
        batch.query, batch.cache, batch.block_table, batch.seq_lens, batch.cu_seqlens_q,
        64**-0.5, out=out,
    )  # fmt: skip
    first = plan.run().clone()
    assert_close(first, reference_out(batch), ATTENTION_TOLERANCE)
    batch.query.copy_(torch.randn(batch.query.shape, generator=gen).to(batch.query))
    again = plan.run()
    assert again is out and not torch.equal(again, first)
    assert torch.equal(again, prefill_out(batch))


@pytest.mark.gpu
@require_cuda()
@pytest.mark.parametrize("cache_dtype", [torch.int8, torch.bfloat16])
def test_a_captured_prefill_replays_exactly_as_eager_gpu(
    cache_dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> None:
    """Long prefixes and chunks at the shipped tiles: a plan captured in a CUDA graph, replayed
    over a new query, gives the eager launch's bits, within the reference's tolerance."""
    batch = paged_batch(
        [2048 + 512, 700, 3000], device, gen, head_size=128, group=4, cache_dtype=cache_dtype,
        model_dtype=torch.bfloat16, q_lens=[512, 700, 33],
    )  # fmt: skip
    out = torch.full(batch.query.shape, math.nan, dtype=torch.float32, device=device)
    plan = plan_prefill(
        batch.query, batch.cache, batch.block_table, batch.seq_lens, batch.cu_seqlens_q,
        128**-0.5, out=out,
    )  # fmt: skip
    plan.run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run()
    batch.query.copy_(torch.randn(batch.query.shape, generator=gen).to(batch.query))
    graph.replay()
    torch.cuda.synchronize()
    eager = prefill_out(batch)
    assert torch.equal(out, eager)
    tolerance = ATTENTION_TOLERANCE if cache_dtype == torch.int8 else BASELINE_TOLERANCE
    assert_close(out, reference_out(batch), tolerance)


@pytest.mark.gpu
@require_cuda()
@pytest.mark.parametrize("cache_dtype", [torch.int8, torch.bfloat16])
@pytest.mark.parametrize("head_size", [64, 96, 128])
@pytest.mark.parametrize("block_size", [16, 32])
def test_launch_shapes_compute_the_same_attention_gpu(
    cache_dtype: torch.dtype,
    head_size: int,
    block_size: int,
    device: torch.device,
    gen: torch.Generator,
) -> None:
    """The shipped CUDA launch shape and its 8-warp neighbour, on long prefixes and chunks:
    each within the reference's tolerance."""
    shipped = prefill_config(head_size, "cuda", quantized=cache_dtype == torch.int8)
    configs = [shipped, PrefillConfig(64, 64, 8, 2)]
    batch = paged_batch(
        [2048 + 256, 700, 1000], device, gen, head_size=head_size, block_size=block_size,
        group=4, cache_dtype=cache_dtype, q_lens=[256, 700, 33],
    )  # fmt: skip
    tolerance = ATTENTION_TOLERANCE if cache_dtype == torch.int8 else BASELINE_TOLERANCE
    expected = reference_out(batch)
    for config in configs:
        assert_close(prefill_out(batch, config=config), expected, tolerance)
