"""Eager chunked prefill through `kvquant.prefill_attention`, for A/B runs between two trees.

Run on a CUDA device, once per tree, each in its own process:
  PYTHONPATH=<tree>/packages/kvquant/src python benchmarks/benchmark_prefill_eager.py

Uses only what every version of the package has had (`prefill_attention`, `kvquant.timing`), so
it times an older tree too. Each time is the median of `kvquant.timing.median_ms` (CUDA events,
the L2 read-cleared before each call) of one call, its host checks included; two runs per cell
show the spread. Shapes and geometry are benchmark_prefill_attention.py's.
"""

from __future__ import annotations

import functools

import torch
import triton

import kvquant
from kvquant import prefill_attention
from kvquant.timing import median_ms, random_sequences

# (batch, cached tokens, new tokens), as _shapes.PREFILL_SHAPES (not imported: that module needs
# the current tree).
SHAPES = ((4, 2048, 2048), (4, 16384, 2048), (1, 32768, 4096), (8, 0, 2048))
NUM_Q_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 32, 8, 128, 16


def main() -> None:
    print(
        f"{torch.cuda.get_device_name()}, triton {triton.__version__}, kvquant {kvquant.__file__}"
    )
    print(f"{'cache':>8} {'shape':>18} {'ms':>8} {'again':>8}")
    for dtype in (torch.int8, torch.bfloat16):
        for batch, cached, new in SHAPES:
            seqs = random_sequences(
                batch,
                cached + new,
                num_kv_heads=NUM_KV_HEADS,
                head_size=HEAD_SIZE,
                block_size=BLOCK_SIZE,
                cache_dtype=dtype,
                device="cuda",
            )
            query = torch.randn(
                batch * new, NUM_Q_HEADS, HEAD_SIZE, device="cuda", dtype=torch.bfloat16
            )
            cu_seqlens_q = torch.arange(0, (batch + 1) * new, new, device="cuda", dtype=torch.int32)
            run = functools.partial(
                prefill_attention,
                query,
                seqs.cache,
                seqs.block_table,
                seqs.seq_lens,
                cu_seqlens_q,
                HEAD_SIZE**-0.5,
                out=torch.empty_like(query),
            )
            times = [median_ms(run) for _ in range(2)]
            shape = f"{batch} x ({cached} + {new})"
            name = str(dtype).removeprefix("torch.")
            print(f"{name:>8} {shape:>18} {times[0]:>8.3f} {times[1]:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
