"""kvquant's INT8 attention backend for vLLM 0.18.1 on the CPU, against that release's backend API.

0.18.1 differs from 0.32 where the page is concerned: it has no ``customize_spec`` or KV cache
layouts; the backend names the per-layer tensor's shape itself (``get_kv_cache_shape``) and vLLM
views each layer's bytes with it. The shape given here, ``[blocks, kv heads, block size, bytes]``
of int8, is one dense kvquant page per block, which ``_serving.cache_view`` reads without a copy.
The page's byte count comes from the spec hook in ``_hooks_v0_18``. ``_hooks_v0_18.check()`` has
verified every vLLM name used here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)

from .._cache import SUPPORTED_BLOCK_SIZES, SUPPORTED_HEAD_SIZES, page_bytes
from ._errors import UnsupportedConfigError
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
    """One batch, as the reference attention reads it; all tensors on the CPU."""

    num_actual_tokens: int
    query_start_loc: torch.Tensor  # [num_reqs + 1]
    seq_lens: torch.Tensor  # [num_reqs]
    block_table: torch.Tensor  # [num_reqs, max_blocks]


# The ignores: where the type check runs vLLM is absent, so its base classes are Any.
class KVQuantInt8MetadataBuilder(AttentionMetadataBuilder[KVQuantInt8Metadata]):  # type: ignore[misc,unused-ignore]
    def __init__(
        self,
        kv_cache_spec: Any,
        layer_names: list[str],
        vllm_config: Any,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        check_block_size(kv_cache_spec.block_size)
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
        return KVQuantInt8Metadata(
            num_actual_tokens=meta.num_actual_tokens,
            query_start_loc=meta.query_start_loc_cpu[: num_reqs + 1],
            seq_lens=meta.seq_lens[:num_reqs],
            block_table=meta.block_table_tensor[:num_reqs],
        )


class KVQuantInt8CPUImpl(AttentionImpl[KVQuantInt8Metadata]):  # type: ignore[misc,unused-ignore]
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

    def do_kv_cache_update(
        self,
        layer: torch.nn.Module,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        write(cache_view(kv_cache, self.head_size), key, value, slot_mapping)

    def forward(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: KVQuantInt8Metadata,
        output: torch.Tensor | None = None,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise UnsupportedConfigError(
                f"fused output quantization is not served with {INT8_KV_CACHE_DTYPE}"
            )
        # accept_output_buffer is set, so vLLM 0.18.1 always passes the output tensor.
        assert output is not None
        if attn_metadata is None:  # vLLM's warm-up and profiling runs carry no batch
            return output
        attend(
            query,
            cache_view(kv_cache, self.head_size),
            attn_metadata.block_table,
            attn_metadata.seq_lens,
            attn_metadata.query_start_loc,
            self.scale,
            output,
            sliding_window=self.sliding_window,
            softcap=self.logits_soft_cap,
        )
        return output


class KVQuantInt8CPUBackend(AttentionBackend):  # type: ignore[misc,unused-ignore]
    """Registered as ``AttentionBackendEnum.CUSTOM`` by ``_hooks_v0_18`` for INT8 layers only."""

    # vLLM 0.18.1 calls do_kv_cache_update only for backends that take the output buffer.
    accept_output_buffer: bool = True
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[Any]] = [INT8_KV_CACHE_DTYPE]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[KVQuantInt8CPUImpl]:
        return KVQuantInt8CPUImpl

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
