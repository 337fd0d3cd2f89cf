"""The prefill's launches: a batch's layout, made on the host once, and the launches that read it.

`plan_prefill_step` lays out one batch of prefill sequences (an engine step's) from host copies
of its query offsets and sequence lengths: which query tiles each program takes, and for an INT8
cache which keys its fp16 workspace holds. The layout goes to the device in one copy from pinned
memory; the resulting `PrefillStepPlan` then serves every layer of the step with launches alone
(`PrefillStepPlan.run`: the workspace's fill and the prefill, through the compiled kernels'
direct launch): no host read of a device tensor, no allocation, no validation.

`plan_prefill` is the checked one-call form (`prefill_attention`): it reads its lengths on the
host, checks the block table, sizes a workspace for the call alone and binds the call's tensors.
Both launch the same kernels with the same arguments, so their outputs are equal bit for bit.
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..._cache import AttentionGeometry, PagedKVCache
from ..._errors import InvalidInputError
from .._common import (
    BoundLaunch,
    KernelSpec,
    check_runnable,
    check_tensor,
    page_shift,
    runtime_target,
)
from .._paged_tiles import (
    cache_arguments,
    check_attention_inputs,
    check_block_table,
    index_tensor,
    kernel_operand,
)
from .kernels import PrefillConfig, prefill_spec
from .workspace import (
    EXPAND_VARYING,
    WORKSPACE_BLOCK,
    WORKSPACE_LIMIT_BYTES,
    PrefillScratch,
    expand_launches,
    workspace_page_bytes,
)

# What the prefill takes per layer: the query, the output and the layer's scalars; and the
# cache's pages (`EXPAND_VARYING`) where it reads them itself (a 16-bit cache, or INT8 fused).
_QUERY_VARYING = (
    "out_ptr",
    "q_ptr",
    "softmax_scale",
    "softcap",
    "stride_q_t",
    "stride_q_h",
    "stride_o_t",
    "stride_o_h",
)


@dataclass(frozen=True)
class PrefillLayout:
    """Where a batch of prefill sequences' work lies, on the host: plain lists, since a step's
    batch is small and each torch operation on a tiny CPU tensor costs microseconds.

    Attributes:
        cu_seqlens: ``num_seqs + 1`` query offsets from 0.
        tile_seq, tile_start: each program's sequence and first query token (``block_q`` apart).
        page_seq, page_tile: each workspace page's sequence and which WORKSPACE_BLOCK keys of it
            the page holds (empty without a workspace).
        page_table: the rows ``[num_seqs, table_width]``, flat: the workspace pages of each
            sequence (0 where none).
    """

    cu_seqlens: list[int]
    tile_seq: list[int]
    tile_start: list[int]
    page_seq: list[int]
    page_tile: list[int]
    page_table: list[int]
    table_width: int


def lay_out_tiles(q_lens: list[int], block_q: int) -> tuple[list[int], list[int]]:
    """(tile_seq, tile_start): each prefill program's sequence and first query token, for
    sequences of ``q_lens`` query tokens and ``block_q`` query tokens a program."""
    tile_seq: list[int] = []
    tile_start: list[int] = []
    for seq, q_len in enumerate(q_lens):
        starts = range(0, q_len, block_q)
        tile_seq += [seq] * len(starts)
        tile_start += starts
    return tile_seq, tile_start


def lay_out_pages(
    q_lens: list[int], seq_lens: list[int], sliding_window: int | None
) -> tuple[list[int], list[int], list[int], int]:
    """(page_seq, page_tile, page_table, table_width): the workspace pages of the keys each
    sequence's queries see (``[first, seq_len)``, the window's first key on; whole
    WORKSPACE_BLOCK-key pages), for sequences of ``q_lens`` query tokens and ``seq_lens`` keys."""
    spans = []
    for q_len, seq_len in zip(q_lens, seq_lens, strict=True):
        if not q_len:
            spans.append(range(0))
            continue
        first = max(seq_len - q_len - sliding_window + 1, 0) if sliding_window else 0
        spans.append(range(first // WORKSPACE_BLOCK, -(-seq_len // WORKSPACE_BLOCK)))
    width = max((span.stop for span in spans), default=0) or 1
    page_seq: list[int] = []
    page_tile: list[int] = []
    table = [0] * (len(spans) * width)
    for seq, span in enumerate(spans):
        first_index = len(page_seq)
        page_seq += [seq] * len(span)
        page_tile += span
        row = seq * width
        table[row + span.start : row + span.stop] = range(first_index, len(page_seq))
    return page_seq, page_tile, table, width


def _host_list(values: torch.Tensor | Sequence[int]) -> list[int]:
    return values.tolist() if isinstance(values, torch.Tensor) else list(values)


def _upload(layout: PrefillLayout, device: torch.device) -> dict[str, torch.Tensor]:
    """The layout's arrays on ``device`` as int32, from one copy out of pinned memory, which the
    stream queues and the host never waits for; each starts 16-byte aligned, as the kernels'
    pointers are compiled (`KernelSpec.aligned`)."""
    parts = {
        "cu_seqlens": layout.cu_seqlens,
        "tile_seq": layout.tile_seq,
        "tile_start": layout.tile_start,
        "page_seq": layout.page_seq,
        "page_tile": layout.page_tile,
        "page_table": layout.page_table,
    }
    packed = array.array("i")
    lengths = []  # each part padded to whole 16-byte runs
    for part in parts.values():
        lengths.append(-(-max(len(part), 1) // 4) * 4)
        packed.extend(part)
        packed.extend([0] * (lengths[-1] - len(part)))
    host = torch.frombuffer(packed, dtype=torch.int32)
    if device.type == "cuda":
        on_device = host.pin_memory().to(device, non_blocking=True)
    else:
        on_device = host.clone()  # the array's buffer is freed with it
    arrays = dict(zip(parts, on_device.split(lengths), strict=True))
    rows = len(layout.cu_seqlens) - 1
    arrays["page_table"] = arrays["page_table"][: rows * layout.table_width].view(
        rows, layout.table_width
    )
    return arrays


@dataclass(frozen=True)
class PrefillStepPlan:
    """One batch's prefill, laid out once, for every layer of one geometry (`plan_prefill_step`).

    ``run`` launches, for an INT8 cache read through its workspace, the bounds pass and the
    expansion of the layer's pages into the scratch and then the prefill that reads them; else
    the prefill over the layer's pages. It reads nothing on the host and allocates nothing.

    Attributes:
        expanded: an INT8 cache read through the scratch's fp16 workspace (False: fused, or a
            16-bit cache).
        num_tiles, num_pages: the prefill's programs per kv head, the workspace's pages.
    """

    geometry: AttentionGeometry
    num_tokens: int
    expanded: bool
    num_tiles: int
    num_pages: int
    _prefill: BoundLaunch
    _bounds: BoundLaunch | None
    _expand: BoundLaunch | None
    # The bounds the host zeroes before each fill, where the prefill does not (`bounds_reset`).
    _bounds_to_zero: torch.Tensor | None = None

    @property
    def spec(self) -> KernelSpec:
        """The prefill kernel this plan launches."""
        return self._prefill.spec

    def run(
        self,
        query: torch.Tensor,
        cache: PagedKVCache,
        out: torch.Tensor,
        softmax_scale: float,
        softcap: float | None = None,
        first_row: int = 0,
    ) -> torch.Tensor:
        """Attend the batch's ``num_tokens`` query rows, from row ``first_row`` of ``query``
        (``[tokens, q heads, head]``), over ``cache`` (the layer's pages, the batch's tokens
        written) into the same rows of ``out``; nothing is checked: the caller gives this
        plan's geometry."""
        if not self.num_tiles:
            return out
        self.fill(cache)
        scalars = (softmax_scale, softcap or 0.0)
        strides = (*query.stride()[:2], *out.stride()[:2])
        # Direct: the rows' addresses, no views (a torch view costs the host microseconds).
        rows_q = first_row * strides[0] * query.element_size()
        rows_o = first_row * strides[2] * out.element_size()
        pointers = (out.data_ptr() + rows_o, query.data_ptr() + rows_q)
        if self.expanded:
            if self._prefill.direct(*pointers, *scalars, *strides):
                return out
        elif self._prefill.direct(
            *pointers, *scalars, *strides, *cache.launch_pointers, *cache.launch_strides
        ):
            return out
        rows = slice(first_row, first_row + self.num_tokens)
        operands = (kernel_operand(out[rows], cache), kernel_operand(query[rows], cache))
        if self.expanded:
            self._prefill(*operands, *scalars, *strides)
        else:
            self._prefill(*operands, *scalars, *strides, *_cache_values(cache))
        return out

    def fill(self, cache: PagedKVCache) -> None:
        """Expand the layer's INT8 pages into the workspace (nothing unless ``expanded``)."""
        if self.expanded and self.num_tiles:
            assert self._bounds is not None and self._expand is not None
            if self._bounds_to_zero is not None:
                self._bounds_to_zero.zero_()
            values = (*cache.launch_pointers, *cache.launch_strides)
            for launch in (self._bounds, self._expand):
                if not launch.direct(*values):
                    launch(*_cache_values(cache))


def _cache_values(cache: PagedKVCache) -> tuple[object, ...]:
    """``cache``'s arguments in `EXPAND_VARYING`'s order (a 16-bit cache's scales are its K)."""
    by_name = cache.kernel_arguments
    return tuple(by_name[name] for name in EXPAND_VARYING)


def plan_prefill_step(
    geometry: AttentionGeometry,
    query_start_loc: torch.Tensor | Sequence[int],
    seq_lens_host: torch.Tensor | Sequence[int],
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    device: torch.device,
    sliding_window: int | None = None,
    scratch: PrefillScratch | None = None,
    out_dtype: torch.dtype | None = None,
    config: PrefillConfig | None = None,
) -> PrefillStepPlan:
    """Lay out a batch of prefill sequences once, for every layer of ``geometry``.

    Args:
        query_start_loc: host ``[num_seqs + 1]``, the sequences' query offsets from 0.
        seq_lens_host: host ``[num_seqs]``, each sequence's keys (prefix and new tokens).
        seq_lens, block_table: the same sequences on ``device`` (int32; the block table's rows
            contiguous); the kernels read them. Neither is read on the host or checked: every
            page a sequence's length reaches must lie in the cache.
        scratch: an INT8 cache's workspace; the plan reads the INT8 pages itself (fused) when
            it is None or the batch's keys need more than its capacity.
        out_dtype: the output's dtype (the model's if None; float32 for tests).
    """
    target = runtime_target(device)
    spec_arguments = geometry.spec_arguments(target)
    starts = _host_list(query_start_loc)
    q_lens = [end - begin for begin, end in itertools.pairwise(starts)]
    pages = None
    if scratch is not None and geometry.cache_dtype == torch.int8:
        pages = lay_out_pages(q_lens, _host_list(seq_lens_host), sliding_window)
        if len(pages[0]) > scratch.capacity:
            pages = None  # past the workspace: fused
    expanded = pages is not None
    if pages is None:
        pages = ([], [], [0] * len(q_lens), 1)
    spec = prefill_spec(**spec_arguments, out_dtype=out_dtype, config=config, expanded=expanded)
    block_q = int(spec.constexprs["ROWS"]) // geometry.gqa
    page_seq, page_tile, page_table, table_width = pages
    tile_seq, tile_start = lay_out_tiles(q_lens, block_q)
    layout = PrefillLayout(
        starts, tile_seq, tile_start, page_seq, page_tile, page_table, table_width
    )
    arrays = _upload(layout, device)
    seq_lens = index_tensor(seq_lens)
    num_tiles = len(layout.tile_seq)
    # What changes from one step to the next; the rest of each launch is the template's.
    prefill_values: dict[str, object] = {
        "block_table_ptr": block_table,
        "seq_lens_ptr": seq_lens,
        "stride_bt": block_table.stride(0),
        "cu_seqlens_q_ptr": arrays["cu_seqlens"],
        "tile_seq_ptr": arrays["tile_seq"],
        "tile_start_ptr": arrays["tile_start"],
    }
    fill_values: dict[str, object] = {}
    if expanded:
        fill_values = prefill_values | {
            "page_seq_ptr": arrays["page_seq"],
            "page_tile_ptr": arrays["page_tile"],
        }
        del fill_values["cu_seqlens_q_ptr"], fill_values["tile_seq_ptr"]
        del fill_values["tile_start_ptr"]
        prefill_values |= {
            "block_table_ptr": arrays["page_table"],
            "stride_bt": arrays["page_table"].stride(0),
        }
    prefill, bounds, expand = _launch_templates(
        spec, geometry, block_q, sliding_window, scratch if expanded else None, device,
        prefill_values, fill_values,
    )  # fmt: skip
    grid = (num_tiles, geometry.num_kv_heads)
    fill_grid = (len(layout.page_seq), geometry.num_kv_heads)
    return PrefillStepPlan(
        geometry=geometry,
        num_tokens=starts[-1],
        expanded=expanded,
        num_tiles=num_tiles,
        num_pages=len(layout.page_seq),
        _prefill=prefill.rebound(grid, prefill_values),
        _bounds=None if bounds is None else bounds.rebound(fill_grid, fill_values),
        _expand=None if expand is None else expand.rebound(fill_grid, fill_values),
        _bounds_to_zero=(
            scratch.bounds
            if scratch is not None and expanded and not spec.constexprs["RESET_BOUNDS"]
            else None
        ),
    )


# The launches of a plan but for what each step binds (`plan_prefill_step`), made on the first
# step of their kernel, geometry, window and workspace: by the ids of the spec and the scratch,
# which the entry keeps alive.
_templates: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _launch_templates(
    spec: KernelSpec,
    geometry: AttentionGeometry,
    block_q: int,
    sliding_window: int | None,
    scratch: PrefillScratch | None,
    device: torch.device,
    prefill_values: dict[str, object],
    fill_values: dict[str, object],
) -> tuple[BoundLaunch, BoundLaunch | None, BoundLaunch | None]:
    """The prefill's launch and, through a workspace, the fill's two, with this step's values
    standing in for what later steps bind (the templates are only launched rebound)."""
    key = (id(spec), id(scratch), geometry, block_q, sliding_window, device)
    entry = _templates.get(key)
    if entry is not None and entry[0] is spec and entry[1] is scratch:
        launches: tuple[BoundLaunch, BoundLaunch | None, BoundLaunch | None] = entry[2]
        return launches
    fixed: dict[str, object] = prefill_values | {
        "fills_done_ptr": prefill_values["tile_seq_ptr"],  # never read but through a workspace
        "sliding_window": sliding_window or 0,
        "group": geometry.gqa,
        "block_q": block_q,
        "query_bf16": int(geometry.model_dtype == torch.bfloat16),
        "block_size": geometry.block_size,
        "block_shift": page_shift(geometry.block_size),
    }
    varying: tuple[str, ...] = _QUERY_VARYING + EXPAND_VARYING
    bounds = expand = None
    if scratch is not None:
        target = runtime_target(device)
        bounds, expand = expand_launches(
            scratch, (geometry.block_size, geometry.head_size), fill_values, target, device
        )
        # The 16-bit prefill over the workspace's pages, its scale pointers at the bounds (the
        # scale strides are the workspace's own, as a 16-bit cache's: never used).
        fixed |= cache_arguments(scratch.cache) | {
            "k_scale_ptr": scratch.bounds[0],
            "v_scale_ptr": scratch.bounds[1],
            "fills_done_ptr": scratch.fills_done,
            "block_size": WORKSPACE_BLOCK,
            "block_shift": page_shift(WORKSPACE_BLOCK),
        }
        varying = _QUERY_VARYING
    grid = (1, geometry.num_kv_heads)
    made = (BoundLaunch(spec, device, grid, fixed, varying), bounds, expand)
    _templates[key] = (spec, scratch, made)
    return made


@dataclass(frozen=True)
class PrefillPlan:
    """One checked prefill call (`plan_prefill`): ``run()`` starts its launches and does nothing
    on the host that waits for the device, so it can be captured in a CUDA graph and replayed
    over new contents of the same tensors, with the same query lengths.

    Attributes:
        step: the launches; ``step.expanded`` says whether an INT8 cache goes through a
            workspace, ``workspace`` then holds it (allocated for this call alone).
    """

    step: PrefillStepPlan
    query: torch.Tensor
    cache: PagedKVCache
    out: torch.Tensor
    softmax_scale: float
    softcap: float | None
    workspace: PrefillScratch | None = None

    def run(self) -> torch.Tensor:
        return self.step.run(self.query, self.cache, self.out, self.softmax_scale, self.softcap)


def plan_prefill(
    query: torch.Tensor,
    cache: PagedKVCache,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    softmax_scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    out: torch.Tensor | None = None,
    config: PrefillConfig | None = None,
    workspace_limit_bytes: int = WORKSPACE_LIMIT_BYTES,
) -> PrefillPlan:
    """Check a prefill's inputs (reading ``cu_seqlens_q`` and ``seq_lens`` on the host) and lay
    out its launch; arguments as `prefill_attention`'s."""
    check_attention_inputs(
        query, cache, block_table, seq_lens, softmax_scale, sliding_window, softcap, out
    )
    num_seqs = seq_lens.shape[0]
    check_tensor(
        "cu_seqlens_q",
        cu_seqlens_q,
        dtypes=(torch.int32, torch.int64),
        shape=(num_seqs + 1,),
        device=cache.device,
    )
    starts = cu_seqlens_q.tolist()
    q_lens = [end - begin for begin, end in itertools.pairwise(starts)]
    if starts[0] != 0 or starts[-1] != query.shape[0] or min(q_lens, default=0) < 0:
        raise InvalidInputError(
            f"`cu_seqlens_q` is {starts}; expected non-decreasing from 0 to {query.shape[0]}"
        )
    check_block_table(cache, block_table, seq_lens)
    lens = seq_lens.tolist()
    short = [i for i in range(num_seqs) if lens[i] < q_lens[i]]
    if short:
        i = short[0]
        raise InvalidInputError(
            f"`seq_lens[{i}]` is {lens[i]}; expected >= its {q_lens[i]} query tokens"
        )
    check_runnable("query", query)
    result = out if out is not None else torch.empty_like(query)
    geometry = AttentionGeometry.of(query, cache)
    workspace = None
    if cache.is_quantized:
        # A workspace for this call's keys alone, unless it would pass the limit.
        pages = len(lay_out_pages(q_lens, lens, sliding_window)[0])
        if (
            pages * workspace_page_bytes(cache.num_kv_heads, cache.head_size)
            <= workspace_limit_bytes
        ):
            workspace = PrefillScratch(
                num_kv_heads=cache.num_kv_heads,
                head_size=cache.head_size,
                capacity=pages,
                device=cache.device,
            )
    step = plan_prefill_step(
        geometry,
        starts,
        lens,
        seq_lens,
        block_table,
        device=cache.device,
        sliding_window=sliding_window,
        scratch=workspace,
        out_dtype=result.dtype,
        config=config,
    )
    return PrefillPlan(step, query, cache, result, softmax_scale, softcap, workspace)
