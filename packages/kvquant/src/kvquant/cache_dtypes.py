"""The one table of KV cache dtypes: each cache's name here, in vLLM and in lm-eval, its element
dtype, its size, and the paths that take it.

Every parser of a cache dtype looks its name up here (`cache_dtype`, `vllm_cache_dtype`): the
AOT build matrix, the kernels' cache allocation, kvbench's throughput cells and capacity rows,
its accuracy configs and the vLLM engine it starts. An unknown name is one error that lists the
names the asking path knows. Nothing here imports torch: element dtypes are torch's attribute
names, so a warm ``kvquant build`` and a config check stay torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import InvalidInputError

# The paths a cache dtype may be taken by.
KERNELS = "kernels"  # kvquant's Triton kernels on paged pages
BUILD = "build"  # the AOT build matrix: INT8 and the model's own 16-bit cache
ACCURACY = "accuracy"  # kvbench's accuracy runs on kvquant-hf (a real or emulated cache)
CONTROL = "control"  # the divergence runs' controls (INT8 with fewer bits), never shipped
VLLM = "vllm"  # a vLLM engine's --kv-cache-dtype (INT8 through kvquant's plugin)
PATHS = (KERNELS, BUILD, ACCURACY, CONTROL, VLLM)


@dataclass(frozen=True)
class CacheDType:
    """One KV cache dtype.

    Attributes:
        name: this project's name (build matrix, kvbench configs, kernel cells).
        vllm: vLLM's ``--kv-cache-dtype`` names, the one kvbench passes first; empty when vLLM
            has no such cache.
        lm_eval: the ``kv_cache_dtype`` lm-eval's ``vllm`` model is given, which it hands to the
            engine unchanged; None when that path cannot run it.
        torch_dtype: the stored element's torch dtype, by attribute name (``torch.int8``); None:
            the model's dtype.
        element_bytes: bytes per stored element (per K or V value; INT8 adds a 4-byte fp32 scale
            per token and kv head); None: the model dtype's.
        paths: the paths that take it (`PATHS`).
    """

    name: str
    vllm: tuple[str, ...]
    lm_eval: str | None
    torch_dtype: str | None
    element_bytes: float | None
    paths: frozenset[str]


def _row(
    name: str,
    vllm: tuple[str, ...],
    torch_dtype: str | None,
    element_bytes: float | None,
    *paths: str,
) -> CacheDType:
    lm_eval = vllm[0] if vllm and ACCURACY in paths else None
    return CacheDType(name, vllm, lm_eval, torch_dtype, element_bytes, frozenset(paths))


CACHE_DTYPES: tuple[CacheDType, ...] = (
    _row("auto", ("auto",), None, None, KERNELS, BUILD, ACCURACY, VLLM),
    _row("float16", ("float16",), "float16", 2, KERNELS, VLLM),
    _row("bfloat16", ("bfloat16",), "bfloat16", 2, KERNELS, VLLM),
    _row("int8", ("int8_per_token_head",), "int8", 1, KERNELS, BUILD, ACCURACY, VLLM),
    # Emulated on kvquant-hf (stored as fp8, attended in the model dtype), as vLLM's fp8 stores.
    _row("fp8_e4m3", ("fp8_e4m3", "fp8"), "float8_e4m3fn", 1, ACCURACY, VLLM),
    _row("fp8_e5m2", ("fp8_e5m2",), "float8_e5m2", 1, VLLM),
    # 4-bit codes held one per int8: a control that must fail the divergence gates.
    _row("int4", (), "int8", 0.5, CONTROL),
    # 5 to 7-bit codes, one per int8 as stored: controls reported beside the divergence gates.
    _row("int5", (), "int8", 1, CONTROL),
    _row("int6", (), "int8", 1, CONTROL),
    _row("int7", (), "int8", 1, CONTROL),
)
_BY_NAME = {row.name: row for row in CACHE_DTYPES}
_BY_VLLM_NAME = {name: row for row in CACHE_DTYPES for name in row.vllm}

# vLLM's name for kvquant's INT8 cache, which the plugin serves.
INT8_KV_CACHE_DTYPE = _BY_NAME["int8"].vllm[0]


class UnknownCacheDTypeError(InvalidInputError):
    """Raised for a cache dtype name the table, or the asking path, does not know."""


def cache_dtype_names(*paths: str) -> tuple[str, ...]:
    """The names of the caches that any of ``paths`` takes (every cache without one)."""
    return tuple(row.name for row in CACHE_DTYPES if not paths or row.paths & set(paths))


def cache_dtype(name: str, *paths: str) -> CacheDType:
    """The cache called ``name``, which one of ``paths`` must take (any without one)."""
    row = _BY_NAME.get(name)
    if row is None or (paths and not row.paths & set(paths)):
        known = ", ".join(cache_dtype_names(*paths))
        where = f" for {' or '.join(paths)}" if paths else ""
        msg = f"cache dtype {name!r} is not known{where}; expected one of {known}"
        raise UnknownCacheDTypeError(msg)
    return row


def vllm_cache_dtype(vllm_name: str) -> CacheDType:
    """The cache that vLLM's ``--kv-cache-dtype`` ``vllm_name`` stores."""
    row = _BY_VLLM_NAME.get(vllm_name)
    if row is None:
        known = ", ".join(_BY_VLLM_NAME)
        msg = f"vLLM cache dtype {vllm_name!r} is not known; expected one of {known}"
        raise UnknownCacheDTypeError(msg)
    return row
