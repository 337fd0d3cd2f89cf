"""What kvquant's benchmarks share: the issue's geometry (bf16 model, 32 query heads, 8 kv heads,
head size 128, block size 16), the decode's batch x context grid and the chunked prefill's shapes,
the KV bytes a decode reads, `DecodeSetup`, a paged cache of random data at one shape, and the
split reducer timed alone.

The scripts import this module by name (they run from this folder) and take these from here
rather than from each other, so their imports form no cycle.
"""

from __future__ import annotations

import functools

import torch

from kvquant import DecodeConfig, DecodePlan, decode_attention, decode_config, plan_decode
from kvquant.ops._common import launch
from kvquant.ops.decode.reduce import reduce_spec
from kvquant.timing import graph_ms, paged_kv_bytes, random_sequences

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 32, 8, 128, 16
SOFTMAX_SCALE = HEAD_SIZE**-0.5
MODEL_DTYPE = torch.bfloat16
BATCHES = (1, 16, 64)
CONTEXTS = (1024, 8192, 32768)


# Decodes per graph for the "in graph" columns, each over its own cache
# (benchmark_decode_attention.py's docstring says why).
GRAPH_CALLS = 4


def kv_bytes(batch: int, context: int, cache_dtype: torch.dtype) -> int:
    return paged_kv_bytes(
        batch,
        context,
        num_kv_heads=NUM_KV_HEADS,
        head_size=HEAD_SIZE,
        block_size=BLOCK_SIZE,
        cache_dtype=cache_dtype,
    )


class DecodeSetup:
    """A paged cache of random data for `batch` sequences of `context` tokens each (the issue's
    geometry unless told another)."""

    def __init__(
        self,
        batch: int,
        context: int,
        cache_dtype: torch.dtype,
        device: str = "cuda",
        model_dtype: torch.dtype = MODEL_DTYPE,
        geometry: tuple[int, int, int] = (NUM_Q_HEADS, NUM_KV_HEADS, HEAD_SIZE),
    ) -> None:
        num_q_heads, num_kv_heads, head_size = geometry
        sequences = random_sequences(
            batch,
            context,
            num_kv_heads=num_kv_heads,
            head_size=head_size,
            block_size=BLOCK_SIZE,
            cache_dtype=cache_dtype,
            device=device,
        )
        self.cache = sequences.cache
        self.block_table = sequences.block_table
        self.seq_lens = sequences.seq_lens
        self.query = torch.randn(batch, num_q_heads, head_size, device=device, dtype=model_dtype)
        self.out = torch.empty_like(self.query)
        self.context = context
        self.geometry = geometry

    def run(self, num_splits: int | None = None, config: DecodeConfig | None = None) -> None:
        decode_attention(
            self.query,
            self.cache,
            self.block_table,
            self.seq_lens,
            SOFTMAX_SCALE,
            out=self.out,
            max_seq_len=self.context,
            validate=False,
            num_splits=num_splits,
            config=config,
        )

    def plan(self, config: DecodeConfig | None = None, num_splits: int | None = None) -> DecodePlan:
        """The plan ``run`` launches through (None: the launcher's split count)."""
        num_q_heads, num_kv_heads, head_size = self.geometry
        return plan_decode(
            num_seqs=self.query.shape[0],
            max_seq_len=self.context,
            num_q_heads=num_q_heads,
            num_kv_heads=num_kv_heads,
            head_size=head_size,
            block_size=BLOCK_SIZE,
            model_dtype=self.query.dtype,
            cache_dtype=self.cache.dtype,
            device=self.query.device,
            num_splits=num_splits,
            config=config,
        )

    def config(self) -> DecodeConfig:
        """The launch shape the decode ships with for this setup."""
        num_q_heads, num_kv_heads, head_size = self.geometry
        return decode_config(
            head_size=head_size,
            block_size=BLOCK_SIZE,
            gqa=num_q_heads // num_kv_heads,
            cache_dtype=self.cache.dtype,
            target="cuda",
        )


# Chunked prefill shapes: (batch, cached tokens, new tokens) per sequence; the new tokens are in
# the cache too, as after the step's cache write.
PREFILL_SHAPES = ((4, 2048, 2048), (4, 16384, 2048), (1, 32768, 4096), (8, 0, 2048))


def prefill_flops(batch: int, cached: int, new: int) -> float:
    """Causal FLOPs of the new tokens: Q x K and P x V over the prefix and, causally, themselves."""
    return 4 * batch * new * NUM_Q_HEADS * HEAD_SIZE * (cached + (new + 1) / 2)


def reducer_ms(out: torch.Tensor, splits: int) -> float:
    """The split reducer alone, graph-timed, on random partials of ``splits`` splits for ``out``
    ([batch, query heads, head size])."""
    batch, num_q_heads, head_size = out.shape
    reduce = reduce_spec(head_size=head_size, model_dtype=out.dtype)
    partial_acc = torch.randn(batch, num_q_heads, splits, head_size, device="cuda")
    partial_max = torch.randn(batch, num_q_heads, splits, device="cuda")
    partial_sum = torch.rand(batch, num_q_heads, splits, device="cuda") + 1
    reduce_arguments = reduce.arguments(
        out_ptr=out,
        partial_acc_ptr=partial_acc,
        partial_max_ptr=partial_max,
        partial_sum_ptr=partial_sum,
        num_splits=splits,
        head_size=head_size,
        stride_o_t=out.stride(0),
        stride_o_h=out.stride(1),
    )
    return graph_ms(functools.partial(launch, reduce, (batch, num_q_heads), reduce_arguments))


def us_text(times_ms: list[float]) -> str:
    """Times in ms as microseconds, "/"-joined."""
    return "/".join(f"{t * 1e3:.1f}" for t in times_ms)
