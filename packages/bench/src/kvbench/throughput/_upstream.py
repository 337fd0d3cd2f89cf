"""The baselines timed beside kvquant's kernels, cell by cell: upstream vLLM's Triton kernels and
PyTorch's SDPA flash.

``impl = "vllm"``: upstream's `unified_attention` as its TRITON_ATTN backend calls it (the decode
through its split-KV path up to ``128 // num_kv_heads`` sequences and one pass above, with the
backend's scratch; the prefill with each sequence's new tokens as its queries), on a bf16 cache in
upstream's layout or on upstream's INT8 records (`kvquant.to_upstream_layout` of a kvquant cache of
the same random data), and its cache writes (`triton_reshape_and_cache_flash`, and the
per-token-head quantizing write for INT8). Upstream comes from `kvquant.upstream`: the installed
vLLM, or with ``$KVBENCH_UPSTREAM_VLLM`` a folder of its kernel files unpacked from a wheel beside
kvquant's import stand-ins (``python -m kvquant.upstream WHEEL FOLDER``); either way every cell
names the version it timed. Its INT8 cache needs vLLM 0.32 or newer.

``impl = "sdpa"``: the prefill's attention on a dense 16-bit K and V through PyTorch's flash
backend (dense causal; GQA by repeating K and V, a cached prefix by the lower-right causal mask),
as ``benchmark_prefill_attention.py`` times it.

A baseline that cannot run here raises `BaselineUnavailableError`: its cell is "not measured",
with why, never a failure of the run.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._errors import BaselineUnavailableError

if TYPE_CHECKING:
    import torch

    from kvquant.upstream import UpstreamKernels

    from ._matrix import KernelCell

UPSTREAM_ENV = "KVBENCH_UPSTREAM_VLLM"


def _interpreted_triton() -> None:
    """Under Triton's interpreter a CPU build of vLLM finds no Triton backend and hands its
    modules a placeholder Triton; give them the real one, whose interpreter runs the kernels."""
    utils = importlib.import_module("vllm.triton_utils")
    if not getattr(utils, "HAS_TRITON", True):
        triton = importlib.import_module("triton")
        vars(utils).update(triton=triton, tl=importlib.import_module("triton.language"))


@functools.cache
def load_upstream() -> UpstreamKernels | str:
    """Upstream's kernels (from ``$KVBENCH_UPSTREAM_VLLM``'s folder, else the installed vLLM),
    or why they cannot be imported here."""
    from kvquant.upstream import UpstreamError, load

    folder = os.environ.get(UPSTREAM_ENV)
    try:
        if not folder and os.environ.get("TRITON_INTERPRET") == "1":
            _interpreted_triton()
        return load(Path(folder) if folder else None)
    except ImportError as error:
        return f"vLLM is not importable here ({error}) and {UPSTREAM_ENV} names no folder"
    except UpstreamError as error:
        return str(error)


def baseline_name(kernels: UpstreamKernels) -> str:
    """What the upstream cells ran, as every cell and the ADR name it."""
    if kernels.source == "installed":
        return f"vLLM {kernels.version}"
    return f"vLLM {kernels.version} (its kernel files from a wheel, behind kvquant's stand-ins)"


def upstream() -> UpstreamKernels:
    found = load_upstream()
    if isinstance(found, str):
        raise BaselineUnavailableError(found)
    return found


def sdpa_available(device: str) -> str | None:
    """Why SDPA flash cannot be timed here, or None."""
    if device != "cuda":
        return "PyTorch's SDPA flash backend runs on a CUDA device only"
    return None


def _bf16_views(
    cell: KernelCell, num_blocks: int, dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """A 16-bit cache of ``num_blocks`` pages of random data as the TRITON_ATTN backend lays it
    out (``[blocks, 2, block_size, kv heads, head_size]``, K then V in each page): K, V and the
    cache mode (unit descales, one per sequence and kv head)."""
    import torch

    s = cell.shape
    kv = torch.randn(num_blocks, 2, s.block_size, s.num_kv_heads, s.head_size, device=device)
    kv = kv.to(dtype)
    ones = torch.ones(1, dtype=torch.float32, device=device).expand(cell.batch, s.num_kv_heads)
    return kv[:, 0], kv[:, 1], {"k_descale": ones, "v_descale": ones}


def _int8_views(
    records: torch.Tensor, head_size: int, mode: Any
) -> tuple[Any, Any, dict[str, Any]]:
    """Upstream's views of its INT8 records ([blocks, block, kv heads, K codes | K scale | V codes
    | V scale]): K, V and the cache mode with the scales as fp32 views into the records."""
    import torch

    half = records.shape[-1] // 2
    floats = records.view(torch.float32)  # a record is 4-byte aligned
    cache_mode = {
        "kv_quant_mode": mode,
        "k_scale_cache": floats[..., head_size // 4],
        "v_scale_cache": floats[..., (half + head_size) // 4],
        "k_descale": None,
        "v_descale": None,
    }
    return records[..., :half], records[..., half:], cache_mode


def upstream_call(cell: KernelCell, sequences: Any, activation: torch.dtype, device: str) -> Any:
    """Upstream's kernel for ``cell`` over ``sequences`` (a kvquant `RandomSequences` of the
    cell's cache dtype, whose block table and lengths upstream reads too), and whether a CUDA
    graph can hold it: ``(fn, graphable)``."""
    import torch

    from kvquant import to_upstream_layout

    kernels = upstream()
    s = cell.shape
    cache = sequences.cache
    if cache.is_quantized:
        records = to_upstream_layout(cache)
        k, v, cache_mode = _int8_views(records, s.head_size, kernels.int8_mode)
    else:
        k, v, cache_mode = _bf16_views(cell, cache.num_blocks, activation, device)
    if cell.op == "cache_write":
        return _write(cell, kernels, k, v, cache_mode, activation, device), False
    new = 1 if cell.op == "decode" else cell.context - cell.prefix
    query = torch.randn(cell.batch * new, s.num_q_heads, s.head_size, device=device)
    query = query.to(activation)
    out = torch.empty_like(query)
    cu_seqlens_q = torch.arange(cell.batch + 1, device=device, dtype=torch.int32) * new
    split: dict[str, Any] = {}
    if cell.op == "decode":
        # The TRITON_ATTN backend's split-KV decode, with its own constants.
        from kvquant.served import MIN_LAUNCH_GRID_SIZE_2D, NUM_PAR_SOFTMAX_SEGMENTS

        threshold = MIN_LAUNCH_GRID_SIZE_2D // s.num_kv_heads
        segments = (threshold, s.num_q_heads, NUM_PAR_SOFTMAX_SEGMENTS)
        segm_max = torch.empty(segments, device=device)
        split = {
            "seq_threshold_3D": threshold,
            "num_par_softmax_segments": NUM_PAR_SOFTMAX_SEGMENTS,
            "softmax_segm_output": torch.empty(*segments, s.head_size, device=device),
            "softmax_segm_max": segm_max,
            "softmax_segm_expsum": torch.empty_like(segm_max),
        }

    def call() -> None:
        kernels.unified_attention(
            q=query,
            k=k,
            v=v,
            out=out,
            cu_seqlens_q=cu_seqlens_q,
            max_seqlen_q=new,
            seqused_k=sequences.seq_lens,
            max_seqlen_k=cell.context,
            softmax_scale=s.head_size**-0.5,
            causal=True,
            window_size=(-1, -1),
            block_table=sequences.block_table,
            softcap=0.0,
            q_descale=None,
            **split,
            **cache_mode,
        )

    return call, True


def _write(
    cell: KernelCell,
    kernels: UpstreamKernels,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_mode: dict[str, Any],
    activation: torch.dtype,
    device: str,
) -> Callable[[], None]:
    """Upstream's cache write of the cell's tokens into fresh pages, in slot order."""
    import torch

    s = cell.shape
    tokens = cell.batch * cell.context
    key = torch.randn(tokens, s.num_kv_heads, s.head_size, device=device).to(activation)
    value = torch.randn_like(key)
    slots = torch.arange(tokens, device=device)
    if "kv_quant_mode" in cache_mode:
        k_codes, v_codes = k[..., : s.head_size], v[..., : s.head_size]
        return lambda: kernels.reshape_and_cache_int8(
            key,
            value,
            k_codes,
            v_codes,
            cache_mode["k_scale_cache"],
            cache_mode["v_scale_cache"],
            slots,
            cache_mode["kv_quant_mode"],
        )
    if device != "cuda":
        # Its launcher reads the CUDA device's capability to pick a tile.
        raise BaselineUnavailableError("upstream's 16-bit cache write runs on a CUDA device only")
    unit = torch.ones(1, dtype=torch.float32, device=device)
    return lambda: kernels.reshape_and_cache_flash(key, value, k, v, slots, "auto", unit, unit)


def sdpa_call(cell: KernelCell, activation: torch.dtype, device: str) -> Callable[[], None]:
    """The cell's prefill on a dense 16-bit K and V through SDPA's flash backend."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    why = sdpa_available(device)
    if why is not None:
        raise BaselineUnavailableError(why)
    s = cell.shape
    new = cell.context - cell.prefix
    group = s.num_q_heads // s.num_kv_heads
    query = torch.randn(cell.batch, s.num_q_heads, new, s.head_size, device=device)
    query = query.to(activation)
    k, v = (
        torch.randn(cell.batch, s.num_kv_heads, cell.context, s.head_size, device=device)
        .to(activation)
        .repeat_interleave(group, dim=1)
        for _ in range(2)
    )
    mask = causal_lower_right(new, cell.context) if cell.prefix else None
    attention = torch.nn.functional.scaled_dot_product_attention

    def call() -> None:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            attention(query, k, v, attn_mask=mask, is_causal=not cell.prefix)

    return call
