"""The plugin's kernel path: kvquant's Triton ops over the engine's pages, with no vLLM import.

Which numerics serve a layer follows from where its tensors live (``numerics_for``): CUDA and ROCm
tensors go through kvquant's Triton kernels (``cache_write``, ``decode_attention``,
``prefill_attention``); CPU tensors through the fp32 torch reference (``_serving``), unless
``KVQUANT_VLLM_KERNELS=triton`` asks for the kernels there too, which then run in Triton's
interpreter. Both paths read and write the same page bytes (``_serving.cache_view``): the kernels'
cache write is bit-exact with the reference's.

A batch is planned once per engine step (``plan_kernel_batch``), on the host, from the engine's
host copies of the query offsets and sequence lengths: the leading requests with one new token go
through one decode launch (a ``kvquant.DecodePlan``), every request from the first longer one on
through the prefill (a ``kvquant.PrefillStepPlan``, laid out once for the step), which serves any
query length, so a batch that is not ordered decodes-first stays correct; it only sends more rows
through the prefill kernel. Each layer then only launches (``attend_with_kernels``): no host read
of a device tensor, no allocation, no validation, whatever the batch holds.

The memory the layers reuse belongs to the engine, not to a layer: the decode's split partials
(the builder's ``DecodeScratch``) and an INT8 prefill's fp16 workspace (``engine_workspace``, one
per device and head geometry, allocated while vLLM loads the model, so that its memory profiling
counts it before sizing the KV cache).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from .. import AttentionGeometry, PagedKVCache
from ._errors import UnsupportedConfigError

if TYPE_CHECKING:
    from .. import DecodePlan, PrefillScratch, PrefillStepPlan

KERNELS_ENV = "KVQUANT_VLLM_KERNELS"
KERNELS_ON_CPU = "triton"
# The largest INT8 prefill workspace an engine holds, in MiB (`engine_workspace`); 0: none, every
# prefill then reads the INT8 pages itself (the fused kernel).
WORKSPACE_ENV = "KVQUANT_PREFILL_WORKSPACE_MIB"

Numerics = Literal["reference", "triton"]


def numerics_for(device: torch.device) -> Numerics:
    """Which numerics serve a layer whose tensors live on ``device``.

    Raises:
        UnsupportedConfigError: ``KVQUANT_VLLM_KERNELS`` holds anything but "triton" or nothing,
            or asks for the kernels on the CPU while Triton's interpreter is off.
    """
    requested = os.environ.get(KERNELS_ENV, "")
    if requested not in ("", KERNELS_ON_CPU):
        raise UnsupportedConfigError(
            f"{KERNELS_ENV}={requested!r} is not understood; leave it unset, or set it to "
            f"{KERNELS_ON_CPU!r} to run kvquant's Triton kernels on the CPU in Triton's interpreter"
        )
    if device.type != "cpu":
        return "triton"
    if not requested:
        return "reference"
    # Imported here: kvquant.ops imports the kernel modules, which the reference path never needs.
    from .. import interpreted

    if not interpreted():
        raise UnsupportedConfigError(
            f"{KERNELS_ENV}={KERNELS_ON_CPU} runs kvquant's Triton kernels on the CPU in Triton's "
            "interpreter, which is off; set TRITON_INTERPRET=1 in the engine's environment (Triton "
            "reads it when kvquant's kernels are first imported)"
        )
    return "triton"


def describe_numerics(numerics: Numerics, device_type: str) -> str:
    """The activation line's words for what computes the cache write and attention."""
    if numerics == "reference":
        return "kvquant's fp32 torch reference numerics"
    if device_type == "cpu":
        return "kvquant's Triton kernels, in Triton's CPU interpreter"
    return "kvquant's Triton kernels"


def check_kernel_dtype(model_dtype: torch.dtype) -> None:
    """Refuse a model dtype kvquant's kernels do not take (they read fp16/bf16 activations)."""
    from .. import ACTIVATION_DTYPES

    if model_dtype not in ACTIVATION_DTYPES:
        raise UnsupportedConfigError(
            f"kvquant's Triton kernels take float16 or bfloat16 activations and this model runs "
            f"in {model_dtype}; pass --dtype bfloat16 or --dtype float16"
        )


class DecodeScratch:
    """The split-KV scratch of one metadata builder's layers, sized before vLLM captures.

    The layers run one after the other on one stream, so one buffer serves every layer's split
    partials, as vLLM's Triton backend shares its softmax segments. ``reserve`` sizes it for the
    plans of the batch sizes vLLM captures, at the model's longest context, so that a capture
    allocates nothing. An eager batch that needs more gets a larger buffer; the earlier ones stay
    alive, because graphs captured with them keep their addresses.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: list[torch.Tensor] = []

    @property
    def capacity(self) -> int:
        """fp32 values of the current buffer."""
        return self._buffers[-1].numel() if self._buffers else 0

    def reserve(self, plans: Iterable[DecodePlan]) -> None:
        """Make room for the largest scratch of ``plans``."""
        needed = max((plan.scratch_elements for plan in plans), default=0)
        if needed > self.capacity:
            size = max(needed, 2 * self.capacity)
            self._buffers.append(torch.empty(size, dtype=torch.float32, device=self.device))

    def for_plan(self, plan: DecodePlan) -> torch.Tensor | None:
        """The buffer ``plan.run`` takes as its scratch (None for one split).

        Raises:
            UnsupportedConfigError: a graph capture needs more than was reserved; growing the
                buffer then would allocate inside the capture.
        """
        if not plan.scratch_elements:
            return None
        if plan.scratch_elements > self.capacity:
            if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise UnsupportedConfigError(
                    f"a CUDA graph capture of {plan.num_seqs} decodes at context "
                    f"{plan.max_seq_len} needs {plan.scratch_elements} values of decode scratch; "
                    f"{self.capacity} were reserved for the engine's capture sizes"
                )
            self.reserve([plan])
        return self._buffers[-1]


# A step's plans by the layer's sliding window and output dtype.
_PlanKey = tuple[int | None, torch.dtype]


@dataclass
class KernelBatch:
    """One engine step's batch as kvquant's kernels take it; planned once, read by every layer.

    Requests ``[0, num_decodes)`` have one new token each (query rows ``0 .. num_decodes - 1``);
    the rest, rows ``num_decodes .. num_tokens - 1``, are prefill or chunked-prefill requests.
    The plans are made for the builder's sliding window and the model dtype's output; a layer
    with another window or output dtype (tests: fp32) gets its own on first use, from the same
    host copies (``decode_for``, ``prefill_for``).
    """

    geometry: AttentionGeometry
    num_decodes: int
    num_tokens: int
    decode_block_table: torch.Tensor  # int32 [num_reqs, max_pages]: the decodes' are its first
    decode_seq_lens: torch.Tensor  # [num_reqs]: the decodes' first
    decode_max_seq_len: int  # an upper bound of decode_seq_lens: sizes the split-KV decode
    prefill_block_table: torch.Tensor  # int32 [num_prefills, max_pages]
    prefill_seq_lens: torch.Tensor  # [num_prefills]
    # Host copies: the prefill requests' query offsets from 0, and their key counts.
    prefill_query_start_loc: list[int]
    prefill_seq_lens_host: list[int]
    decode_scratch: DecodeScratch | None = None
    prefill_scratch: PrefillScratch | None = None
    _decodes: dict[_PlanKey, tuple[DecodePlan, torch.Tensor | None]] = field(default_factory=dict)
    _prefills: dict[_PlanKey, PrefillStepPlan] = field(default_factory=dict)

    def decode_for(
        self, sliding_window: int | None, out_dtype: torch.dtype
    ) -> tuple[DecodePlan, torch.Tensor | None]:
        """The decode plan of this step's decodes and its scratch (None: one split)."""
        planned = self._decodes.get((sliding_window, out_dtype))
        if planned is None:
            geometry = self.geometry
            plan = _planners()[0](
                num_seqs=self.num_decodes,
                max_seq_len=max(self.decode_max_seq_len, 1),  # vLLM's profiling may say 0
                num_q_heads=geometry.num_q_heads,
                num_kv_heads=geometry.num_kv_heads,
                head_size=geometry.head_size,
                block_size=geometry.block_size,
                model_dtype=geometry.model_dtype,
                cache_dtype=geometry.cache_dtype,
                device=self.decode_block_table.device,
                out_dtype=out_dtype,
                sliding_window=sliding_window,
            )
            # The builder's scratch, or one for this step: never one per layer.
            if self.decode_scratch is None:
                scratch = plan.new_scratch()
            else:
                scratch = self.decode_scratch.for_plan(plan)
            planned = self._decodes[sliding_window, out_dtype] = (plan, scratch)
        return planned

    def prefill_for(self, sliding_window: int | None, out_dtype: torch.dtype) -> PrefillStepPlan:
        """The prefill plan of this step's prefill requests."""
        plan = self._prefills.get((sliding_window, out_dtype))
        if plan is None:
            plan = self._prefills[sliding_window, out_dtype] = _planners()[1](
                self.geometry,
                self.prefill_query_start_loc,
                self.prefill_seq_lens_host,
                self.prefill_seq_lens,
                self.prefill_block_table,
                device=self.prefill_block_table.device,
                sliding_window=sliding_window,
                scratch=self.prefill_scratch,
                out_dtype=out_dtype,
            )
        return plan


def plan_kernel_batch(
    geometry: AttentionGeometry,
    query_start_loc_cpu: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_seq_len: int,
    *,
    sliding_window: int | None = None,
    decode_scratch: DecodeScratch | None = None,
    prefill_scratch: PrefillScratch | None = None,
) -> KernelBatch:
    """Split a batch into its leading decodes and the rest and plan both, reading only host
    tensors.

    Args:
        geometry: the layers' attention (query heads, kv heads, head and block size, dtypes).
        query_start_loc_cpu: ``[num_reqs + 1]`` query offsets on the host (the engine keeps a copy).
        seq_lens_cpu: ``[num_reqs]`` key counts on the host; exact for the requests past the
            leading decodes (the decodes' are not read).
        seq_lens, block_table: the same batch on the cache's device.
        max_seq_len: an upper bound of ``seq_lens`` (the engine's own; for a graph capture, the
            model's longest context, which the captured decode must cover at every replay).
        sliding_window: the window the layers apply (the builder's spec's), planned up front.
    """
    # Host lists: each torch operation on a tiny CPU tensor costs the host microseconds.
    starts: list[int] = query_start_loc_cpu.tolist()
    num_reqs = len(starts) - 1
    num_decodes = 0
    while num_decodes < num_reqs and starts[num_decodes + 1] - starts[num_decodes] == 1:
        num_decodes += 1
    has_prefills = starts[-1] > num_decodes
    batch = KernelBatch(
        geometry=geometry,
        num_decodes=num_decodes,
        num_tokens=starts[-1],
        # The decodes are the first rows: the whole tensors serve, without a view.
        decode_block_table=block_table,
        decode_seq_lens=seq_lens,
        decode_max_seq_len=max_seq_len,
        prefill_block_table=block_table[num_decodes:] if has_prefills else block_table,
        prefill_seq_lens=seq_lens[num_decodes:] if has_prefills else seq_lens,
        # Each decode request owns one row, so the first prefill row is row num_decodes.
        prefill_query_start_loc=[start - num_decodes for start in starts[num_decodes:]],
        prefill_seq_lens_host=seq_lens_cpu.tolist()[num_decodes:] if has_prefills else [],
        decode_scratch=decode_scratch,
        prefill_scratch=prefill_scratch,
    )
    if num_decodes:
        batch.decode_for(sliding_window, geometry.model_dtype)
    if batch.num_tokens > num_decodes:
        batch.prefill_for(sliding_window, geometry.model_dtype)
    return batch


def write_with_kernels(
    cache: PagedKVCache, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """``_serving.write`` through ``kvquant.cache_write``: the same bytes, on the cache's device.

    Neither validated nor checked: the range check costs a host sync per layer and step, and
    would break a CUDA-graph capture if the engine captured the write, and the engine's tensors
    are right by construction: its slot mapping holds slots of pages it allocated to the batch,
    and -1 for padding, which the kernel skips.
    """
    num_slots = slot_mapping.shape[0]
    # The engine may pad key/value past the real tokens; slot_mapping covers exactly the real ones.
    if key.shape[0] != num_slots:
        key, value = key[:num_slots], value[:num_slots]
    _cache_write()(cache, key, value, slot_mapping, validate=False, checked=False)


@functools.cache
def _planners() -> tuple[Any, Any]:
    """(plan_decode, plan_prefill_step), imported once: a step plans without the import
    machinery."""
    from ..ops.decode import plan_decode
    from ..ops.prefill import plan_prefill_step

    return plan_decode, plan_prefill_step


@functools.cache
def _cache_write() -> Any:
    """``kvquant.cache_write``, imported once: a layer's write takes no import machinery."""
    from ..ops.cache_write import cache_write

    return cache_write


def attend_with_kernels(
    query: torch.Tensor,
    cache: PagedKVCache,
    batch: KernelBatch,
    softmax_scale: float,
    out: torch.Tensor,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> None:
    """``_serving.attend`` through kvquant's kernels; writes ``out[:batch.num_tokens]`` in place.

    Launches only: the step's decode plan with its scratch, and the step's prefill plan (the
    workspace's fill and the prefill), each made once for the step by ``plan_kernel_batch``.
    Nothing is validated here: the engine's block table holds, for every request, pages it
    allocated up to that request's length.

    Raises:
        UnsupportedConfigError: the layer's query or cache is not of the geometry the builder
            planned for.
    """
    geometry = batch.geometry
    if (
        query.shape[1] != geometry.num_q_heads
        or query.dtype != geometry.model_dtype
        or cache.head_size != geometry.head_size
        or cache.num_kv_heads != geometry.num_kv_heads
    ):
        raise UnsupportedConfigError(
            f"a layer attends {query.shape[1]} {query.dtype} query heads over {cache.num_kv_heads} "
            f"kv heads of {cache.head_size}; its builder planned for {geometry}"
        )
    decodes = batch.num_decodes
    if decodes:
        plan, scratch = batch.decode_for(sliding_window, out.dtype)
        # The whole query and output: the plan's decodes are their first rows, and a slice
        # would cost the host a view.
        plan.run(
            query,
            cache,
            batch.decode_block_table,
            batch.decode_seq_lens,
            softmax_scale,
            softcap=softcap,
            out=out,
            scratch=scratch,
            checked=False,  # planned from this batch; the layer's geometry checked above
        )
    if batch.num_tokens > decodes:
        prefill = batch.prefill_for(sliding_window, out.dtype)
        prefill.run(query, cache, out, softmax_scale, softcap, first_row=decodes)


# The engine's INT8 prefill workspaces, by (device, kv heads, head size): one serves every layer
# of that geometry on the device, since the layers run one after the other on one stream.
_workspaces: dict[tuple[torch.device, int, int], PrefillScratch] = {}


def workspace_limit_bytes() -> int:
    """The INT8 prefill workspace's byte limit (``KVQUANT_PREFILL_WORKSPACE_MIB``).

    Raises:
        UnsupportedConfigError: the variable holds anything but a whole number of MiB >= 0.
    """
    from .. import WORKSPACE_LIMIT_BYTES

    value = os.environ.get(WORKSPACE_ENV, "")
    if not value:
        return int(WORKSPACE_LIMIT_BYTES)
    if not value.isdigit():
        raise UnsupportedConfigError(
            f"{WORKSPACE_ENV}={value!r} is not a whole number of MiB; leave it unset for "
            f"{WORKSPACE_LIMIT_BYTES >> 20} MiB, or 0 for no workspace"
        )
    return int(value) << 20


def engine_workspace(
    device: torch.device,
    num_kv_heads: int,
    head_size: int,
    *,
    max_tokens: int,
    max_seqs: int,
    max_seq_len: int,
) -> PrefillScratch | None:
    """The INT8 prefill workspace of an engine's layers of these heads on ``device``: pages for
    a step's keys with every prefix within one longest context (``kvquant.engine_pages``), at
    most ``workspace_limit_bytes()`` of them; None at a limit of 0. Made once per process and
    geometry; a later call for a larger engine gets a larger one."""
    from .. import PrefillScratch, engine_pages, workspace_page_bytes

    page = workspace_page_bytes(num_kv_heads, head_size)
    wanted = engine_pages(max_tokens=max_tokens, max_seqs=max_seqs, max_seq_len=max_seq_len)
    capacity = min(wanted, workspace_limit_bytes() // page)
    if capacity < 1:
        return None
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device, num_kv_heads, head_size)
    scratch = _workspaces.get(key)
    if scratch is None or scratch.capacity < capacity:
        scratch = _workspaces[key] = PrefillScratch(
            num_kv_heads=num_kv_heads, head_size=head_size, capacity=capacity, device=device
        )
    return scratch
