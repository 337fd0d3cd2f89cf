"""KV capacity for a fixed memory budget: how many tokens and whole sequences fit, per cache dtype.

Computed from the model's shape and kvquant's page size (for INT8 that is upstream vLLM's
``int8_per_token_head`` page: codes plus one fp32 scale per token and kv head, for K and V), for
each KV cache dtype the end-to-end cells run, in the element dtype the engine stores it in: the
engine's ``auto`` cache holds the model's dtype, which the engine arguments set (bfloat16 on the CPU
nightly), so computed rows and the engine's own rows describe the same cache. Engine rows come from
the capacity each vLLM cell logged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvquant.cache_dtypes import UnknownCacheDTypeError, vllm_cache_dtype

from ._matrix import CapacitySettings, E2ECell, EngineSettings
from ._model import ModelShape

# vLLM's --dtype names for the model's torch dtype.
_MODEL_DTYPES = {
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
}


def engine_model_dtype(args: Sequence[str], config_dtype: str | None) -> str | None:
    """The dtype the engine runs the model in: the last ``--dtype`` of ``args``; for ``auto`` (or
    none) the config's, but float16 for a float32 config, as vLLM's ``auto`` chooses. None when
    neither says."""
    chosen = "auto"
    for index, arg in enumerate(args):
        if arg == "--dtype" and index + 1 < len(args):
            chosen = args[index + 1]
        elif arg.startswith("--dtype="):
            chosen = arg.partition("=")[2]
    if chosen == "auto":
        if config_dtype is None:
            return None
        return "float16" if config_dtype == "float32" else config_dtype
    return _MODEL_DTYPES.get(chosen)


def stored_dtype(kv_cache_dtype: str, model_dtype: str | None) -> str | None:
    """The element dtype a ``--kv-cache-dtype`` cache stores; None when it is not known here."""
    try:
        stored = vllm_cache_dtype(kv_cache_dtype).torch_dtype
    except UnknownCacheDTypeError:
        return None
    return model_dtype if stored is None else stored


def cell_dtypes(
    cell: E2ECell, engine: EngineSettings, config_dtype: str | None
) -> tuple[str | None, str | None]:
    """The model dtype an end-to-end cell's engine runs, and the element dtype its KV cache
    stores: the engine's arguments, then the cell's, decide."""
    model_dtype = engine_model_dtype([*engine.args, *cell.extra_args], config_dtype)
    return model_dtype, stored_dtype(cell.kv_cache_dtype, model_dtype)


def computed_capacity(
    shape: ModelShape, settings: CapacitySettings, caches: Sequence[tuple[str, str]]
) -> list[dict[str, Any]]:
    """One row per ``(kv_cache_dtype, cache_dtype)`` of ``caches``: the whole blocks that fit the
    budget, as tokens and sequences, and the bytes one token takes in every layer."""
    import torch

    from kvquant import page_bytes  # imports torch, so not at module level

    budget = int(settings.kv_budget_gib * 2**30)
    blocks_per_seq = -(-settings.seq_len // settings.block_size)
    rows = []
    for kv_cache_dtype, cache_dtype in caches:
        block_bytes = shape.num_layers * page_bytes(
            shape.num_kv_heads, settings.block_size, shape.head_size, getattr(torch, cache_dtype)
        )
        blocks = budget // block_bytes
        rows.append(
            {
                "kv_cache_dtype": kv_cache_dtype,
                "cache_dtype": cache_dtype,
                "block_size": settings.block_size,
                "budget_bytes": budget,
                "seq_len": settings.seq_len,
                # Exact: a page holds block_size tokens of every layer's kv heads.
                "bytes_per_token": block_bytes // settings.block_size,
                "max_tokens": blocks * settings.block_size,
                "max_seqs": blocks // blocks_per_seq,
                "source": "computed",
            }
        )
    return rows
