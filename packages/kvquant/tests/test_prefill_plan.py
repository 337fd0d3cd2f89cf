"""Prefill plans (`kvquant.ops.prefill.plan`): a batch's layout on the host against a plain
enumeration of it, one step plan serving several layers bit for bit as the checked call does,
the fused path past the workspace, and the direct launches against the JIT's.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from kvquant import (
    AttentionGeometry,
    PagedKVCache,
    PrefillScratch,
    cache_from_pages,
    plan_prefill_step,
    prefill_attention,
)
from kvquant._batch import PagedBatch
from kvquant.ops import _common
from kvquant.ops.prefill import kernels as prefill_kernels
from kvquant.ops.prefill import plan as prefill_plan
from kvquant.ops.prefill.plan import lay_out_pages, lay_out_tiles
from kvquant.ops.prefill.workspace import WORKSPACE_BLOCK

from attention_cases import ATTENTION_TOLERANCE, assert_close, paged_batch, reference_out


def _expected_tiles(q_lens: list[int], block_q: int) -> list[tuple[int, int]]:
    return [(i, start) for i, q in enumerate(q_lens) for start in range(0, q, block_q)]


def _expected_pages(
    q_lens: list[int], seq_lens: list[int], window: int | None
) -> tuple[list[tuple[int, int]], dict[tuple[int, int], int]]:
    """(sequence, page) of every workspace page in order, and each one's index."""
    pages = []
    for i, (q, n) in enumerate(zip(q_lens, seq_lens, strict=True)):
        if not q:
            continue
        first = max(n - q - window + 1, 0) if window else 0
        pages += [(i, p) for p in range(first // WORKSPACE_BLOCK, -(-n // WORKSPACE_BLOCK))]
    return pages, {page: index for index, page in enumerate(pages)}


@pytest.mark.parametrize("block_q", [1, 4, 16])
@pytest.mark.parametrize("window", [None, 1, 70, 300])
def test_layout_matches_a_plain_enumeration(
    block_q: int, window: int | None, gen: torch.Generator
) -> None:
    """Ragged query lengths (none, one, across a program's rows) over prefixes of whole and
    partial workspace pages: the tiles and pages the host lays out are the enumeration's."""
    for _ in range(20):
        num_seqs = int(torch.randint(1, 7, (), generator=gen))
        q_lens = torch.randint(0, 90, (num_seqs,), generator=gen)
        q_lens[torch.rand(num_seqs, generator=gen) < 0.3] = 0
        seq_lens = (q_lens + torch.randint(0, 400, (num_seqs,), generator=gen)).tolist()
        tile_seq, tile_start = lay_out_tiles(q_lens.tolist(), block_q)
        assert list(zip(tile_seq, tile_start, strict=True)) == _expected_tiles(
            q_lens.tolist(), block_q
        )
        page_seq, page_tile, table, width = lay_out_pages(q_lens.tolist(), seq_lens, window)
        pages, index = _expected_pages(q_lens.tolist(), seq_lens, window)
        assert list(zip(page_seq, page_tile, strict=True)) == pages
        assert len(table) == num_seqs * width
        assert width == max([page + 1 for _, page in pages], default=1)
        for (seq, page), at in index.items():
            assert table[seq * width + page] == at
        assert sum(1 for entry in table if entry) == len([at for at in index.values() if at])


def _layer_caches(batch: PagedBatch, count: int, gen: torch.Generator) -> list[PagedKVCache]:
    """``count`` layers' caches over the batch's block table: the batch's pages, then pages of
    random bytes (the kernels treat the codes and scales alike whatever wrote them)."""
    caches = [batch.cache]
    for _ in range(count - 1):
        pages = torch.randint(-128, 128, batch.cache.pages.shape, generator=gen, dtype=torch.int8)
        if batch.cache.is_quantized:  # scales of the order the cache write gives
            scales = torch.rand(pages.shape[0], pages.shape[1] // 4, generator=gen) * 0.05
            view = cache_from_pages(
                pages, batch.cache.num_kv_heads, batch.cache.block_size, batch.cache.head_size
            )
            assert view.k_scale is not None and view.v_scale is not None
            view.k_scale.copy_(scales[:, : view.k_scale[0].numel()].view_as(view.k_scale))
            view.v_scale.copy_(scales[:, : view.v_scale[0].numel()].view_as(view.v_scale))
        pages = pages.to(batch.cache.device)
        caches.append(
            cache_from_pages(
                pages, batch.cache.num_kv_heads, batch.cache.block_size, batch.cache.head_size
            )
        )
    return caches


def _step(batch: PagedBatch, scratch: PrefillScratch | None, **options: Any) -> Any:
    cu = batch.cu_seqlens_q.cpu()
    return plan_prefill_step(
        AttentionGeometry.of(batch.query, batch.cache),
        cu,
        batch.seq_lens.cpu(),
        batch.seq_lens,
        batch.block_table,
        device=batch.cache.device,
        scratch=scratch,
        out_dtype=torch.float32,
        **options,
    )


def _nan_like(query: torch.Tensor) -> torch.Tensor:
    return torch.full(query.shape, math.nan, dtype=torch.float32, device=query.device)


@pytest.mark.parametrize(
    ("seq_lens", "q_lens", "window"),
    [
        ([150, 40, 17], [70, 0, 5], None),  # a sequence without queries
        ([300, 64, 129, 9], [1, 64, 33, 9], 40),  # a one-token row, a window
        ([1000], [130], None),  # one long prefix and a chunk
    ],
)
@pytest.mark.parametrize("kernel_resets", [True, False])
def test_one_step_plan_serves_every_layer_as_the_checked_call_does(
    seq_lens: list[int],
    q_lens: list[int],
    window: int | None,
    kernel_resets: bool,
    device: torch.device,
    gen: torch.Generator,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """Three layers through one plan and one workspace, against `prefill_attention` per layer:
    equal bit for bit (the same kernels with the same arguments), through the workspace, whose
    bounds the prefill zeroes for the next layer (CUDA) or the host does (HIP, `bounds_reset`):
    a bound left over from another layer would change the workspace's units."""
    if not kernel_resets:
        monkeypatch.setattr(prefill_kernels, "bounds_reset", lambda target: False)
        prefill_kernels.prefill_spec.cache_clear()
        request.addfinalizer(prefill_kernels.prefill_spec.cache_clear)  # after the patch's undo
        monkeypatch.setattr(prefill_plan, "_templates", {})
    batch = paged_batch(seq_lens, device, gen, q_lens=q_lens)
    scratch = PrefillScratch(num_kv_heads=2, head_size=64, capacity=64, device=device)
    step = _step(batch, scratch, sliding_window=window)
    assert step.expanded and step.num_tokens == sum(q_lens)
    scale = 64**-0.5
    for cache in _layer_caches(batch, 3, gen):
        out = step.run(batch.query, cache, _nan_like(batch.query), scale)
        expected = prefill_attention(
            batch.query, cache, batch.block_table, batch.seq_lens, batch.cu_seqlens_q, scale,
            sliding_window=window, out=_nan_like(batch.query),
        )  # fmt: skip
        assert torch.equal(out, expected)
    assert step.spec.constexprs["RESET_BOUNDS"] is kernel_resets


def test_a_step_past_its_workspace_reads_the_int8_pages_itself(
    device: torch.device, gen: torch.Generator
) -> None:
    """A batch whose keys need more pages than the scratch holds takes the fused prefill: the
    checked call without a workspace, bit for bit, within the reference's tolerance."""
    batch = paged_batch([700, 90], device, gen, q_lens=[100, 90])
    step = _step(batch, PrefillScratch(num_kv_heads=2, head_size=64, capacity=4, device=device))
    assert not step.expanded and step.spec.name == "prefill_attention"
    scale = 64**-0.5
    out = step.run(batch.query, batch.cache, _nan_like(batch.query), scale, 20.0)
    fused = prefill_attention(
        batch.query, batch.cache, batch.block_table, batch.seq_lens, batch.cu_seqlens_q, scale,
        softcap=20.0, out=_nan_like(batch.query), workspace_limit_bytes=0,
    )  # fmt: skip
    assert torch.equal(out, fused)
    assert_close(out, reference_out(batch, softcap=20.0), ATTENTION_TOLERANCE)


class _RecordedLaunches:
    """Stands in for both launch paths of `BoundLaunch`: records (path, kernel, grid, arguments),
    tensors as their addresses, and runs nothing. ``direct``: the launchers take addresses, as
    `CompiledLaunch` does, else they are the JIT's."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, direct: bool) -> None:
        self.calls: list[tuple[str, str, tuple[int, ...], tuple[object, ...]]] = []
        record = self.calls.append

        class Launcher:
            takes_addresses = direct

            def __init__(self, spec: Any, device: torch.device) -> None:
                self.name = spec.name

            def __call__(self, grid: tuple[int, ...], *args: object) -> None:
                record(("direct", self.name, grid, args))

        def jit_launch(spec: Any, grid: tuple[int, ...], arguments: tuple[object, ...]) -> None:
            addresses = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in arguments)
            record(("jit", spec.name, grid, addresses))

        monkeypatch.setattr(_common, "kernel_launcher", Launcher)
        monkeypatch.setattr(_common, "launch", jit_launch)


@pytest.mark.parametrize("capacity", [64, 1])
def test_direct_launches_pass_what_the_named_jit_launches_pass(
    capacity: int, monkeypatch: pytest.MonkeyPatch, device: torch.device, gen: torch.Generator
) -> None:
    """A step plan's launches, direct (addresses by position) and through the JIT (tensors by
    name through `KernelSpec.arguments`): the same kernels, grids and arguments, through the
    workspace (bounds, expansion, prefill) and fused."""
    batch = paged_batch([300, 64, 9], device, gen, q_lens=[40, 64, 9])
    scratch = PrefillScratch(num_kv_heads=2, head_size=64, capacity=capacity, device=device)
    out = _nan_like(batch.query)

    with monkeypatch.context() as patch:
        recorded = _RecordedLaunches(patch, direct=True)
        step = _step(batch, scratch, sliding_window=100)
        step.run(batch.query, batch.cache, out, 0.1, 30.0)
        direct = recorded.calls.copy()
        # The same plan through the JIT path: what each launch names, by name.
        for bound in (step._prefill, step._bounds, step._expand):
            if bound is not None:
                bound._direct_args = None
        recorded.calls.clear()
        step.run(batch.query, batch.cache, out, 0.1, 30.0)
        jit = recorded.calls

    names = ["prefill_bounds", "prefill_expand", "prefill_attention_expanded"]
    if capacity == 1:
        names = ["prefill_attention"]
    assert [(path, name) for path, name, _, _ in direct] == [("direct", name) for name in names]
    assert [call[1:] for call in direct] == [call[1:] for call in jit]
