"""The plugin's kernel path: kvquant's Triton ops over the engine's pages, with no vLLM import.

Which numerics serve a layer follows from where its tensors live (``numerics_for``): CUDA and ROCm
tensors go through kvquant's Triton kernels (``cache_write``, ``decode_attention``,
``prefill_attention``); CPU tensors through the fp32 torch reference (``_serving``), unless
``KVQUANT_VLLM_KERNELS=triton`` asks for the kernels there too, which then run in Triton's
interpreter. Both paths read and write the same page bytes (``_serving.cache_view``): the kernels'
cache write is bit-exact with the reference's.

A batch is split once per engine step (``plan_kernel_batch``), on the host, from the engine's CPU
copy of the query offsets: the leading requests with one new token go through one decode launch
(a ``kvquant.DecodePlan``), every request from the first longer one on through
``prefill_attention`` (cu_seqlens), which serves any query length, so a batch that is not ordered
decodes-first stays correct; it only sends more rows through the prefill kernel.

A step of decodes alone reads nothing on the host and allocates nothing in the layers (the plan's
split partials go to the builder's ``DecodeScratch``), so vLLM can capture it in a CUDA/HIP graph.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from .. import PagedKVCache
from ._errors import UnsupportedConfigError

if TYPE_CHECKING:
    from .. import DecodePlan

KERNELS_ENV = "KVQUANT_VLLM_KERNELS"
KERNELS_ON_CPU = "triton"

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


@dataclass(frozen=True)
class KernelBatch:
    """One engine step's batch as kvquant's kernels take it; built once, read by every layer.

    Requests ``[0, num_decodes)`` have one new token each (query rows ``0 .. num_decodes - 1``);
    the rest, rows ``num_decodes .. num_tokens - 1``, are prefill or chunked-prefill requests.
    All tensors are on the cache's device; the ints were read on the host.
    """

    num_decodes: int
    num_tokens: int
    decode_block_table: torch.Tensor  # int32 [num_decodes, max_pages]
    decode_seq_lens: torch.Tensor  # [num_decodes]
    decode_max_seq_len: int  # an upper bound of decode_seq_lens: sizes the split-KV decode
    prefill_block_table: torch.Tensor  # int32 [num_prefills, max_pages]
    prefill_seq_lens: torch.Tensor  # [num_prefills]
    prefill_cu_seqlens: torch.Tensor  # [num_prefills + 1], from 0, rows after the decodes
    # The builder's scratch for the decode's split partials; None: each launch allocates its own.
    decode_scratch: DecodeScratch | None = None


def plan_kernel_batch(
    query_start_loc_cpu: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_seq_len: int,
    decode_scratch: DecodeScratch | None = None,
) -> KernelBatch:
    """Split a batch into its leading decodes and the rest, reading only host tensors.

    Args:
        query_start_loc_cpu: ``[num_reqs + 1]`` query offsets on the host (the engine keeps a copy).
        query_start_loc, seq_lens, block_table: the same batch on the cache's device.
        max_seq_len: an upper bound of ``seq_lens`` (the engine's own; for a graph capture, the
            model's longest context, which the captured decode must cover at every replay).
    """
    query_lens = query_start_loc_cpu[1:] - query_start_loc_cpu[:-1]
    not_decode = torch.nonzero(query_lens != 1)
    num_decodes = int(not_decode[0, 0]) if len(not_decode) else len(query_lens)
    return KernelBatch(
        num_decodes=num_decodes,
        num_tokens=int(query_start_loc_cpu[-1]),
        decode_block_table=block_table[:num_decodes],
        decode_seq_lens=seq_lens[:num_decodes],
        decode_max_seq_len=max_seq_len,
        prefill_block_table=block_table[num_decodes:],
        prefill_seq_lens=seq_lens[num_decodes:],
        # Each decode request owns one row, so the first prefill row is row num_decodes.
        prefill_cu_seqlens=query_start_loc[num_decodes:] - num_decodes,
        decode_scratch=decode_scratch,
    )


def write_with_kernels(
    cache: PagedKVCache, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """``_serving.write`` through ``kvquant.cache_write``: the same bytes, on the cache's device.

    ``validate=False``: the range check costs a host sync per layer and step, and would break a
    CUDA-graph capture if the engine captured the write. The engine's slot mapping holds slots of
    pages it allocated to the batch, and -1 for padding, which the kernel skips.
    """
    from .. import cache_write

    num_slots = slot_mapping.shape[0]
    # The engine may pad key/value past the real tokens; slot_mapping covers exactly the real ones.
    cache_write(cache, key[:num_slots], value[:num_slots], slot_mapping, validate=False)


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

    The decodes go through the `DecodePlan` of their count and the batch's ``max_seq_len``, with
    the batch's scratch: no host read, no allocation (given the scratch), no validation, since
    the engine's block table holds, for every request, pages it allocated up to that request's
    length. ``prefill_attention`` reads ``cu_seqlens`` on the host to lay out its tiles and
    checks the block table, so a step with prefill requests pays its host syncs (and vLLM
    captures only steps of decodes alone, `_impl.Int8Builder`).
    """
    from .. import plan_decode, prefill_attention

    decodes = batch.num_decodes
    if decodes:
        plan = plan_decode(
            num_seqs=decodes,
            max_seq_len=max(batch.decode_max_seq_len, 1),  # vLLM's profiling runs may say 0
            num_q_heads=query.shape[1],
            num_kv_heads=cache.num_kv_heads,
            head_size=cache.head_size,
            block_size=cache.block_size,
            model_dtype=query.dtype,
            cache_dtype=cache.dtype,
            device=query.device,
            out_dtype=out.dtype,
            sliding_window=sliding_window,
        )
        plan.run(
            query[:decodes],
            cache,
            batch.decode_block_table,
            batch.decode_seq_lens,
            softmax_scale,
            softcap=softcap,
            out=out[:decodes],
            scratch=None if batch.decode_scratch is None else batch.decode_scratch.for_plan(plan),
        )
    if batch.num_tokens > decodes:
        prefill_attention(
            query[decodes : batch.num_tokens],
            cache,
            batch.prefill_block_table,
            batch.prefill_seq_lens,
            batch.prefill_cu_seqlens,
            softmax_scale,
            sliding_window=sliding_window,
            softcap=softcap,
            out=out[decodes : batch.num_tokens],
        )
