"""KV capacity for a fixed memory budget: how many tokens and whole sequences fit, 16-bit vs INT8.

Computed from the model's shape and kvquant's page size (for INT8 that is upstream vLLM's
``int8_per_token_head`` page: codes plus one fp32 scale per token and kv head, for K and V).
Engine rows come from the capacity each vLLM cell logged.
"""

from __future__ import annotations

from typing import Any

from ._matrix import CapacitySettings
from ._model import ModelShape


def computed_capacity(shape: ModelShape, settings: CapacitySettings) -> list[dict[str, Any]]:
    """One row per cache dtype: the whole blocks that fit the budget, as tokens and sequences."""
    import torch

    from kvquant import page_bytes
    from kvquant.vllm_plugin import INT8_KV_CACHE_DTYPE  # imports torch, so not at module level

    # The row labels use vLLM's kv_cache_dtype names, so computed and engine rows line up.
    cache_dtypes = {"16-bit": torch.bfloat16, INT8_KV_CACHE_DTYPE: torch.int8}
    budget = int(settings.kv_budget_gib * 2**30)
    blocks_per_seq = -(-settings.seq_len // settings.block_size)
    rows = []
    for name, dtype in cache_dtypes.items():
        block_bytes = shape.num_layers * page_bytes(
            shape.num_kv_heads, settings.block_size, shape.head_size, dtype
        )
        blocks = budget // block_bytes
        rows.append(
            {
                "kv_cache_dtype": name,
                "block_size": settings.block_size,
                "budget_bytes": budget,
                "seq_len": settings.seq_len,
                "max_tokens": blocks * settings.block_size,
                "max_seqs": blocks // blocks_per_seq,
                "source": "computed",
            }
        )
    return rows
