"""INT8 per-(token, kv-head) paged KV cache: Triton kernels, torch references and checks.

Every name but the errors is imported on first use. Triton decides at import whether kernels run
compiled or in its CPU interpreter (``TRITON_INTERPRET=1``), so the ``kvquant`` CLI can choose the
interpreter for ``--device cpu`` first; and ``kvquant build`` on a warm cache never imports torch
or Triton (2.6 s and 0.4 s here), which keeps a warm rebuild under its 2 s.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import InvalidInputError, KernelUnavailableError, KVQuantError

if TYPE_CHECKING:
    from ._cache import (
        ACTIVATION_DTYPES,
        SUPPORTED_BLOCK_SIZES,
        SUPPORTED_HEAD_SIZES,
        AttentionGeometry,
        PagedKVCache,
        allocate_cache,
        cache_from_pages,
        from_upstream_layout,
        page_bytes,
        to_upstream_layout,
    )
    from ._check import run_correctness
    from ._correctness import CorrectnessResult
    from ._output import output_problem
    from .ops._common import interpreted
    from .ops.cache_write import cache_write
    from .ops.decode import DecodeConfig, DecodePlan, decode_attention, decode_config, plan_decode
    from .ops.prefill import (
        PrefillConfig,
        PrefillScratch,
        PrefillStepPlan,
        plan_prefill_step,
        prefill_attention,
    )

_LAZY_EXPORTS = {
    "ACTIVATION_DTYPES": "._cache",
    "interpreted": ".ops._common",
    "SUPPORTED_BLOCK_SIZES": "._cache",
    "SUPPORTED_HEAD_SIZES": "._cache",
    "PagedKVCache": "._cache",
    "allocate_cache": "._cache",
    "cache_from_pages": "._cache",
    "from_upstream_layout": "._cache",
    "page_bytes": "._cache",
    "to_upstream_layout": "._cache",
    "cache_write": ".ops.cache_write",
    "AttentionGeometry": "._cache",
    "DecodeConfig": ".ops.decode",
    "DecodePlan": ".ops.decode",
    "decode_config": ".ops.decode",
    "decode_attention": ".ops.decode",
    "plan_decode": ".ops.decode",
    "PrefillConfig": ".ops.prefill",
    "PrefillScratch": ".ops.prefill",
    "PrefillStepPlan": ".ops.prefill",
    "prefill_attention": ".ops.prefill",
    "plan_prefill_step": ".ops.prefill",
    "WORKSPACE_LIMIT_BYTES": ".ops.prefill",
    "engine_pages": ".ops.prefill",
    "workspace_page_bytes": ".ops.prefill",
    "CorrectnessResult": "._correctness",
    "run_correctness": "._check",
    "output_problem": "._output",
}

__all__ = [
    "ACTIVATION_DTYPES",
    "SUPPORTED_BLOCK_SIZES",
    "SUPPORTED_HEAD_SIZES",
    "WORKSPACE_LIMIT_BYTES",
    "AttentionGeometry",
    "CorrectnessResult",
    "DecodeConfig",
    "DecodePlan",
    "InvalidInputError",
    "KVQuantError",
    "KernelUnavailableError",
    "PagedKVCache",
    "PrefillConfig",
    "PrefillScratch",
    "PrefillStepPlan",
    "allocate_cache",
    "cache_from_pages",
    "cache_write",
    "decode_attention",
    "decode_config",
    "engine_pages",
    "from_upstream_layout",
    "interpreted",
    "output_problem",
    "page_bytes",
    "plan_decode",
    "plan_prefill_step",
    "prefill_attention",
    "run_correctness",
    "to_upstream_layout",
    "workspace_page_bytes",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_EXPORTS:
        return getattr(importlib.import_module(_LAZY_EXPORTS[name], __name__), name)
    raise AttributeError(f"module 'kvquant' has no attribute {name!r}")
