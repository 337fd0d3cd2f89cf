"""The attention layer and batch metadata every supported vLLM serves INT8 with; no vLLM import.

vLLM 0.18.1 and 0.32.0 differ in how a backend declares its page (``_backend_v0_18``,
``_backend_v0_32``), not in what a layer does with it: the same constructor checks, the same
cache write and attention over kvquant's pages, the same per-step batch metadata. That part lives
here once; each version's backend module mixes it into that version's base classes.

Which numerics serve follows from where the layer's tensors live (``_kernels.numerics_for``):
kvquant's Triton kernels on CUDA/ROCm, its fp32 torch reference on the CPU unless
``KVQUANT_VLLM_KERNELS=triton``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .. import AttentionGeometry, PagedKVCache
from ._errors import UnsupportedConfigError
from ._kernels import (
    DecodeScratch,
    KernelBatch,
    Numerics,
    attend_with_kernels,
    engine_workspace,
    numerics_for,
    plan_kernel_batch,
    write_with_kernels,
)
from ._platforms import Expect, parameters
from ._serving import (
    INT8_KV_CACHE_DTYPE,
    attend,
    cache_view,
    check_attention_layer,
    check_block_size,
    write,
)

if TYPE_CHECKING:
    from .. import PrefillScratch

# What Int8Layer and build_metadata take from vLLM, the same in every supported version: vLLM
# passes the impl's constructor arguments by position, in this order.
_IMPL_PARAMETERS = [
    "num_heads",
    "head_size",
    "scale",
    "num_kv_heads",
    "alibi_slopes",
    "sliding_window",
    "kv_cache_dtype",
    "logits_soft_cap",
    "attn_type",
    "kv_sharing_target_layer_name",
]
_FORWARD_PARAMETERS = [
    "layer",
    "query",
    "key",
    "value",
    "kv_cache",
    "attn_metadata",
    "output",
    "output_scale",
    "output_block_scale",
]
_BUILD_PARAMETERS = ["common_prefix_len", "common_attn_metadata", "fast_build"]
_CAPTURE_BUILD_PARAMETERS = ["common_attn_metadata"]
# What Int8Builder reads of the engine's config to size the decode scratch for graph capture.
_CONFIG_FIELDS = {
    "ModelConfig": ("max_model_len", "dtype"),
    "CompilationConfig": ("cudagraph_capture_sizes",),
    "SchedulerConfig": ("max_num_seqs", "max_num_batched_tokens"),
}
_COMMON_METADATA_FIELDS = (
    "query_start_loc",
    "query_start_loc_cpu",
    "max_seq_len",
    "seq_lens",
    "num_reqs",
    "num_actual_tokens",
    "block_table_tensor",
    "slot_mapping",
    "causal",
)
# Where each supported vLLM keeps its host copy of the batch's sequence lengths, which the kernel
# path lays a step's prefill out from (0.32: exact for every request but speculative decodes;
# 0.18.1: the runner's copy behind the seq_lens_cpu property, which would sync when unset).
HOST_SEQ_LENS_FIELDS = ("seq_lens_cpu_upper_bound", "_seq_lens_cpu")


def check_layer_api(expect: Expect) -> None:
    """Check vLLM's backend API where this module relies on it (each version's ``check()``)."""
    from vllm.v1.attention import backend as backend_api

    for name in ("AttentionBackend", "AttentionImpl", "AttentionMetadataBuilder"):
        expect(hasattr(backend_api, name), f"vllm.v1.attention.backend has no {name}")
    expect(
        parameters(backend_api.AttentionImpl.__init__)[1:] == _IMPL_PARAMETERS,
        "AttentionImpl.__init__ has another signature",
    )
    expect(
        parameters(backend_api.AttentionImpl.forward)[1:] == _FORWARD_PARAMETERS,
        "AttentionImpl.forward has another signature",
    )
    builder = backend_api.AttentionMetadataBuilder
    expect(
        hasattr(builder, "reorder_batch_threshold"),
        "AttentionMetadataBuilder has no reorder_batch_threshold",
    )
    expect(
        parameters(builder.build)[1:] == _BUILD_PARAMETERS,
        "AttentionMetadataBuilder.build has another signature",
    )
    common_fields = {f.name for f in dataclasses.fields(backend_api.CommonAttentionMetadata)}
    expect(
        set(_COMMON_METADATA_FIELDS) <= common_fields,
        f"CommonAttentionMetadata lacks one of {_COMMON_METADATA_FIELDS}",
    )
    expect(
        bool(set(HOST_SEQ_LENS_FIELDS) & common_fields),
        f"CommonAttentionMetadata has none of {HOST_SEQ_LENS_FIELDS}",
    )
    # CUDA graphs: the GPU builders declare uniform single-token decode batches capturable and
    # build the capture's metadata for the model's longest context.
    support = getattr(backend_api, "AttentionCGSupport", None)
    expect(
        support is not None and hasattr(support, GRAPH_SUPPORT),
        f"vllm.v1.attention.backend has no AttentionCGSupport.{GRAPH_SUPPORT}",
    )
    expect(
        hasattr(builder, "_cudagraph_support")
        and parameters(builder.build_for_cudagraph_capture)[1:] == _CAPTURE_BUILD_PARAMETERS,
        "AttentionMetadataBuilder has no _cudagraph_support or another "
        "build_for_cudagraph_capture(common_attn_metadata)",
    )
    from vllm import config as config_api

    for class_name, names in _CONFIG_FIELDS.items():
        config_class = getattr(config_api, class_name, None)
        fields = (
            set() if config_class is None else {f.name for f in dataclasses.fields(config_class)}
        )
        expect(set(names) <= fields, f"vllm.config.{class_name} lacks one of {names}")
    model_config = getattr(config_api, "ModelConfig", None)
    expect(
        model_config is not None
        and parameters(model_config.get_num_attention_heads)[1:2] == ["parallel_config"],
        "ModelConfig.get_num_attention_heads(parallel_config, ...) has another signature",
    )


# The AttentionCGSupport level the GPU builders declare: the strongest that holds. Steps of
# single-token decodes are one plan launch, no host read, no allocation. UNIFORM_BATCH (equal
# query lengths above 1, speculative decoding) and ALWAYS (mixed batches) would capture a
# prefill whose launch grids (query tiles, workspace pages) come from the step's lengths on the
# host: a graph replayed with other lengths would launch the captured step's grids.
GRAPH_SUPPORT = "UNIFORM_SINGLE_TOKEN_DECODE"


@dataclass
class Int8Metadata:
    """One batch: as the reference reads it, and split for the kernels when they serve."""

    num_actual_tokens: int
    query_start_loc: torch.Tensor  # [num_reqs + 1], on the host
    seq_lens: torch.Tensor  # [num_reqs]
    block_table: torch.Tensor  # [num_reqs, max_blocks]
    kernel_batch: KernelBatch | None  # None: the fp32 torch reference serves this batch


def host_seq_lens(common: Any) -> torch.Tensor:
    """The batch's sequence lengths on the host: the engine's own copy (`HOST_SEQ_LENS_FIELDS`),
    else a copy made here, which waits for the device once per step."""
    num_reqs = common.num_reqs
    for name in HOST_SEQ_LENS_FIELDS:
        lengths = getattr(common, name, None)
        if lengths is not None:
            host: torch.Tensor = torch.as_tensor(lengths)[:num_reqs]
            return host
    copied: torch.Tensor = common.seq_lens[:num_reqs].cpu()
    return copied


def build_metadata(common: Any, builder: Int8Builder) -> Int8Metadata:
    """The batch of vLLM's ``CommonAttentionMetadata`` (the fields both versions share)."""
    if common.causal is not True:
        raise UnsupportedConfigError(
            f"only causal attention is served with {INT8_KV_CACHE_DTYPE}; "
            "this batch asks for non-causal attention"
        )
    num_reqs = common.num_reqs
    seq_lens = common.seq_lens[:num_reqs]
    block_table = common.block_table_tensor[:num_reqs]
    kernel_batch = None
    if builder.numerics == "triton":
        kernel_batch = plan_kernel_batch(
            builder.geometry,
            common.query_start_loc_cpu[: num_reqs + 1],
            host_seq_lens(common),
            seq_lens,
            block_table,
            common.max_seq_len,
            sliding_window=builder.sliding_window,
            decode_scratch=builder.decode_scratch,
            prefill_scratch=builder.prefill_scratch,
        )
    return Int8Metadata(
        num_actual_tokens=common.num_actual_tokens,
        query_start_loc=common.query_start_loc_cpu[: num_reqs + 1],
        seq_lens=seq_lens,
        block_table=block_table,
        kernel_batch=kernel_batch,
    )


def engine_limits(vllm_config: Any) -> dict[str, int]:
    """What sizes an engine's prefill workspace (`_kernels.engine_workspace`): its longest
    context, and the most tokens and requests one step holds."""
    return {
        "max_seq_len": int(vllm_config.model_config.max_model_len),
        "max_tokens": int(vllm_config.scheduler_config.max_num_batched_tokens),
        "max_seqs": int(vllm_config.scheduler_config.max_num_seqs),
    }


def reserve_workspace(num_kv_heads: int, head_size: int) -> None:
    """Make the engine's INT8 prefill workspace (`_kernels.engine_workspace`) while vLLM loads
    the model onto a GPU, as the first INT8 layer is constructed: vLLM counts what loading
    allocates before it sizes the KV cache, so the workspace comes out of the same budget.
    Outside a model load on a GPU (no current config, a CPU engine) it is made by the builder."""
    device = torch.get_default_device()
    if device.type == "cpu":
        return
    from vllm.config import get_current_vllm_config_or_none

    vllm_config = get_current_vllm_config_or_none()
    if vllm_config is not None and numerics_for(device) == "triton":
        engine_workspace(device, num_kv_heads, head_size, **engine_limits(vllm_config))


# AttentionType.DECODER's value in every supported vLLM (AttentionType is a str enum).
DECODER = "decoder"


class Int8Builder:
    """The metadata builder's part, mixed into each vLLM version's ``AttentionMetadataBuilder``;
    the version's builder calls ``_setup_builder`` from its constructor.

    On the kernel path it owns the decode scratch of its layers (`DecodeScratch`), reserved on
    a GPU for the batch sizes vLLM captures at the model's longest context, and builds a
    capture's metadata for that context (``build_for_cudagraph_capture``): a captured decode
    then covers every length a replay brings.
    """

    # vLLM's model runner then puts one-token requests first, so the kernel path attends them in
    # one decode launch (0.32's V2 runner orders batches that way by itself).
    reorder_batch_threshold: int | None = 1
    numerics: Numerics
    geometry: AttentionGeometry
    sliding_window: int | None
    decode_scratch: DecodeScratch | None
    prefill_scratch: PrefillScratch | None
    max_model_len: int

    def _setup_builder(self, kv_cache_spec: Any, vllm_config: Any, device: torch.device) -> None:
        check_block_size(kv_cache_spec.block_size)
        device = torch.device(device)
        self.numerics = numerics_for(device)
        model = vllm_config.model_config
        self.max_model_len = int(model.max_model_len)
        self.sliding_window = getattr(kv_cache_spec, "sliding_window", None)
        self.geometry = AttentionGeometry(
            num_q_heads=model.get_num_attention_heads(vllm_config.parallel_config),
            num_kv_heads=kv_cache_spec.num_kv_heads,
            head_size=kv_cache_spec.head_size,
            block_size=kv_cache_spec.block_size,
            model_dtype=model.dtype,
            cache_dtype=torch.int8,
        )
        self.decode_scratch = self.prefill_scratch = None
        if self.numerics == "triton":
            self.decode_scratch = DecodeScratch(device)
            if device.type == "cuda":
                self._reserve_decode_scratch(kv_cache_spec, vllm_config)
            # Made while the model loaded (`Int8Layer`) on a GPU: the same one is found here.
            self.prefill_scratch = engine_workspace(
                device,
                kv_cache_spec.num_kv_heads,
                kv_cache_spec.head_size,
                **engine_limits(vllm_config),
            )

    def _reserve_decode_scratch(self, kv_cache_spec: Any, vllm_config: Any) -> None:
        """Scratch for the decode plans of every batch size vLLM may capture (uniform decode
        batches of at most max_num_seqs requests), at the model's longest context."""
        from .. import plan_decode

        assert self.decode_scratch is not None
        geometry = self.geometry
        sizes = vllm_config.compilation_config.cudagraph_capture_sizes or []
        max_seqs = vllm_config.scheduler_config.max_num_seqs
        self.decode_scratch.reserve(
            plan_decode(
                num_seqs=size,
                max_seq_len=self.max_model_len,
                num_q_heads=geometry.num_q_heads,
                num_kv_heads=geometry.num_kv_heads,
                head_size=geometry.head_size,
                block_size=geometry.block_size,
                model_dtype=geometry.model_dtype,
                cache_dtype=geometry.cache_dtype,
                device=self.decode_scratch.device,
                sliding_window=sliding_window,
            )
            for size in sizes
            if size <= max_seqs
            for sliding_window in {None, self.sliding_window}
        )

    def build(
        self, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False
    ) -> Int8Metadata:
        return build_metadata(common_attn_metadata, self)

    def build_for_cudagraph_capture(self, common_attn_metadata: Any) -> Int8Metadata:
        """A capture's metadata, as vLLM's Triton backend builds it: the decode planned for the
        model's longest context (whatever the capture's max_seq_len says), and the captured
        warm-up's sequences cut to one key (seq_lens is vLLM's own buffer, rewritten before
        every replay)."""
        common = dataclasses.replace(common_attn_metadata, max_seq_len=self.max_model_len)
        metadata = self.build(0, common)
        metadata.seq_lens.fill_(1)
        return metadata


class Int8Layer:
    """An INT8 attention impl, mixed into each vLLM version's ``AttentionImpl``.

    The constructor and ``forward`` take vLLM's parameters in vLLM's order (it passes them by
    position; ``check_layer_api`` verifies the order), so the versions' impls add nothing but
    their base class.
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = INT8_KV_CACHE_DTYPE,
        logits_soft_cap: float | None = None,
        attn_type: str = DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
        **unsupported: Any,
    ) -> None:
        if unsupported:
            raise UnsupportedConfigError(
                f"this model's attention needs {sorted(unsupported)}, which kvquant's "
                f"{INT8_KV_CACHE_DTYPE} backend does not implement"
            )
        if kv_cache_dtype != INT8_KV_CACHE_DTYPE:
            raise UnsupportedConfigError(
                f"kvquant's backend was selected for kv_cache_dtype {kv_cache_dtype!r}; "
                f"it serves only {INT8_KV_CACHE_DTYPE}"
            )
        check_attention_layer(
            head_size=head_size,
            has_sink=sinks is not None,
            has_alibi=alibi_slopes is not None,
            is_decoder=attn_type == DECODER,
        )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.sliding_window = sliding_window
        # vLLM passes 0 or None for "no softcap"; the reference takes None.
        self.logits_soft_cap = logits_soft_cap or None
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        # Decided on the first write, from the cache's device (the builder decides the same way).
        self.write_numerics: Numerics | None = None
        # The layer's KV tensor is the same every step: its view is made once (`_cache_view`).
        self._cache_view: tuple[tuple[Any, ...], PagedKVCache] | None = None
        reserve_workspace(self.num_kv_heads, head_size)

    def _view(self, kv_cache: torch.Tensor) -> PagedKVCache:
        """``cache_view`` of the layer's tensor, remade only when another tensor comes."""
        key = (kv_cache.data_ptr(), kv_cache.shape, kv_cache.stride(), kv_cache.device)
        if self._cache_view is None or self._cache_view[0] != key:
            self._cache_view = (key, cache_view(kv_cache, self.head_size))
        return self._cache_view[1]

    def do_kv_cache_update(
        self,
        layer: torch.nn.Module,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        if self.write_numerics is None:
            self.write_numerics = numerics_for(kv_cache.device)
        cache = self._view(kv_cache)
        if self.write_numerics == "triton":
            write_with_kernels(cache, key, value, slot_mapping)
        else:
            write(cache, key, value, slot_mapping)

    def forward(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: Int8Metadata | None,
        output: torch.Tensor | None = None,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise UnsupportedConfigError(
                f"fused output quantization is not served with {INT8_KV_CACHE_DTYPE}"
            )
        # Every supported vLLM passes the output buffer: 0.32 always, 0.18.1 to backends with
        # accept_output_buffer, which kvquant's set.
        assert output is not None
        if attn_metadata is None:  # vLLM's warm-up and profiling runs carry no batch
            return output
        cache = self._view(kv_cache)
        if attn_metadata.kernel_batch is not None:
            attend_with_kernels(
                query,
                cache,
                attn_metadata.kernel_batch,
                self.scale,
                output,
                sliding_window=self.sliding_window,
                softcap=self.logits_soft_cap,
            )
            return output
        attend(
            query,
            cache,
            attn_metadata.block_table,
            attn_metadata.seq_lens,
            attn_metadata.query_start_loc,
            self.scale,
            output,
            sliding_window=self.sliding_window,
            softcap=self.logits_soft_cap,
        )
        return output
