"""Paged cache write: quantize new K/V per (token, kv head) to INT8 and scatter them into pages.

The 16-bit variant is the same kernel with quantization compiled out (QUANTIZE=False).
"""

# mypy: disable-error-code="no-untyped-def"
# (@triton.jit kernels take Triton tensors and constexprs, which have no Python types.)

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .._cache import ACTIVATION_DTYPES, PagedKVCache
from .._errors import InvalidInputError
from ._common import (
    KernelSpec,
    check_runnable,
    check_target,
    check_tensor,
    kernel_launcher,
    launch,
    make_spec,
    next_power_of_2,
    page_shift,
    pointer,
    runtime_parameters,
)
from ._paged_tiles import row_magnitudes

# Tokens and warps per program (benchmark_cache_write.py --sweep on the H200; DESIGN.md, "Cache
# write"): 16 tokens on 2 warps took 0.062 ms for 32k tokens, 4 warps 0.076, 8 warps 0.091; 8 tokens
# on 1-8 warps 0.067-0.124. The write is ALU-bound (ncu: 75% issue slots), so fewer threads per
# tile, each with more elements, win. At most the smallest block size (16), so the in-order V store
# of a tile stays within one page.
_BLOCK_TOKENS = 16
_NUM_WARPS = 2


@triton.jit
def _quantize_rows(x):
    """Per row of fp32 ``x [T, D]``: int8 codes [T, D] and fp32 scales [T], upstream's numerics.

    Padding columns must hold 0. Rows with NaN/inf get scale NaN and zero codes.

    The write is bound by instructions per element as much as by bytes (DESIGN.md, "Cache write"),
    so each step is chosen for its count: one NaN-keeping max finds both the scale and a bad row;
    the rounding works on |x| and puts the sign back last.
    """
    absmax, finite = row_magnitudes(x)
    # div_rn: IEEE division, as torch computes it; plain `/` compiles to an approximate divide.
    scale = tl.maximum(tl.math.div_rn(absmax, 127.0), 1e-6)
    inverse = tl.where(finite, tl.math.div_rn(tl.zeros_like(scale) + 1.0, scale), 0.0)
    scaled = tl.where(finite[:, None], x * inverse[:, None], 0.0)
    # Round half away from zero on the magnitude: floor, then up when the rest is >= 0.5.
    # Compared as `magnitude >= whole + 0.5` (exact), not `magnitude - whole >= 0.5`: the
    # subtraction would be fused with the multiply above into an FMA that sees the unrounded
    # product, which flipped about 0.03% of codes on the H200.
    magnitude = tl.abs(scaled)
    whole = tl.floor(magnitude)
    rounded = tl.minimum(whole + tl.where(magnitude >= whole + 0.5, 1.0, 0.0), 127.0)
    # |codes| <= 127: the scale maps absmax to 127, so -128 never occurs (upstream's clamp to
    # [-128, 127] is then the same clamp).
    codes = tl.where(scaled < 0.0, -rounded, rounded).to(tl.int8)
    return codes, tl.where(finite, scale, float("nan"))


@triton.jit(do_not_specialize=["num_tokens", "block_shift"])
def _cache_write_kernel(
    # Inputs
    key_ptr,  # [num_tokens, num_kv_heads, head_size] fp16/bf16
    value_ptr,  # [num_tokens, num_kv_heads, head_size] fp16/bf16
    slot_mapping_ptr,  # [num_tokens] int64; negative = padding, skipped
    # Outputs
    k_cache_ptr,  # [num_blocks, num_kv_heads, block_size, head_size]
    v_cache_ptr,  # [num_blocks, num_kv_heads, head_size, block_size]
    k_scale_ptr,  # [num_blocks, num_kv_heads, block_size] fp32; iff QUANTIZE, else any pointer
    v_scale_ptr,
    # Sizes and strides
    num_tokens,
    head_size,  # a multiple of 16, <= HEAD_PAD
    block_size,  # a power of two, >= 16
    block_shift,  # log2(block_size), see _common.page_shift
    stride_key_t: tl.int64,
    stride_key_h: tl.int64,
    stride_value_t: tl.int64,
    stride_value_h: tl.int64,
    stride_kc_b: tl.int64,  # all cache strides are multiples of 16 (block_size >= 16)
    stride_kc_h: tl.int64,
    stride_vc_b: tl.int64,
    stride_vc_h: tl.int64,
    stride_scale_b: tl.int64,
    stride_scale_h: tl.int64,
    HEAD_PAD: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
    QUANTIZE: tl.constexpr,
):
    token_tile = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    tokens = token_tile * BLOCK_TOKENS + tl.arange(0, BLOCK_TOKENS)  # [T]
    dims = tl.arange(0, HEAD_PAD)  # [D]
    slots = tl.load(slot_mapping_ptr + tokens, mask=tokens < num_tokens, other=-1).to(tl.int64)
    live = slots >= 0
    block = tl.where(live, slots >> block_shift, 0)
    offset = tl.where(live, slots & (block_size - 1), 0)
    mask = live[:, None] & (dims[None, :] < head_size)  # [T, D]
    # The tile fills BLOCK_TOKENS consecutive slots of one page (prefill): V can then be stored
    # as [D, T] rows of BLOCK_TOKENS bytes instead of one byte per (token, dim).
    first_slot = tl.load(slot_mapping_ptr + token_tile * BLOCK_TOKENS)
    in_order = tl.sum((slots == first_slot + tl.arange(0, BLOCK_TOKENS)).to(tl.int32), axis=0)
    in_order = (in_order == BLOCK_TOKENS) & (first_slot >= 0) & (first_slot % BLOCK_TOKENS == 0)
    # A tile of BLOCK_TOKENS (<= every block size) starting at a multiple of it stays in one page.
    in_order = in_order & ((token_tile + 1) * BLOCK_TOKENS <= num_tokens)

    tokens64 = tokens.to(tl.int64)
    key = tl.load(
        key_ptr + tokens64[:, None] * stride_key_t + head * stride_key_h + dims[None, :],
        mask=mask,
        other=0.0,
    )
    value = tl.load(
        value_ptr + tokens64[:, None] * stride_value_t + head * stride_value_h + dims[None, :],
        mask=mask,
        other=0.0,
    )
    k_page = tl.multiple_of(block * stride_kc_b + head * stride_kc_h, 16)
    k_dst = k_cache_ptr + k_page[:, None] + offset[:, None] * head_size + dims[None, :]
    v_page = tl.multiple_of(block * stride_vc_b + head * stride_vc_h, 16)
    v_dst = v_cache_ptr + v_page[:, None] + dims[None, :] * block_size + offset[:, None]
    if QUANTIZE:
        k_codes, k_scale = _quantize_rows(key.to(tl.float32))
        v_codes, v_scale = _quantize_rows(value.to(tl.float32))
        scale_dst = block * stride_scale_b + head * stride_scale_h + offset
        tl.store(k_scale_ptr + scale_dst, k_scale, mask=live)
        tl.store(v_scale_ptr + scale_dst, v_scale, mask=live)
    else:
        k_codes = key.to(k_cache_ptr.dtype.element_ty)
        v_codes = value.to(v_cache_ptr.dtype.element_ty)
    tl.store(k_dst, k_codes, mask=mask)
    if in_order:
        first_block = first_slot >> block_shift
        first_offset = tl.multiple_of(first_slot & (block_size - 1), BLOCK_TOKENS)
        v_row = first_block * stride_vc_b + head * stride_vc_h + first_offset
        v_row = tl.multiple_of(v_row, 16)
        v_rows = v_row + dims[:, None] * block_size + tl.arange(0, BLOCK_TOKENS)[None, :]
        tl.store(v_cache_ptr + v_rows, tl.trans(v_codes), mask=dims[:, None] < head_size)
    else:
        tl.store(v_dst, v_codes, mask=mask)


@functools.cache
def cache_write_spec(
    *, head_size: int, model_dtype: torch.dtype, cache_dtype: torch.dtype
) -> KernelSpec:
    """What the launcher compiles for this specialization (the same on every target)."""
    quantize = cache_dtype == torch.int8
    if not quantize and cache_dtype != model_dtype:
        raise InvalidInputError(
            f"`cache_dtype` is {cache_dtype}; a 16-bit cache takes the model dtype {model_dtype}"
        )
    # A 16-bit cache has no scales: the launcher passes its K tensor for the unused pointers.
    scale = pointer(torch.float32) if quantize else pointer(cache_dtype)
    known = {
        "key_ptr": pointer(model_dtype),
        "value_ptr": pointer(model_dtype),
        "slot_mapping_ptr": pointer(torch.int64),
        "k_cache_ptr": pointer(cache_dtype),
        "v_cache_ptr": pointer(cache_dtype),
        "k_scale_ptr": scale,
        "v_scale_ptr": scale,
        "num_tokens": "i32",
        "head_size": "i32",
        "block_size": "i32",
        "block_shift": "i32",
    }
    types = {
        name: known[name] if not name.startswith("stride_") else "i64"
        for name in runtime_parameters(_cache_write_kernel)
    }
    constexprs: dict[str, int | float | bool] = {
        "HEAD_PAD": next_power_of_2(head_size),
        "BLOCK_TOKENS": _BLOCK_TOKENS,
        "QUANTIZE": quantize,
    }
    return make_spec(
        "cache_write", _cache_write_kernel, types, constexprs, num_warps=_NUM_WARPS, num_stages=1
    )


def aot_specs(
    *,
    head_size: int,
    block_size: int,
    gqa: int,
    model_dtype: torch.dtype,
    cache_dtype: torch.dtype,
    target: str,
) -> list[KernelSpec]:
    """The kernels this module ships for one model configuration (``gqa`` does not matter here)."""
    check_target(target)
    return [
        cache_write_spec(
            head_size=head_size,
            model_dtype=model_dtype,
            cache_dtype=cache_dtype,
        )
    ]


def cache_write(
    cache: PagedKVCache,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    validate: bool = True,
    checked: bool = True,
) -> None:
    """Quantize (INT8 cache) or copy (16-bit cache) new tokens into ``cache`` in place.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_size]`` fp16/bf16; head dim contiguous.
        slot_mapping: int32/int64 ``[num_tokens]``; ``block * block_size + offset``, or negative
            for a padding token that is skipped.
        validate: check slot_mapping's range on the device first (one host sync). Turn off only
            for inputs already known good, e.g. inside a CUDA graph.
        checked: False also skips the checks of shapes, dtypes and devices, for a caller whose
            tensors are right by construction (an engine's layers).

    Without validation the write reads no tensor on the host and, given an int64 slot mapping,
    allocates nothing: a CUDA/HIP graph can capture it and be replayed with new contents of
    key, value and slot_mapping.
    """
    if checked:
        _check_write(cache, key, value, slot_mapping)
    num_tokens = key.shape[0]
    if validate and num_tokens > 0:
        num_slots = cache.num_blocks * cache.block_size
        if int(slot_mapping.max()) >= num_slots:
            raise InvalidInputError(
                f"`slot_mapping` holds {int(slot_mapping.max())}; expected < num_blocks * "
                f"block_size = {num_slots}"
            )
    check_runnable("key", key)
    if num_tokens == 0:
        return
    spec = cache_write_spec(
        head_size=cache.head_size,
        model_dtype=key.dtype,
        cache_dtype=cache.dtype,
    )
    if slot_mapping.dtype != torch.int64:  # the kernel's signature; int64 needs no copy
        slot_mapping = slot_mapping.to(torch.int64)
    grid = (-(-num_tokens // _BLOCK_TOKENS), cache.num_kv_heads)
    launcher = kernel_launcher(spec, key.device)
    if launcher.takes_addresses:
        # The compiled kernel's own launcher takes the arguments the JIT path below names, by
        # position: binding them by name on each call would cost the host about 2 us.
        # tests/test_decode_plan.py checks that the two paths pass the same.
        sizes = (num_tokens, cache.head_size, cache.block_size, page_shift(cache.block_size))
        strides = (*key.stride()[:2], *value.stride()[:2], *cache.launch_strides)
        key_ptr, value_ptr, slots_ptr = key.data_ptr(), value.data_ptr(), slot_mapping.data_ptr()
        pointers = cache.launch_pointers
        addresses = key_ptr | value_ptr | slots_ptr
        for address in pointers:
            addresses |= address
        for size in strides:
            addresses |= size
        if addresses & 15 == 0:
            launcher(grid, key_ptr, value_ptr, slots_ptr, *pointers, *sizes, *strides)
            return
    # Triton's JIT: under the interpreter, or strides the compiled variant does not assume.
    k_scale = cache.k_scale if cache.k_scale is not None else cache.k
    v_scale = cache.v_scale if cache.v_scale is not None else cache.k
    arguments = spec.arguments(
        key_ptr=key,
        value_ptr=value,
        slot_mapping_ptr=slot_mapping,
        k_cache_ptr=cache.k,
        v_cache_ptr=cache.v,
        k_scale_ptr=k_scale,
        v_scale_ptr=v_scale,
        num_tokens=num_tokens,
        head_size=cache.head_size,
        block_size=cache.block_size,
        block_shift=page_shift(cache.block_size),
        stride_key_t=key.stride(0),
        stride_key_h=key.stride(1),
        stride_value_t=value.stride(0),
        stride_value_h=value.stride(1),
        stride_kc_b=cache.k.stride(0),
        stride_kc_h=cache.k.stride(1),
        stride_vc_b=cache.v.stride(0),
        stride_vc_h=cache.v.stride(1),
        stride_scale_b=k_scale.stride(0),
        stride_scale_h=k_scale.stride(1),
    )
    launch(spec, grid, arguments)


def _check_write(
    cache: PagedKVCache, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """`cache_write`'s checks of shapes, dtypes and devices, each a one-line error."""
    device = cache.device
    num_tokens = key.shape[0] if isinstance(key, torch.Tensor) and key.dim() > 0 else 0
    shape = (num_tokens, cache.num_kv_heads, cache.head_size)
    check_tensor("key", key, dtypes=ACTIVATION_DTYPES, shape=shape, device=device)
    check_tensor("value", value, dtypes=ACTIVATION_DTYPES, shape=shape, device=device)
    check_tensor(
        "slot_mapping",
        slot_mapping,
        dtypes=(torch.int32, torch.int64),
        shape=(num_tokens,),
        device=device,
    )
    if value.dtype != key.dtype:
        raise InvalidInputError(f"`value` has dtype {value.dtype}; expected key's {key.dtype}")
    if not cache.is_quantized and (key.dtype != cache.dtype or value.dtype != cache.dtype):
        raise InvalidInputError(
            f"`key`/`value` have dtype {key.dtype}/{value.dtype}; a 16-bit cache of "
            f"{cache.dtype} takes the same dtype"
        )
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        raise InvalidInputError("`key`/`value` must have a contiguous last (head) dimension")
