"""INT8 per-(token, kv-head) paged KV cache: Triton kernels, torch references and checks.

Triton decides at import whether kernels run compiled or in its CPU interpreter
(``TRITON_INTERPRET=1``). So the kernel modules are imported on first use of a name that needs
them, which lets the ``kvquant`` CLI choose the interpreter for ``--device cpu`` first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._cache import (
    PagedKVCache,
    allocate_cache,
    from_upstream_layout,
    page_bytes,
    to_upstream_layout,
)
from ._errors import InvalidInputError, KernelUnavailableError, KVQuantError

if TYPE_CHECKING:
    from ._check import run_correctness
    from .ops.cache_write import cache_write
    from .ops.paged_attention import decode_attention, prefill_attention

_KERNEL_EXPORTS = {
    "cache_write": ".ops.cache_write",
    "decode_attention": ".ops.paged_attention",
    "prefill_attention": ".ops.paged_attention",
    "run_correctness": "._check",
}

__all__ = [
    "InvalidInputError",
    "KVQuantError",
    "KernelUnavailableError",
    "PagedKVCache",
    "allocate_cache",
    "cache_write",
    "decode_attention",
    "from_upstream_layout",
    "page_bytes",
    "prefill_attention",
    "run_correctness",
    "to_upstream_layout",
]


def __getattr__(name: str) -> Any:
    if name in _KERNEL_EXPORTS:
        return getattr(importlib.import_module(_KERNEL_EXPORTS[name], __name__), name)
    raise AttributeError(f"module 'kvquant' has no attribute {name!r}")
