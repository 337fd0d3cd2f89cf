"""vLLM plugin: serve ``--kv-cache-dtype int8_per_token_head`` with kvquant next to a stock vLLM.

vLLM calls ``register()`` in every process through the ``vllm.general_plugins`` entry point. It
picks the hook module written for the installed vLLM version (``_hooks_v0_32``, ``_hooks_v0_18``),
checks that what it patches looks as expected (first the upstream symbols ``UPSTREAM_HOOKS_FILE``
declares for that version, which forkaudit checks in a fork's source too), and installs hooks
that act only when the engine's KV cache dtype is ``int8_per_token_head`` (on 0.18.1, which lacks
that dtype, the hooks first add it); with any other dtype the engine runs as if the plugin were
absent. When kvquant cannot serve the INT8 request (unsupported vLLM, a vLLM whose internals
differ, MLA or hybrid model, unsupported head size, another attention backend forced), engine
start fails with a one-line ``VLLMPluginError``; the plugin never lets vLLM fall back to a 16-bit
cache.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from ._errors import (
    IncompatibleVLLMError,
    UnsupportedConfigError,
    UnsupportedVLLMError,
    VLLMPluginError,
)
from ._guard import UPSTREAM_HOOKS_FILE
from ._serving import INT8_KV_CACHE_DTYPE

# Released vLLM version -> the module holding every hook into that version's internals.
HOOK_MODULES = {"0.32.0": "._hooks_v0_32", "0.18.1": "._hooks_v0_18"}
SUPPORTED_VLLM_VERSIONS = tuple(HOOK_MODULES)

__all__ = [
    "INT8_KV_CACHE_DTYPE",
    "SUPPORTED_VLLM_VERSIONS",
    "UPSTREAM_HOOKS_FILE",
    "IncompatibleVLLMError",
    "UnsupportedConfigError",
    "UnsupportedVLLMError",
    "VLLMPluginError",
    "hook_module_for",
    "register",
]


def hook_module_for(vllm_version: str) -> str:
    """The hook module's name for a vLLM version string ("0.32.0", "0.32.0+cpu").

    Raises:
        UnsupportedVLLMError: no hook module was written for that version.
    """
    release = re.match(r"\d+\.\d+\.\d+", vllm_version)
    module = HOOK_MODULES.get(release.group(0)) if release else None
    if module is None or release is None or release.group(0) != vllm_version.split("+")[0]:
        raise UnsupportedVLLMError(
            f"vLLM {vllm_version} is not supported for {INT8_KV_CACHE_DTYPE}; "
            f"supported vLLM versions: {', '.join(SUPPORTED_VLLM_VERSIONS)}"
        )
    return module


def _refuse_int8(refusal: VLLMPluginError) -> Any:
    from ._serving import wants_int8

    def decide(vllm_config: Any) -> None:
        if wants_int8(vllm_config.cache_config.cache_dtype):
            raise refusal

    return decide


def register() -> None:
    """vLLM's ``vllm.general_plugins`` entry point; safe to call more than once per process."""
    import vllm

    from ._guard import install_config_guard

    try:
        hooks = importlib.import_module(hook_module_for(vllm.__version__), __name__)
        hooks.check()
    except VLLMPluginError as refusal:
        # Patch nothing that could not be verified; refuse only an engine that asks for INT8.
        install_config_guard(_refuse_int8(refusal))
        return
    hooks.install()
