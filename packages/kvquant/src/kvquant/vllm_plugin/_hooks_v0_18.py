"""Every hook into vLLM 0.18.1's internals, and the checks that they still look as expected.

vLLM 0.18.1 (the base of the team's fork) has no INT8 KV cache dtype at all, so the plugin adds
``int8_per_token_head`` end to end:

- the dtype itself: the ``CacheDType`` literal that ``CacheConfig`` validates against (and the
  CLI's ``--kv-cache-dtype`` choices, built from the same field), the copy of that literal the
  attention selector asserts against, and ``STR_DTYPE_TO_TORCH_DTYPE`` (``torch.int8``);
- the page: ``Attention.get_kv_cache_spec`` gives an INT8 layer's spec ``page_size_padded =
  kvquant.page_bytes(...)``, the int8 codes plus two fp32 scales per (token, kv head); 0.18.1
  would otherwise size the page as codes only;
- the backend: the current platform's ``get_attn_backend_cls`` (``CpuPlatform``,
  ``CudaPlatformBase`` or ``RocmPlatform``; ``_platforms``, shared with 0.32) returns kvquant's
  backend for INT8 layers; other dtypes are untouched. On the CPU kvquant's fp32 torch reference
  serves (its Triton kernels in Triton's interpreter with ``KVQUANT_VLLM_KERNELS=triton``), on
  CUDA and ROCm its Triton kernels;
- the front-process refusals (``_guard``); any other platform (XPU, TPU...) is refused there.

``check()`` verifies, at plugin load, every name, field and signature those hooks and
``_backend_v0_18`` rely on (those ``upstream_hooks.toml`` declares for 0.18.1 among them), and
raises ``IncompatibleVLLMError`` naming the first that differs.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any

import torch

from .. import page_bytes
from ._guard import check_declared_hooks, install_config_guard
from ._impl import check_layer_api
from ._platforms import (
    check_engine_config,
    check_selectors,
    expect_for,
    install_selector,
    other_platform_modules,
    platform_hooks,
)
from ._serving import INT8_KV_CACHE_DTYPE, check_attention_layer, wants_int8

VLLM_VERSION = "0.18.1"
_expect = expect_for(VLLM_VERSION)
PLATFORM_HOOKS = platform_hooks("kvquant.vllm_plugin._backend_v0_18")
_ORIGINAL_MARK = "_kvquant_original"
# The literal install() made: check() must accept it when register() runs again in a process.
_extended_cache_dtype: Any = None


def _original(owner: type, name: str) -> Any:
    """The function behind ``owner.name`` before this module wrapped it."""
    function = inspect.getattr_static(owner, name)
    return getattr(function, _ORIGINAL_MARK, function)


def check() -> None:
    """Verify everything the hooks and the backend use; raise on the first difference: first
    the hooks ``upstream_hooks.toml`` declares for 0.18.1 (``_guard``), then what a declaration
    cannot say (the literal the config validates against, the selector's copy of it, pydantic's
    rebuild), then the selectors' sources and the layer API."""
    check_declared_hooks(VLLM_VERSION, _expect, other_platform_modules(PLATFORM_HOOKS))
    try:
        import pydantic.dataclasses
    except ImportError as error:
        missing = str(error)
    else:
        missing = ""
    # Refused outside the except block: the stored refusal must not carry the ImportError along.
    _expect(not missing, f"a module the plugin uses is missing ({missing})")
    from vllm.config import cache as cache_module
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.attention import selector as selector_module

    _expect(
        hasattr(pydantic.dataclasses, "rebuild_dataclass"),
        "its pydantic has no dataclasses.rebuild_dataclass",
    )
    cache_dtype = cache_module.CacheDType
    _expect(
        typing.get_origin(cache_dtype) is typing.Literal
        and all(isinstance(value, str) for value in typing.get_args(cache_dtype)),
        "vllm.config.cache.CacheDType is not a Literal of strings",
    )
    _expect(
        cache_dtype is _extended_cache_dtype
        or INT8_KV_CACHE_DTYPE not in typing.get_args(cache_dtype),
        f"its CacheDType already lists {INT8_KV_CACHE_DTYPE!r} (a modified vLLM?)",
    )
    cache_config = cache_module.CacheConfig
    fields = getattr(cache_config, "__dataclass_fields__", {})
    _expect(
        "cache_dtype" in fields
        and fields["cache_dtype"].type is cache_dtype
        and hasattr(cache_config, "__pydantic_validator__"),
        "CacheConfig is not a pydantic dataclass whose cache_dtype field is CacheDType",
    )
    _expect(
        selector_module.CacheDType is cache_dtype,
        "vllm.v1.attention.selector does not check kv_cache_dtype against CacheDType",
    )
    _expect(
        isinstance(STR_DTYPE_TO_TORCH_DTYPE, dict)
        and STR_DTYPE_TO_TORCH_DTYPE.get(INT8_KV_CACHE_DTYPE, torch.int8) is torch.int8,
        f"STR_DTYPE_TO_TORCH_DTYPE maps {INT8_KV_CACHE_DTYPE} to another torch dtype",
    )
    check_selectors(PLATFORM_HOOKS, _expect)
    check_layer_api(_expect)


def decide(vllm_config: Any) -> None:
    """Front-process refusals, once the engine's config is settled (see ``_guard``)."""
    forced = [vllm_config.attention_config.backend]
    check_engine_config(vllm_config, PLATFORM_HOOKS, VLLM_VERSION, forced)


def _int8_kv_cache_spec(self: Any, vllm_config: Any) -> Any:
    """``Attention.get_kv_cache_spec`` with an INT8 layer's page sized as kvquant's page."""
    spec = getattr(_int8_kv_cache_spec, _ORIGINAL_MARK)(self, vllm_config)
    if not wants_int8(self.kv_cache_dtype):
        return spec
    check_attention_layer(head_size=spec.head_size, head_size_v=getattr(spec, "head_size_v", None))
    int8_page = page_bytes(spec.num_kv_heads, spec.block_size, spec.head_size, torch.int8)
    return dataclasses.replace(spec, page_size_padded=int8_page)


def _add_int8_cache_dtype() -> None:
    """Make ``int8_per_token_head`` a valid ``CacheDType`` wherever 0.18.1 validates one."""
    import pydantic.dataclasses
    from vllm.config import cache as cache_module
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.attention import selector as selector_module

    global _extended_cache_dtype
    STR_DTYPE_TO_TORCH_DTYPE[INT8_KV_CACHE_DTYPE] = torch.int8
    if cache_module.CacheDType is _extended_cache_dtype:
        return
    values = (*typing.get_args(cache_module.CacheDType), INT8_KV_CACHE_DTYPE)
    extended = typing.Literal[values]  # type: ignore[valid-type]
    cache_config = cache_module.CacheConfig
    # pydantic's rebuild and the CLI's --kv-cache-dtype choices both read the field's type; the
    # class annotation is kept in step for anything that reads type hints instead.
    cache_config.__dataclass_fields__["cache_dtype"].type = extended
    cache_config.__annotations__["cache_dtype"] = extended
    pydantic.dataclasses.rebuild_dataclass(cache_config, force=True)
    cache_module.CacheDType = extended
    selector_module.CacheDType = extended
    _extended_cache_dtype = extended


def _wrap(owner: type, name: str, wrapper: Any) -> None:
    """Replace ``owner.name`` by ``wrapper``, which calls the original; never stacks wrappers."""
    setattr(wrapper, _ORIGINAL_MARK, _original(owner, name))
    setattr(owner, name, wrapper)


def install() -> None:
    """Apply every hook. Call ``check()`` first; installing twice patches once."""
    from vllm.model_executor.layers.attention.attention import Attention

    _add_int8_cache_dtype()
    _wrap(Attention, "get_kv_cache_spec", _int8_kv_cache_spec)
    install_selector(PLATFORM_HOOKS, VLLM_VERSION)
    install_config_guard(decide)
