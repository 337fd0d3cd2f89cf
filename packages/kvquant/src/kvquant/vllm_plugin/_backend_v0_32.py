"""kvquant's INT8 attention backends for vLLM 0.32.0, against vLLM's v1 backend API.

vLLM allocates, accounts and schedules the pages; these backends only decide what is inside a page
(kvquant's INT8 arrangement) and run the cache write and the attention over it. Which numerics
run follows from where the layer's tensors live (``_kernels.numerics_for``): kvquant's Triton
kernels on CUDA/ROCm, its fp32 torch reference on the CPU unless ``KVQUANT_VLLM_KERNELS=triton``.
``_hooks_v0_32.check()`` has verified every vLLM name used here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_interface import AttentionSpec, KVQuantMode
from vllm.v1.kv_cache_layout import KVCacheLayout

from .._cache import SUPPORTED_BLOCK_SIZES, SUPPORTED_HEAD_SIZES
from ._errors import UnsupportedConfigError
from ._kernels import (
    KernelBatch,
    Numerics,
    attend_with_kernels,
    numerics_for,
    plan_kernel_batch,
    write_with_kernels,
)
from ._serving import (
    INT8_KV_CACHE_DTYPE,
    attend,
    cache_view,
    check_attention_layer,
    check_block_size,
    int8_content_bytes,
    write,
)


@dataclass
class KVQuantInt8Metadata:
    """One batch: as the reference reads it, and split for the kernels when they serve."""

    num_actual_tokens: int
    query_start_loc: torch.Tensor  # [num_reqs + 1], on the host
    seq_lens: torch.Tensor  # [num_reqs]
    block_table: torch.Tensor  # [num_reqs, max_blocks]
    kernel_batch: KernelBatch | None  # None: the fp32 torch reference serves this batch


# The ignores: where the type check runs vLLM is absent, so its base classes are Any.
class KVQuantInt8MetadataBuilder(AttentionMetadataBuilder[KVQuantInt8Metadata]):  # type: ignore[misc,unused-ignore]
    # vLLM's V1 model runner then puts one-token requests first, so the kernel path attends them
    # in one decode launch (the V2 runner orders batches that way by itself).
    reorder_batch_threshold: int | None = 1

    def __init__(
        self,
        kv_cache_spec: Any,
        layer_names: list[str],
        vllm_config: Any,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        check_block_size(kv_cache_spec.block_size)
        self.numerics: Numerics = numerics_for(torch.device(device))

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> KVQuantInt8Metadata:
        meta = common_attn_metadata
        if meta.causal is not True:
            raise UnsupportedConfigError(
                f"only causal attention is served with {INT8_KV_CACHE_DTYPE}; "
                "this batch asks for non-causal attention"
            )
        num_reqs = meta.num_reqs
        seq_lens = meta.seq_lens[:num_reqs]
        block_table = meta.block_table_tensor[:num_reqs]
        kernel_batch = None
        if self.numerics == "triton":
            kernel_batch = plan_kernel_batch(
                meta.query_start_loc_cpu[: num_reqs + 1],
                meta.query_start_loc[: num_reqs + 1],
                seq_lens,
                block_table,
                meta.max_seq_len,
            )
        return KVQuantInt8Metadata(
            num_actual_tokens=meta.num_actual_tokens,
            query_start_loc=meta.query_start_loc_cpu[: num_reqs + 1],
            seq_lens=seq_lens,
            block_table=block_table,
            kernel_batch=kernel_batch,
        )


class KVQuantInt8Impl(AttentionImpl[KVQuantInt8Metadata]):  # type: ignore[misc,unused-ignore]
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
        attn_type: str = AttentionType.DECODER,
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
            is_decoder=attn_type == AttentionType.DECODER,
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
        cache = cache_view(kv_cache, self.head_size)
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
        attn_metadata: KVQuantInt8Metadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise UnsupportedConfigError(
                f"fused output quantization is not served with {INT8_KV_CACHE_DTYPE}"
            )
        if attn_metadata is None:  # vLLM's warm-up and profiling runs carry no batch
            return output
        cache = cache_view(kv_cache, self.head_size)
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


class KVQuantInt8Backend(AttentionBackend):  # type: ignore[misc,unused-ignore]
    """What both platform backends share: kvquant's pages, builder and impl."""

    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[Any]] = [INT8_KV_CACHE_DTYPE]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[KVQuantInt8Impl]:
        return KVQuantInt8Impl

    @staticmethod
    def get_builder_cls() -> type[KVQuantInt8MetadataBuilder]:
        return KVQuantInt8MetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[Any]:
        # Larger engine blocks are split by vLLM into kernel blocks of one of these sizes.
        return list(SUPPORTED_BLOCK_SIZES)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(SUPPORTED_HEAD_SIZES)

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        # Layer-major, then block: each layer's page is one contiguous run of bytes, which is all
        # kvquant needs to lay its own arrangement over it.
        return (KVCacheLayout.LBHNC,)

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:
        """Count each (token, kv head)'s two fp32 scales in the page, as vLLM's own INT8 pages do.

        The result equals ``kvquant.page_bytes`` per page and vLLM's Triton backend's page for
        the same dtype, so vLLM's memory accounting stays its own.
        """
        if spec.kv_quant_mode != KVQuantMode.INT8_PER_TOKEN_HEAD:
            raise UnsupportedConfigError(
                f"kvquant's backend got a {spec.kv_quant_mode.name} layer; it serves only "
                f"{INT8_KV_CACHE_DTYPE}"
            )
        if spec.state_content_bytes is not None:
            return spec
        check_attention_layer(head_size=spec.head_size, head_size_v=spec.head_size_v)
        return replace(spec, state_content_bytes=int8_content_bytes(spec.head_size))


class KVQuantInt8CPUBackend(KVQuantInt8Backend):
    """Registered as ``AttentionBackendEnum.CUSTOM`` by ``_hooks_v0_32`` for INT8 layers on the CPU.

    The fp32 torch reference serves, so fp32 models are served too; with
    ``KVQUANT_VLLM_KERNELS=triton`` kvquant's kernels serve, in Triton's interpreter.
    """


class KVQuantInt8GPUBackend(KVQuantInt8Backend):
    """Registered as ``AttentionBackendEnum.CUSTOM`` by ``_hooks_v0_32`` for INT8 layers on GPUs.

    kvquant's Triton kernels serve, and they take fp16/bf16 activations only.
    """

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
