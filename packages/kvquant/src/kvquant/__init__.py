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
        PagedKVCache,
        allocate_cache,
        from_upstream_layout,
        page_bytes,
        to_upstream_layout,
    )
    from ._check import run_correctness
    from ._correctness import CorrectnessResult
    from .ops.cache_write import cache_write
    from .ops.paged_attention import DecodePlan, decode_attention, plan_decode
    from .ops.prefill_attention import PrefillConfig, prefill_attention

_LAZY_EXPORTS = {
    "PagedKVCache": "._cache",
    "allocate_cache": "._cache",
    "from_upstream_layout": "._cache",
    "page_bytes": "._cache",
    "to_upstream_layout": "._cache",
    "cache_write": ".ops.cache_write",
    "DecodePlan": ".ops.paged_attention",
    "decode_attention": ".ops.paged_attention",
    "plan_decode": ".ops.paged_attention",
    "PrefillConfig": ".ops.prefill_attention",
    "prefill_attention": ".ops.prefill_attention",
    "CorrectnessResult": "._correctness",
    "run_correctness": "._check",
}

__all__ = [
    "CorrectnessResult",
    "DecodePlan",
    "InvalidInputError",
    "KVQuantError",
    "KernelUnavailableError",
    "PagedKVCache",
    "PrefillConfig",
    "allocate_cache",
    "cache_write",
    "decode_attention",
    "from_upstream_layout",
    "page_bytes",
    "plan_decode",
    "prefill_attention",
    "run_correctness",
    "to_upstream_layout",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_EXPORTS:
        return getattr(importlib.import_module(_LAZY_EXPORTS[name], __name__), name)
    raise AttributeError(f"module 'kvquant' has no attribute {name!r}")
