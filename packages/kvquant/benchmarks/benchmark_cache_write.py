"""Cache write on the H200: INT8 quantize-and-scatter vs the 16-bit copy, against copy bandwidth.

Run on a CUDA device:  python benchmarks/benchmark_cache_write.py

32k new tokens (8 kv heads, head size 128, bf16) written to consecutive slots (prefill) and to
shuffled slots. Bytes = K/V read + cache bytes written (codes and scales). Medians of CUDA-event
timings, the L2 cleared before each call (`kvquant.timing`, as kvbench's cache_write cells, which
write their slots in order).
"""

from __future__ import annotations

import functools
import sys

import torch
import triton

from kvquant import allocate_cache, cache_write
from kvquant.ops import cache_write as cache_write_module
from kvquant.timing import copy_bandwidth, median_ms, paged_kv_bytes

NUM_TOKENS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 32768, 8, 128, 16


def main() -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    copy_gbs = copy_bandwidth()
    print(f"device copy bandwidth: {copy_gbs:.0f} GB/s (read + write)")
    print(f"{'cache':>8} {'slots':>10} {'ms':>7} {'MB moved':>8} {'GB/s':>6} {'of copy':>7}")
    shape = (NUM_TOKENS, NUM_KV_HEADS, HEAD_SIZE)
    key = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    value = torch.randn_like(key)
    num_blocks = NUM_TOKENS // BLOCK_SIZE
    for cache_dtype in (torch.int8, torch.bfloat16):
        cache = allocate_cache(num_blocks, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE, cache_dtype, "cuda")
        written = paged_kv_bytes(
            1,
            NUM_TOKENS,
            num_kv_heads=NUM_KV_HEADS,
            head_size=HEAD_SIZE,
            block_size=BLOCK_SIZE,
            cache_dtype=cache_dtype,
        )
        moved = 2 * key.numel() * key.element_size() + written
        for name, slots in (
            ("in order", torch.arange(NUM_TOKENS, device="cuda")),
            ("shuffled", torch.randperm(NUM_TOKENS, device="cuda")),
        ):
            ms = median_ms(functools.partial(cache_write, cache, key, value, slots, validate=False))
            gbs = moved / ms / 1e6
            print(
                f"{str(cache_dtype).removeprefix('torch.'):>8} {name:>10} {ms:>7.3f} "
                f"{moved / 1e6:>8.1f} {gbs:>6.0f} {gbs / copy_gbs:>7.2f}"
            )


def sweep() -> None:
    """INT8 write, slots in order, for each tokens-per-program and warps setting."""
    key = torch.randn((NUM_TOKENS, NUM_KV_HEADS, HEAD_SIZE), device="cuda", dtype=torch.bfloat16)
    cache = allocate_cache(
        NUM_TOKENS // BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE, torch.int8, "cuda"
    )
    slots = torch.arange(NUM_TOKENS, device="cuda")
    for tokens in (8, 16):
        for warps in (1, 2, 4, 8):
            cache_write_module._BLOCK_TOKENS = tokens
            cache_write_module._NUM_WARPS = warps
            cache_write_module.cache_write_spec.cache_clear()
            ms = median_ms(lambda: cache_write(cache, key, key, slots, validate=False))
            print(f"tokens per program {tokens:>3}, warps {warps}: {ms:.3f} ms", flush=True)


if __name__ == "__main__":
    if "--sweep" in sys.argv:
        sweep()
    else:
        main()
