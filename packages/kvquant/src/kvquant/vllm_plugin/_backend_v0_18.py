"""kvquant's INT8 attention backends for vLLM 0.18.1, against that release's backend API.

0.18.1 differs from 0.32 where the page is concerned: it has no ``customize_spec`` or KV cache
layouts; the backend names the per-layer tensor's shape itself (``get_kv_cache_shape``) and vLLM
views each layer's bytes with it. The shape given here, ``[blocks, kv heads, block size, bytes]``
of int8, is one dense kvquant page per block, which ``_serving.cache_view`` reads without a copy.
The page's byte count comes from the spec hook in ``_hooks_v0_18``. The cache write and the
attention over the page are ``_impl``'s, shared with 0.32. ``_hooks_v0_18.check()`` has verified
every vLLM name used here.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
)

from .. import SUPPORTED_BLOCK_SIZES, SUPPORTED_HEAD_SIZES, page_bytes
from ._errors import UnsupportedConfigError
from ._impl import GRAPH_SUPPORT, Int8Builder, Int8Layer, Int8Metadata
from ._serving import (
    INT8_KV_CACHE_DTYPE,
    check_attention_layer,
    check_block_size,
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
        # vLLM hands the builder a copy of the spec resized to the kernel block, which keeps the
        # engine page's padded size; the engine page is what the spec hook must have sized.
        engine_block = vllm_config.cache_config.block_size
        expected = page_bytes(
            kv_cache_spec.num_kv_heads, engine_block, kv_cache_spec.head_size, torch.int8
        )
        if kv_cache_spec.page_size_padded != expected:
            raise UnsupportedConfigError(
                f"a {type(kv_cache_spec).__name__} of these layers was not sized for "
                f"{INT8_KV_CACHE_DTYPE} pages ({kv_cache_spec.page_size_padded} bytes, expected "
                f"{expected}); this attention layer type is not served"
            )


class KVQuantInt8GPUMetadataBuilder(KVQuantInt8MetadataBuilder):
    """The builder on CUDA and ROCm, where kvquant's kernels serve: vLLM may capture steps of
    single-token decodes in full graphs (``GRAPH_SUPPORT``); the CPU builder declares none."""

    _cudagraph_support: ClassVar[Any] = getattr(AttentionCGSupport, GRAPH_SUPPORT)


class KVQuantInt8Impl(Int8Layer, AttentionImpl[Int8Metadata]):  # type: ignore[misc,unused-ignore]
    """``_impl.Int8Layer`` as this version's ``AttentionImpl``."""


class KVQuantInt8Backend(AttentionBackend):  # type: ignore[misc,unused-ignore]
    """What both platform backends share: kvquant's pages, builder and impl."""

    # vLLM 0.18.1 calls do_kv_cache_update only for backends that take the output buffer.
    accept_output_buffer: bool = True
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
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        """One int8 row of K codes, V codes and two fp32 scales per (block, kv head, token).

        Contiguous, so each block's bytes are one kvquant page of ``kvquant.page_bytes``.
        """
        check_attention_layer(head_size=head_size)
        check_block_size(block_size)
        return (num_blocks, num_kv_heads, block_size, int8_content_bytes(head_size))

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[Any]:
        # Larger engine blocks are split by vLLM into kernel blocks of one of these sizes.
        return list(SUPPORTED_BLOCK_SIZES)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(SUPPORTED_HEAD_SIZES)


class KVQuantInt8CPUBackend(KVQuantInt8Backend):
    """Registered as ``AttentionBackendEnum.CUSTOM`` by ``_hooks_v0_18`` for INT8 layers on the CPU.

    The fp32 torch reference serves, so fp32 models are served too; with
    ``KVQUANT_VLLM_KERNELS=triton`` kvquant's kernels serve, in Triton's interpreter.
    """


class KVQuantInt8GPUBackend(KVQuantInt8Backend):
    """Registered as ``AttentionBackendEnum.CUSTOM`` by ``_hooks_v0_18`` for INT8 layers on GPUs.

    kvquant's Triton kernels serve, and they take fp16/bf16 activations only.
    """

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]

    @staticmethod
    def get_builder_cls() -> type[KVQuantInt8GPUMetadataBuilder]:
        return KVQuantInt8GPUMetadataBuilder
