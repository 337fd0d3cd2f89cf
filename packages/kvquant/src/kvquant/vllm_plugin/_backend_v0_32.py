"""kvquant's INT8 attention backends for vLLM 0.32.0, against vLLM's v1 backend API.

vLLM allocates, accounts and schedules the pages; these backends only decide what is inside a page
(kvquant's INT8 arrangement, sized through ``customize_spec``) and run the cache write and the
attention over it (``_impl``, shared with 0.18.1). ``_hooks_v0_32.check()`` has verified every
vLLM name used here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
)
from vllm.v1.kv_cache_interface import AttentionSpec, KVQuantMode
from vllm.v1.kv_cache_layout import KVCacheLayout

from .. import SUPPORTED_BLOCK_SIZES, SUPPORTED_HEAD_SIZES
from ._errors import UnsupportedConfigError
from ._impl import GRAPH_SUPPORT, Int8Builder, Int8Layer, Int8Metadata
from ._serving import (
    INT8_KV_CACHE_DTYPE,
    check_attention_layer,
    int8_content_bytes,
)


# The ignores: where the type check runs vLLM is absent, so its base classes are Any.
class KVQuantInt8MetadataBuilder(Int8Builder, AttentionMetadataBuilder[Int8Metadata]):  # type: ignore[misc,unused-ignore]
    def __init__(
        self,
        kv_cache_spec: Any,
        layer_names: list[str],
        vllm_config: Any,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._setup_builder(kv_cache_spec, vllm_config, device)


class KVQuantInt8GPUMetadataBuilder(KVQuantInt8MetadataBuilder):
    """The builder on CUDA and ROCm, where kvquant's kernels serve: vLLM may capture steps of
    single-token decodes in full graphs (``GRAPH_SUPPORT``); the CPU builder declares none."""

    _cudagraph_support: ClassVar[Any] = getattr(AttentionCGSupport, GRAPH_SUPPORT)


class KVQuantInt8Impl(Int8Layer, AttentionImpl[Int8Metadata]):  # type: ignore[misc,unused-ignore]
    """``_impl.Int8Layer`` as this version's ``AttentionImpl``."""


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

    @staticmethod
    def get_builder_cls() -> type[KVQuantInt8GPUMetadataBuilder]:
        return KVQuantInt8GPUMetadataBuilder
