"""Triton kernels, one family per package or module: the decode (`decode`), the prefill
(`prefill`) and the cache write (`cache_write`), each with its kernels, specs and launchers.

``aot_specs`` lists every kernel the package ships for one model configuration, as
``KernelSpec``s that say exactly what the launchers compile (for the ahead-of-time build).
"""

from __future__ import annotations

import torch

from . import cache_write, decode, prefill
from ._common import KernelSpec


def aot_specs(
    *,
    head_size: int,
    block_size: int,
    gqa: int,
    model_dtype: torch.dtype,
    cache_dtype: torch.dtype,
    target: str,
) -> list[KernelSpec]:
    """All kernels for one configuration: decode attention, its reducer, prefill, cache write.

    Args:
        target: "cuda" or "hip".
    """
    specs: list[KernelSpec] = []
    for module in (decode, prefill, cache_write):
        specs += module.aot_specs(
            head_size=head_size,
            block_size=block_size,
            gqa=gqa,
            model_dtype=model_dtype,
            cache_dtype=cache_dtype,
            target=target,
        )
    return specs


__all__ = ["KernelSpec", "aot_specs"]
