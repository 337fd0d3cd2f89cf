"""Side by side on one GPU: our decode and prefill against upstream vLLM's Triton attention,
INT8 and bf16.

Run where a vLLM with the `int8_per_token_head` cache (0.32 or newer) is importable:
  python benchmarks/benchmark_upstream.py [--prefill] [--device cpu]

Upstream is called as its TRITON_ATTN backend calls it for a decode step: `unified_attention` on
the cache as the backend views it (the K and V halves of each 2 * head_size + 8 byte record, the
scales as strided fp32 views into the records), its split-KV path with 16 segments up to
`128 // num_kv_heads` sequences and its single-pass path above. Both INT8 decodes read the same
data: upstream's records are `to_upstream_layout` of our cache. Before timing, each shape checks
that the two INT8 outputs agree (relative L2, "rel diff"; both kernels compute attention over the
same dequantized values, upstream rounding P to bf16).

Shapes and timing are benchmark_decode_attention.py's: bf16 model, 32 query heads, 8 kv heads, head
size 128, block size 16, every sequence at the full context. "single": one decode per replay of a
CUDA graph (graph_ms), so both sides pay the same graph launch; "in graph": per call of a graph of
GRAPH_CALLS decodes, each over its own caches, as a decode runs inside a model's graph.
`--device cpu` runs one small shape through Triton's interpreter (TRITON_INTERPRET=1, fp16 model)
and only compares the outputs.

`--prefill`: the chunked prefill at benchmark_prefill_attention.py's shapes instead, upstream's
`unified_attention` called with each sequence's new tokens as its queries (its 2D path), both
INT8 prefills over the same data and checked to agree first; one call per graph replay.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import triton
from _shapes import (
    BATCHES,
    CONTEXTS,
    GRAPH_CALLS,
    HEAD_SIZE,
    MODEL_DTYPE,
    NUM_Q_HEADS,
    PREFILL_SHAPES,
    DecodeSetup,
    kv_bytes,
    prefill_flops,
)

from kvquant import to_upstream_layout
from kvquant.ops.prefill import plan_prefill
from kvquant.timing import graph_ms

# The backend's constants (vllm/v1/attention/backends/triton_attn.py): the split-KV path serves
# up to MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads sequences, with this many segments.
MIN_LAUNCH_GRID_SIZE_2D = 128
NUM_PAR_SOFTMAX_SEGMENTS = 16
CPU_SHAPE = (3, 100)  # batch, context: a partial last page, three sequences
CPU_PREFILL_NEW = 37  # --prefill --device cpu: new tokens of each sequence, after a partial page
# Triton's interpreter computes upstream's bf16 dots wrongly (outputs near 1e9 with Triton 3.9; our
# kernels take fp32 dots there for the same reason), so the CPU comparison runs an fp16 model.
CPU_MODEL_DTYPE = torch.float16


def _interpreted_triton_for_vllm() -> None:
    """Under Triton's interpreter: vLLM's CPU build finds no Triton CPU backend and hands its
    modules a placeholder Triton; give them the real one, whose interpreter runs the kernels."""
    utils = importlib.import_module("vllm.triton_utils")
    if not getattr(utils, "HAS_TRITON", True):
        vars(utils).update(triton=triton, tl=importlib.import_module("triton.language"))


def upstream_kernel() -> tuple[Callable[..., None], Any]:
    """vLLM's `unified_attention` and its INT8 cache mode; exits with one line if absent."""
    try:
        if os.environ.get("TRITON_INTERPRET") == "1":
            _interpreted_triton_for_vllm()
        attention = importlib.import_module("vllm.v1.attention.ops.triton_unified_attention")
        modes = importlib.import_module("vllm.v1.kv_cache_interface").KVQuantMode
        return attention.unified_attention, modes.INT8_PER_TOKEN_HEAD
    except (ImportError, AttributeError) as error:  # AttributeError: no INT8 cache yet
        sys.exit(f"benchmark_upstream: needs vLLM with the int8_per_token_head cache ({error})")


def unified_decode(
    setup: DecodeSetup, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, **cache_mode: Any
) -> Callable[[], None]:
    """Upstream's decode of ``setup``'s queries as its TRITON_ATTN backend calls it, over the
    cache views ``k`` and ``v`` ([blocks, block_size, kv heads, head]), with the backend's
    split-KV scratch sized as it sizes it. ``cache_mode``: the INT8 mode and its scale views, or
    the 16-bit cache's descales."""
    unified_attention, _ = upstream_kernel()
    num_q_heads, num_kv_heads, head_size = setup.geometry
    batch, device = setup.query.shape[0], setup.query.device
    threshold_3d = MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads
    segments = (threshold_3d, num_q_heads, NUM_PAR_SOFTMAX_SEGMENTS)
    segm_output = torch.empty(*segments, head_size, device=device)
    segm_max = torch.empty(segments, device=device)
    segm_expsum = torch.empty_like(segm_max)
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=device)

    def call() -> None:
        unified_attention(
            q=setup.query,
            k=k,
            v=v,
            out=out,
            cu_seqlens_q=cu_seqlens_q,
            max_seqlen_q=1,
            seqused_k=setup.seq_lens,
            max_seqlen_k=setup.context,
            softmax_scale=head_size**-0.5,
            causal=True,
            window_size=(-1, -1),
            block_table=setup.block_table,
            softcap=0.0,
            q_descale=None,
            seq_threshold_3D=threshold_3d,
            num_par_softmax_segments=NUM_PAR_SOFTMAX_SEGMENTS,
            softmax_segm_output=segm_output,
            softmax_segm_max=segm_max,
            softmax_segm_expsum=segm_expsum,
            **cache_mode,
        )

    return call


def bf16_cache(setup: DecodeSetup) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Upstream's view of a 16-bit cache with ``setup``'s geometry and pages (random data; timed
    only): K, V and the cache mode (unit descales, one per sequence and kv head)."""
    _, num_kv_heads, head_size = setup.geometry
    shape = (setup.cache.num_blocks, setup.cache.block_size, num_kv_heads, 2 * head_size)
    kv16 = torch.randn(shape, dtype=setup.query.dtype, device=setup.query.device)
    ones = torch.ones(1, dtype=torch.float32, device=setup.query.device)
    ones = ones.expand(setup.seq_lens.shape[0], num_kv_heads)
    return kv16[..., :head_size], kv16[..., head_size:], {"k_descale": ones, "v_descale": ones}


def bf16_decode(setup: DecodeSetup) -> Callable[[], None]:
    """Upstream's 16-bit decode with ``setup``'s geometry, block table and lengths."""
    k, v, cache_mode = bf16_cache(setup)
    return unified_decode(setup, k, v, torch.empty_like(setup.query), **cache_mode)


class SideBySide(DecodeSetup):
    """One shape's INT8 decode (``run``) and upstream's views of the same data."""

    def __init__(
        self, batch: int, context: int, device: str, model_dtype: torch.dtype = MODEL_DTYPE
    ) -> None:
        super().__init__(batch, context, torch.int8, device, model_dtype)
        _, self.int8_mode = upstream_kernel()
        # Upstream's cache: [blocks, block_size, kv heads, record], K codes | K scale | V codes |
        # V scale per record, viewed as the backend views it.
        self.records = to_upstream_layout(self.cache)
        half = self.records.shape[-1] // 2
        self.upstream_k, self.upstream_v = self.records[..., :half], self.records[..., half:]
        floats = self.records.view(torch.float32)  # a record is 4-byte aligned: 2 * half
        self.upstream_k_scale = floats[..., HEAD_SIZE // 4]
        self.upstream_v_scale = floats[..., (half + HEAD_SIZE) // 4]
        self.upstream_out = torch.empty_like(self.query)

    def int8_cache(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Upstream's view of this shape's INT8 cache: K, V and the cache mode."""
        cache_mode = {
            "kv_quant_mode": self.int8_mode,
            "k_scale_cache": self.upstream_k_scale,
            "v_scale_cache": self.upstream_v_scale,
            "k_descale": None,
            "v_descale": None,
        }
        return self.upstream_k, self.upstream_v, cache_mode

    def upstream(self, *, int8: bool) -> Callable[[], None]:
        if not int8:
            return bf16_decode(self)
        k, v, cache_mode = self.int8_cache()
        return unified_decode(self, k, v, self.upstream_out, **cache_mode)

    def rel_diff(self) -> float:
        """Relative L2 between the two INT8 decodes' outputs on this shape's shared data."""
        self.out.fill_(float("nan"))
        self.upstream_out.fill_(float("nan"))
        self.run()
        self.upstream(int8=True)()
        ours, theirs = self.out.float(), self.upstream_out.float()
        return float((ours - theirs).norm() / theirs.norm())


def times_ms(shapes: list[SideBySide]) -> list[float]:
    """ms per call of ours, upstream INT8 and upstream bf16, each captured over ``shapes``."""
    return [
        graph_ms(*(shape.run for shape in shapes)),
        graph_ms(*(shape.upstream(int8=True) for shape in shapes)),
        graph_ms(*(shape.upstream(int8=False) for shape in shapes)),
    ]


def table() -> None:
    print(
        "single: one decode per graph replay; in graph: per call of a graph of "
        f"{GRAPH_CALLS} decodes over {GRAPH_CALLS} caches (as a decode inside a model's graph)"
    )
    columns = (
        f"{'ours int8':>9} {'GB/s':>5} {'vllm int8':>9} {'GB/s':>5} {'x':>5} "
        f"{'vllm bf16':>9} {'GB/s':>5} {'x':>5}"
    )
    print(f"{'':>13} {'':>8} {'single, ms':<52} {'in graph, ms':<52}")
    print(f"{'batch':>5} {'context':>7} {'rel diff':>8} {columns} {columns}")
    for batch, context in itertools.product(BATCHES, CONTEXTS):
        shapes = [SideBySide(batch, context, "cuda") for _ in range(GRAPH_CALLS)]
        diff = shapes[0].rel_diff()
        int8_bytes = kv_bytes(batch, context, torch.int8)
        bf16_bytes = kv_bytes(batch, context, MODEL_DTYPE)
        cells = [f"{diff:>8.1e}"]
        for ours, int8, bf16 in (times_ms(shapes[:1]), times_ms(shapes)):
            cells.append(
                f"{ours:>9.3f} {int8_bytes / ours / 1e6:>5.0f} "
                f"{int8:>9.3f} {int8_bytes / int8 / 1e6:>5.0f} {int8 / ours:>4.2f}x "
                f"{bf16:>9.3f} {bf16_bytes / bf16 / 1e6:>5.0f} {bf16 / ours:>4.2f}x"
            )
        print(f"{batch:>5} {context:>7} " + " ".join(cells), flush=True)
        del shapes


class PrefillSideBySide:
    """One prefill shape over one INT8 cache: our prefill (``run``), upstream's INT8 prefill over
    its views of the same data (``upstream(int8=True)``), and upstream's bf16 prefill over a bf16
    cache of its own with the same block table and lengths (timed only)."""

    def __init__(
        self,
        batch: int,
        cached: int,
        new: int,
        device: str,
        model_dtype: torch.dtype = MODEL_DTYPE,
    ) -> None:
        self.side = SideBySide(batch, cached + new, device, model_dtype)
        self.query = torch.randn(
            batch * new, NUM_Q_HEADS, HEAD_SIZE, device=device, dtype=model_dtype
        )
        self.cu_seqlens_q = torch.arange(
            0, (batch + 1) * new, new, device=device, dtype=torch.int32
        )
        self.new, self.context = new, cached + new
        self.out = torch.empty_like(self.query)
        self.upstream_out = torch.empty_like(self.query)
        side = self.side
        self.plan = plan_prefill(
            self.query, side.cache, side.block_table, side.seq_lens, self.cu_seqlens_q,
            HEAD_SIZE**-0.5, out=self.out,
        )  # fmt: skip

    def run(self) -> None:
        self.plan.run()

    def upstream(self, *, int8: bool) -> Callable[[], None]:
        unified_attention, _ = upstream_kernel()
        side = self.side
        k, v, cache_mode = side.int8_cache() if int8 else bf16_cache(side)
        out = self.upstream_out if int8 else torch.empty_like(self.query)

        def call() -> None:
            unified_attention(
                q=self.query,
                k=k,
                v=v,
                out=out,
                cu_seqlens_q=self.cu_seqlens_q,
                max_seqlen_q=self.new,
                seqused_k=side.seq_lens,
                max_seqlen_k=self.context,
                softmax_scale=HEAD_SIZE**-0.5,
                causal=True,
                window_size=(-1, -1),
                block_table=side.block_table,
                softcap=0.0,
                q_descale=None,
                **cache_mode,
            )

        return call

    def rel_diff(self) -> float:
        """Relative L2 between the two INT8 prefills' outputs on this shape's shared data."""
        self.out.fill_(float("nan"))
        self.upstream_out.fill_(float("nan"))
        self.run()
        self.upstream(int8=True)()
        ours, theirs = self.out.float(), self.upstream_out.float()
        return float((ours - theirs).norm() / theirs.norm())


def prefill_table() -> None:
    print(
        "prefill: ms per call, one call per graph replay; TFLOP/s of the new tokens' causal FLOPs"
    )
    print(
        f"{'shape':>18} {'rel diff':>8} {'ours int8':>9} {'TFLOP/s':>7} {'vllm int8':>9} "
        f"{'x':>5} {'vllm bf16':>9} {'x':>5}"
    )
    for batch, cached, new in PREFILL_SHAPES:
        shape = PrefillSideBySide(batch, cached, new, "cuda")
        diff = shape.rel_diff()
        ours, int8, bf16 = (
            graph_ms(call)
            for call in (shape.run, shape.upstream(int8=True), shape.upstream(int8=False))
        )
        flops = prefill_flops(batch, cached, new)
        print(
            f"{f'{batch} x ({cached} + {new})':>18} {diff:>8.1e} {ours:>9.3f} "
            f"{flops / ours / 1e9:>7.0f} {int8:>9.3f} {int8 / ours:>4.2f}x {bf16:>9.3f} "
            f"{bf16 / ours:>4.2f}x",
            flush=True,
        )
        del shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: compare the outputs of one small shape in Triton's interpreter",
    )
    parser.add_argument(
        "--prefill", action="store_true", help="the chunked prefill instead of the decode"
    )
    args = parser.parse_args()
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("benchmark_upstream: --device cpu needs TRITON_INTERPRET=1 in the environment")
    upstream_kernel()  # its one-line error before any work
    version = getattr(importlib.import_module("vllm"), "__version__", "unknown")
    print(f"vllm {version}, torch {torch.__version__}")
    if args.device == "cpu":
        batch, context = CPU_SHAPE
        if args.prefill:
            cached = context - CPU_PREFILL_NEW
            shape: SideBySide | PrefillSideBySide = PrefillSideBySide(
                batch, cached, CPU_PREFILL_NEW, "cpu", CPU_MODEL_DTYPE
            )
            print(f"prefill, batch {batch} x ({cached} + {CPU_PREFILL_NEW}), fp16 model: ", end="")
        else:
            shape = SideBySide(batch, context, "cpu", CPU_MODEL_DTYPE)
            print(f"batch {batch}, context {context}, fp16 model: ", end="")
        print(f"rel diff {shape.rel_diff():.1e}")
        return
    print(torch.cuda.get_device_name())
    if args.prefill:
        prefill_table()
    else:
        table()


if __name__ == "__main__":
    main()
