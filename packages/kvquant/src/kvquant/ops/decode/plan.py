"""The decode's launches: `DecodePlan`, one launch fixed per batch size, longest context and
geometry (split count, grids, compiled kernels, scratch layout), which `plan_decode` makes and
caches. The plans compile the specs of `kernels` and `reduce`, so they sit above them; the
one-call API (`attention`) launches through a plan.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import triton

from ..._cache import AttentionGeometry, PagedKVCache
from ..._errors import InvalidInputError
from .._common import (
    CompiledLaunch,
    JitLaunch,
    KernelSpec,
    aligned,
    clear_launch_caches,
    kernel_launcher,
    launch,
    page_shift,
    resident_programs,
    runtime_target,
)
from .._paged_tiles import cache_arguments, kernel_operand, scale_tensors
from .config import DecodeConfig, decode_config
from .kernels import decode_spec
from .reduce import reduce_spec
from .splits import choose_num_splits

# Slots assumed under the interpreter (no device to ask); small, so CPU tests still split.
_INTERPRETER_SLOTS = 64


@functools.cache
def _multiprocessor_count(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


_decode_slots: dict[tuple[Any, ...], int] = {}


def _device_slots(spec: KernelSpec, device: torch.device) -> int:
    """Programs of ``spec`` the device holds at once (its kernel compiled once, per device)."""
    if device.type != "cuda":
        return _INTERPRETER_SLOTS
    key = (
        spec.name,
        tuple(sorted(spec.constexprs.items())),
        spec.num_warps,
        spec.num_stages,
        device.index,
    )
    if key not in _decode_slots:
        per_sm = resident_programs(spec, device)
        _decode_slots[key] = per_sm * _multiprocessor_count(device.index or 0)
    return _decode_slots[key]


def _head_blocks(gqa: int, columns: int) -> int:
    """Programs that share one kv head's group (the kernel derives the same from its arguments)."""
    return -(-gqa // columns)


@dataclass(frozen=True)
class DecodePlan:
    """One decode launch, fixed for a batch size, a longest context and a geometry.

    Built by `plan_decode`, which decides once what depends only on those: the split count and
    tiles per split, the grids, the compiled kernels and how they are launched, and the scratch
    the split partials need (``scratch_elements`` fp32 values, 0 for one split). ``run`` reads
    no tensor on the host and, given ``out`` and ``scratch``, allocates nothing, so a CUDA or
    HIP graph can capture it once and be replayed with new contents of the query, block table
    and seq_lens: any lengths from 1 to ``max_seq_len``, and 0 for a padding row, whose output
    is not defined. A replay computes exactly what ``run`` computes eagerly with the same plan.

    Plans are immutable and cached by `plan_decode`; the scratch is the caller's, so plans whose
    launches run in stream order (one model's layers, one step after the other) can share one
    buffer of the largest ``scratch_elements``, as vLLM's Triton backend shares its own.
    """

    num_seqs: int
    max_seq_len: int  # the longest sequence served: a multiple of the KV tile
    geometry: AttentionGeometry
    out_dtype: torch.dtype
    device: torch.device
    sliding_window: int | None
    config: DecodeConfig
    num_splits: int
    tiles_per_split: int
    scratch_elements: int
    _decode: JitLaunch | CompiledLaunch = field(repr=False)
    _reduce: JitLaunch | CompiledLaunch = field(repr=False)
    _direct: bool = field(repr=False)  # both launch compiled kernels, pointers as addresses
    # Launch constants: the grids, and the decode's arguments that the plan fixes, (name,
    # value) in the kernel's order, and their values alone for `_launch_compiled`.
    _decode_grid: tuple[int, int, int] = field(repr=False)
    _reduce_grid: tuple[int, int] = field(repr=False)
    _decode_constants: tuple[tuple[str, int], ...] = field(repr=False)
    _decode_scalars: tuple[int, ...] = field(repr=False)
    _stats_offset: int = field(repr=False)  # where the partial maxima and sums start in scratch
    _stats_padded: int = field(repr=False)

    @property
    def num_q_heads(self) -> int:
        return self.geometry.num_q_heads

    @property
    def head_size(self) -> int:
        return self.geometry.head_size

    @property
    def model_dtype(self) -> torch.dtype:
        return self.geometry.model_dtype

    @property
    def fp16_pv(self) -> bool:
        """Whether the INT8 decode's P x V dot runs in fp16 (`DecodeConfig`)."""
        return self.config.fp16_pv

    def new_scratch(self) -> torch.Tensor | None:
        """A scratch buffer for ``run`` (None when the plan has one split and needs none)."""
        if not self.scratch_elements:
            return None
        return torch.empty(self.scratch_elements, dtype=torch.float32, device=self.device)

    def run(
        self,
        query: torch.Tensor,
        cache: PagedKVCache,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        softmax_scale: float,
        *,
        softcap: float | None = None,
        out: torch.Tensor | None = None,
        scratch: torch.Tensor | None = None,
        checked: bool = True,
    ) -> torch.Tensor:
        """The decode of `decode_attention` with this plan's shapes, without validation.

        Args:
            query: ``[num_seqs, num_q_heads, head_size]`` in ``model_dtype``.
            block_table: int32 ``[num_seqs, pages]``, contiguous rows; every page a sequence's
                length reaches must lie in the cache (not checked).
            seq_lens: int32 ``[num_seqs]``, at most ``max_seq_len`` (not checked).
            out: ``[num_seqs, num_q_heads, head_size]`` in ``out_dtype``; allocated if None.
            scratch: fp32, at least ``scratch_elements`` values, for more than one split;
                allocated if None. Its contents are overwritten.
            checked: False skips the shape, dtype and device checks below, for a caller whose
                tensors are this plan's by construction (an engine step's layers, planned
                from the same batch).

        Raises:
            InvalidInputError: a tensor's shape, dtype or device is not the plan's.
        """
        if checked:
            self._check_inputs(query, cache, block_table, seq_lens, softmax_scale, out, scratch)
        if out is None:
            out = torch.empty(query.shape, dtype=self.out_dtype, device=self.device)
        if not self.scratch_elements:
            scratch = None  # one split: the decode writes the result, no partials
        elif scratch is None:
            scratch = self.new_scratch()
        strides = (*query.stride()[:2], *out.stride()[:2], *cache.launch_strides)
        scalars = (softmax_scale, softcap or 0.0)
        if not (
            self._direct
            and self._launch_compiled(
                query, out, cache, block_table, seq_lens, scratch, scalars, strides
            )
        ):
            k_scale, v_scale = scale_tensors(cache)
            tensors = (out, query, cache.k, cache.v, k_scale, v_scale, block_table, seq_lens)
            self._launch_jit(tensors, cache, scratch, scalars)
        return out

    def _launch_compiled(
        self,
        query: torch.Tensor,
        out: torch.Tensor,
        cache: PagedKVCache,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        scratch: torch.Tensor | None,
        scalars: tuple[float, float],
        strides: tuple[int, ...],
    ) -> bool:
        """Launch the compiled kernels, pointers as addresses; False (nothing launched) when an
        address or stride is not a multiple of 16, as the compiled variant assumes.

        The arguments are those `_launch_jit` names, by position: binding them by name on each
        call (`KernelSpec.arguments`) would cost the host about 2 us.
        tests/test_decode_plan.py checks that the two paths pass the same.
        """
        o, q = out.data_ptr(), query.data_ptr()
        k, v, ks, vs = cache.launch_pointers
        bt, sl = block_table.data_ptr(), seq_lens.data_ptr()
        acc = o if scratch is None else scratch.data_ptr()
        maxes = acc + 4 * self._stats_offset
        sums = maxes + 4 * self._stats_padded
        sizes = 0
        for size in strides:
            sizes |= size
        if not aligned(o | q | k | v | ks | vs | bt | sl | acc, sizes):
            return False
        self._decode(
            self._decode_grid, o, acc, maxes, sums, q, k, v, ks, vs, bt, sl, *scalars,
            *self._decode_scalars, *strides, block_table.stride(0),
        )  # fmt: skip
        if scratch is not None:
            self._reduce(
                self._reduce_grid, o, acc, maxes, sums, self.num_splits, self.head_size,
                *strides[2:4],
            )  # fmt: skip
        return True

    def _launch_jit(
        self,
        tensors: tuple[torch.Tensor, ...],
        cache: PagedKVCache,
        scratch: torch.Tensor | None,
        scalars: tuple[float, float],
    ) -> None:
        """Launch through Triton's JIT: under the interpreter, or for arguments the compiled
        variant does not assume (the JIT compiles the variant they need)."""
        out, query, *_, block_table, seq_lens = tensors
        acc = max_ = sum_ = out  # one split: no partials, the decode writes the result
        if scratch is not None:
            stats = self._stats_offset
            acc, max_, sum_ = scratch, scratch[stats:], scratch[stats + self._stats_padded :]
        decode = decode_spec(
            **self.geometry.spec_arguments(runtime_target(self.device)),
            out_dtype=self.out_dtype,
            one_split=scratch is None,
            config=self.config,
        )
        decode_arguments = decode.arguments(
            **cache_arguments(cache),
            out_ptr=kernel_operand(out, cache),
            partial_acc_ptr=acc,
            partial_max_ptr=max_,
            partial_sum_ptr=sum_,
            q_ptr=kernel_operand(query, cache),
            block_table_ptr=block_table,
            seq_lens_ptr=seq_lens,
            softmax_scale=scalars[0],
            softcap=scalars[1],
            **dict(self._decode_constants),
            stride_q_t=query.stride(0),
            stride_q_h=query.stride(1),
            stride_o_t=out.stride(0),
            stride_o_h=out.stride(1),
            stride_bt=block_table.stride(0),
        )
        launch(decode, self._decode_grid, decode_arguments)
        if scratch is not None:
            reduce = reduce_spec(
                head_size=self.head_size, model_dtype=self.model_dtype, out_dtype=self.out_dtype
            )
            reduce_arguments = reduce.arguments(
                out_ptr=out,
                partial_acc_ptr=acc,
                partial_max_ptr=max_,
                partial_sum_ptr=sum_,
                num_splits=self.num_splits,
                head_size=self.head_size,
                stride_o_t=out.stride(0),
                stride_o_h=out.stride(1),
            )
            launch(reduce, self._reduce_grid, reduce_arguments)

    def _check_inputs(
        self,
        query: torch.Tensor,
        cache: PagedKVCache,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        softmax_scale: float,
        out: torch.Tensor | None,
        scratch: torch.Tensor | None,
    ) -> None:
        """What a launch with this plan's compiled variant needs of its tensors (shapes, dtypes,
        devices), each a one-line error; the values in them are not read."""
        shape = (self.num_seqs, self.num_q_heads, self.head_size)
        device = self.device
        for name, tensor, dtype, wanted in (
            ("query", query, self.model_dtype, shape),
            ("out", out, self.out_dtype, shape),
            ("seq_lens", seq_lens, torch.int32, (self.num_seqs,)),
        ):
            if tensor is not None and (
                tensor.shape != wanted or tensor.dtype != dtype or tensor.device != device
            ):
                raise InvalidInputError(
                    f"`{name}` is {tensor.dtype} {tuple(tensor.shape)} on {tensor.device}; this "
                    f"decode plan takes {dtype} {wanted} on {device}"
                )
        if query.stride(-1) != 1 or (out is not None and out.stride(-1) != 1):
            raise InvalidInputError("`query`/`out` must have a contiguous last (head) dimension")
        geometry = self.geometry
        page = (geometry.num_kv_heads, geometry.block_size, geometry.head_size)
        if (
            cache.k.shape[1:] != page
            or cache.dtype != geometry.cache_dtype
            or cache.device != device
        ):
            raise InvalidInputError(
                f"`cache` holds {cache.dtype} pages of {tuple(cache.k.shape[1:])} (kv heads, "
                f"block, head) on {cache.device}; this decode plan takes {geometry.cache_dtype} "
                f"{page} on {device}"
            )
        if (
            block_table.dtype != torch.int32
            or block_table.dim() != 2
            or block_table.shape[0] != self.num_seqs
            or block_table.stride(-1) != 1
            or block_table.device != device
        ):
            raise InvalidInputError(
                f"`block_table` is {block_table.dtype} {tuple(block_table.shape)} on "
                f"{block_table.device}; this decode plan takes int32 ({self.num_seqs}, pages), "
                f"rows contiguous, on {device}"
            )
        if (
            scratch is not None
            and self.scratch_elements
            and (
                scratch.dtype != torch.float32
                or scratch.numel() < self.scratch_elements
                or scratch.device != device
                or not scratch.is_contiguous()
            )
        ):
            raise InvalidInputError(
                f"`scratch` is {scratch.dtype} with {scratch.numel()} values on {scratch.device}; "
                f"this decode plan needs contiguous float32, >= {self.scratch_elements} values, "
                f"on {device}"
            )
        if not softmax_scale > 0:
            raise InvalidInputError(f"`softmax_scale` is {softmax_scale}; expected > 0")


def plan_decode(
    *,
    num_seqs: int,
    max_seq_len: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    model_dtype: torch.dtype,
    cache_dtype: torch.dtype,
    device: torch.device | str,
    out_dtype: torch.dtype | None = None,
    sliding_window: int | None = None,
    num_splits: int | None = None,
    config: DecodeConfig | None = None,
) -> DecodePlan:
    """The `DecodePlan` of a decode of ``num_seqs`` sequences of at most ``max_seq_len`` keys.

    Compiles the kernels for ``device`` (once per geometry) and, when ``num_splits`` is None,
    chooses the split count with `choose_num_splits`, from the device's program slots. Cached:
    lengths that round up to the same number of KV tiles share one plan.

    Args:
        out_dtype: the output's dtype, ``model_dtype`` if None (float32 for tests).
        sliding_window: the window the plan's launches apply, as in `decode_attention`.
        num_splits: force a split-KV count (rounded so that no split is empty).
        config: the launch shape, `decode_config`'s if None (e.g. ``decode_config(...,
            fp16_pv=True)`` forces the INT8 decode's P x V dot in fp16, CUDA only).
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    geometry = AttentionGeometry(
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        block_size=block_size,
        model_dtype=model_dtype,
        cache_dtype=cache_dtype,
    )
    _check_plan(geometry, num_seqs, max_seq_len, out_dtype, sliding_window, num_splits)
    if config is None:
        config = decode_config(
            head_size=head_size,
            block_size=block_size,
            gqa=geometry.gqa,
            cache_dtype=cache_dtype,
            target=runtime_target(device),
        )
    return _plan(
        geometry,
        num_seqs,
        -(-max_seq_len // config.tile_n) * config.tile_n,
        device,
        out_dtype or model_dtype,
        sliding_window,
        num_splits,
        config,
    )


@functools.lru_cache(maxsize=1024)
def _plan(
    geometry: AttentionGeometry,
    num_seqs: int,
    max_seq_len: int,
    device: torch.device,
    out_dtype: torch.dtype,
    sliding_window: int | None,
    num_splits: int | None,
    config: DecodeConfig,
) -> DecodePlan:
    gqa, num_kv_heads, head_size = geometry.gqa, geometry.num_kv_heads, geometry.head_size
    model_dtype = geometry.model_dtype
    spec_arguments = geometry.spec_arguments(runtime_target(device))
    decode = decode_spec(**spec_arguments, out_dtype=out_dtype, config=config)
    one_split = decode_spec(**spec_arguments, out_dtype=out_dtype, one_split=True, config=config)
    tile_n = config.tile_n
    span = max_seq_len if sliding_window is None else min(max_seq_len, sliding_window + tile_n)
    num_tiles = max(triton.cdiv(span, tile_n), 1)
    programs_per_seq = num_kv_heads * _head_blocks(gqa, config.columns)
    if num_splits is None:
        num_splits = choose_num_splits(
            num_seqs * programs_per_seq,
            num_tiles,
            _device_slots(decode, device),
            _device_slots(one_split, device),
        )
    num_splits = max(1, min(num_splits, num_tiles))
    tiles_per_split = triton.cdiv(num_tiles, num_splits)
    num_splits = triton.cdiv(num_tiles, tiles_per_split)  # no split is left empty
    reduce = reduce_spec(head_size=head_size, model_dtype=model_dtype, out_dtype=out_dtype)
    # Scratch: partial accumulators [seqs, q heads, splits, head], then the partial maxima and
    # sums [seqs, q heads, splits], each starting 16-byte aligned.
    stats = num_seqs * geometry.num_q_heads * num_splits if num_splits > 1 else 0
    stats_padded = -(-stats // 4) * 4
    decode_launch = kernel_launcher(one_split if num_splits == 1 else decode, device)
    reduce_launch = kernel_launcher(reduce, device)
    # The decode's arguments that this plan fixes, by name, then in the kernel's order: the
    # order in which `_launch_compiled` passes their values.
    fixed = {
        "sliding_window": sliding_window or 0,
        "num_splits": num_splits,
        "tiles_per_split": tiles_per_split,
        "group": gqa,
        "query_bf16": int(model_dtype == torch.bfloat16),
        "block_size": geometry.block_size,
        "block_shift": page_shift(geometry.block_size),
    }
    constants = tuple((name, fixed[name]) for name in decode.runtime_parameters if name in fixed)
    return DecodePlan(
        num_seqs=num_seqs,
        max_seq_len=max_seq_len,
        geometry=geometry,
        out_dtype=out_dtype,
        device=device,
        sliding_window=sliding_window,
        config=config,
        num_splits=num_splits,
        tiles_per_split=tiles_per_split,
        scratch_elements=stats * head_size + 2 * stats_padded,
        _decode=decode_launch,
        _reduce=reduce_launch,
        _direct=decode_launch.takes_addresses and reduce_launch.takes_addresses,
        _decode_grid=(num_seqs, programs_per_seq, num_splits),
        _reduce_grid=(num_seqs, geometry.num_q_heads),
        _decode_constants=constants,
        _decode_scalars=tuple(value for _, value in constants),
        _stats_offset=stats * head_size,
        _stats_padded=stats_padded,
    )


def _check_plan(
    geometry: AttentionGeometry,
    num_seqs: int,
    max_seq_len: int,
    out_dtype: torch.dtype | None,
    sliding_window: int | None,
    num_splits: int | None,
) -> None:
    for name, value in (("num_seqs", num_seqs), ("max_seq_len", max_seq_len)):
        if value < 1:
            raise InvalidInputError(f"`{name}` is {value}; expected >= 1")
    geometry.check()
    model_dtype = geometry.model_dtype
    if out_dtype not in (None, model_dtype, torch.float32):
        raise InvalidInputError(
            f"`out_dtype` is {out_dtype}; expected the model dtype {model_dtype} or torch.float32"
        )
    if sliding_window is not None and sliding_window < 1:
        raise InvalidInputError(f"`sliding_window` is {sliding_window}; expected >= 1 or None")
    if num_splits is not None and num_splits < 1:
        raise InvalidInputError(f"`num_splits` is {num_splits}; expected >= 1 or None")


def clear_plan_caches() -> None:
    """Forget plans and their launchers (tests that switch `_common.DIRECT_LAUNCH`)."""
    _plan.cache_clear()
    _decode_slots.clear()
    clear_launch_caches()
