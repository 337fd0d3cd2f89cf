"""An engine step as the vLLM plugin serves it, timed: L layers of (cache write + attention).

A step is one batch as vLLM's scheduler mixes it (`Step`: decodes, chunked prefills, whole
prompts). Ours goes through the plugin's kernel path (`kvquant.vllm_plugin._kernels`): the step
planned once (`plan_kernel_batch`, from host copies of the lengths, as the metadata builder does),
then per layer `write_with_kernels` and `attend_with_kernels`, for the INT8 cache and for our
16-bit cache. Upstream is vLLM's own Triton backend's launches on the same batch
(`kvquant.upstream`): per layer one cache write (`triton_reshape_and_cache_flash`, or its
per-token-head INT8 variant) and one `unified_attention`, with the backend's split-KV constants.

`step_times` gives two times per step and cache: "eager", the wall clock of the step (the plan,
then every layer's launches) with one device sync per step, as vLLM runs the attention of a
mixed step between its piecewise graphs; and "graph", the same layers' launches captured once in
a CUDA graph and replayed: the device's time alone. Every layer has its own cache of random data
(INT8 codes and scales as the cache write gives them, 16-bit values N(0, 1)); the layers share
the batch's block table, as an engine's do. `benchmarks/benchmark_served_step.py` prints the
table; kvbench's kernel matrix records it.
"""

from __future__ import annotations

import itertools
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from . import AttentionGeometry, InvalidInputError, PagedKVCache, PrefillScratch, engine_pages
from .upstream import UpstreamKernels
from .vllm_plugin._kernels import (
    DecodeScratch,
    KernelBatch,
    attend_with_kernels,
    plan_kernel_batch,
    write_with_kernels,
)

# Llama-3-8B: 32 query heads, 8 kv heads, head 128; the engine's block 16; a bf16 model.
DEFAULT_GEOMETRY = "32/8/128/16/bf16"
# vLLM's Triton backend: the split-KV decode serves up to MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads
# sequences, in this many segments (its triton_attn.py).
MIN_LAUNCH_GRID_SIZE_2D = 128
NUM_PAR_SOFTMAX_SEGMENTS = 16
T = TypeVar("T")


@dataclass(frozen=True)
class Step:
    """One engine step: ``decodes`` decodes at ``decode_context`` keys each, then each chunk
    (cached keys, new tokens) a prefill request."""

    decodes: int
    decode_context: int
    chunks: tuple[tuple[int, int], ...] = ()

    @property
    def query_lens(self) -> list[int]:
        return [1] * self.decodes + [new for _, new in self.chunks]

    @property
    def seq_lens(self) -> list[int]:
        return [self.decode_context] * self.decodes + [cached + new for cached, new in self.chunks]

    @property
    def name(self) -> str:
        """In words, e.g. "64 decodes x 4k + 1 chunk (2k + 256)"."""
        parts = [f"{self.decodes} decodes x {_tokens(self.decode_context)}"] if self.decodes else []
        for (cached, new), count in _groups(self.chunks):
            noun = ("prefill" if not self.decodes else "chunk") + ("s" if count > 1 else "")
            parts.append(f"{count} {noun} ({_tokens(cached)} + {_tokens(new)})")
        return " + ".join(parts)

    @property
    def spec(self) -> str:
        """As `parse_step` reads it, e.g. "64x4096 + 1x(2048+256)"."""
        parts = [f"{self.decodes}x{self.decode_context}"] if self.decodes else []
        parts += [f"{count}x({cached}+{new})" for (cached, new), count in _groups(self.chunks)]
        return " + ".join(parts)


_DECODES = re.compile(r"(\d+)x(\d+)")
_CHUNKS = re.compile(r"(\d+)x\((\d+)\+(\d+)\)")


def parse_step(text: str) -> Step:
    """A step from its spec: terms joined by "+", each "DxC" (D decodes of C keys; at most one,
    first) or "Nx(P+Q)" (N prefill requests of P cached keys and Q new tokens), e.g.
    "64x4096 + 1x(2048+256)" or "4x(0+2048)".

    Raises:
        InvalidInputError: the text is no such spec, or the step holds no request.
    """
    terms = re.split(r"\+(?![^(]*\))", text.replace(" ", ""))
    decodes = context = 0
    chunks: list[tuple[int, int]] = []
    for index, term in enumerate(terms):
        plain, chunk = _DECODES.fullmatch(term), _CHUNKS.fullmatch(term)
        if plain and index == 0:
            decodes, context = int(plain[1]), int(plain[2])
        elif chunk:
            chunks += [(int(chunk[2]), int(chunk[3]))] * int(chunk[1])
        else:
            raise InvalidInputError(
                f"step {text!r}: expected decodes DxC then prefills Nx(P+Q) joined by '+', "
                "e.g. '64x4096 + 1x(2048+256)'"
            )
    if (not decodes and not chunks) or (decodes and not context):
        raise InvalidInputError(f"step {text!r}: no request, or decodes of no key")
    if any(new < 1 for _, new in chunks):
        raise InvalidInputError(f"step {text!r}: a prefill with no new token")
    return Step(decodes, context, tuple(chunks))


def _tokens(count: int) -> str:
    return f"{count // 1024}k" if count and count % 1024 == 0 else str(count)


def _groups(chunks: tuple[tuple[int, int], ...]) -> list[tuple[tuple[int, int], int]]:
    """Runs of equal chunks, in order: ((cached, new), how many)."""
    return [(chunk, len(list(run))) for chunk, run in itertools.groupby(chunks)]


STEPS = tuple(
    parse_step(spec)
    for spec in (
        "64x4096",
        "64x4096 + 1x(2048+256)",
        "32x4096 + 2x(1024+1024)",
        "128x1024 + 1x(0+512)",
        "4x(0+2048)",
        "16x8192 + 4x(4096+128)",
        "8x32768 + 1x(16384+512)",
        "256x1024",
    )
)
CPU_STEP = parse_step("2x100 + 1x(63+37)")


def parse_geometry(text: str) -> AttentionGeometry:
    """ "q heads/kv heads/head size/block size/model dtype", e.g. "32/8/128/16/bf16", with an
    INT8 cache.

    Raises:
        InvalidInputError: the text is not five such fields, or kvquant serves no such geometry.
    """
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    fields = text.split("/")
    if len(fields) != 5 or not all(f.isdigit() for f in fields[:4]) or fields[4] not in dtypes:
        raise InvalidInputError(
            f"geometry {text!r}: expected q/kv/head/block/dtype (bf16 or fp16), e.g. "
            f"{DEFAULT_GEOMETRY}"
        )
    q, kv, head, block = map(int, fields[:4])
    geometry = AttentionGeometry(q, kv, head, block, dtypes[fields[4]], torch.int8)
    geometry.check()
    return geometry


class Batch:
    """One step's batch on the device: block table, lengths, query, new keys and their slots."""

    def __init__(self, step: Step, geometry: AttentionGeometry, device: torch.device) -> None:
        block = geometry.block_size
        self.step = step
        lens = step.seq_lens
        pages = [-(-n // block) for n in lens]
        self.num_blocks = sum(pages) + 1
        order = torch.randperm(self.num_blocks - 1) + 1  # page 0 is the padding's
        table = torch.zeros(len(lens), max(pages, default=1), dtype=torch.int32)
        used, slots = 0, []
        for i, (n, q) in enumerate(zip(lens, step.query_lens, strict=True)):
            table[i, : pages[i]] = order[used : used + pages[i]]
            used += pages[i]
            positions = torch.arange(n - q, n)
            slots.append(table[i].long()[positions // block] * block + positions % block)
        self.query_start_loc = torch.tensor([0, *step.query_lens]).cumsum(0).int()
        self.seq_lens_host = torch.tensor(lens, dtype=torch.int32)
        self.block_table = table.to(device)
        self.seq_lens = self.seq_lens_host.to(device)
        self.slot_mapping = torch.cat(slots).to(device) if slots else torch.zeros(0).long()
        tokens = int(self.query_start_loc[-1])
        dtype = geometry.model_dtype
        self.query = torch.randn(tokens, geometry.num_q_heads, geometry.head_size, dtype=dtype,
                                 device=device)  # fmt: skip
        self.key = torch.randn(tokens, geometry.num_kv_heads, geometry.head_size, dtype=dtype,
                               device=device)  # fmt: skip
        self.value = torch.randn_like(self.key)
        self.out = torch.empty_like(self.query)
        self.cu_seqlens_q = self.query_start_loc.to(device)
        self.max_seq_len = max(lens, default=1)
        self.max_query_len = max(step.query_lens, default=1)


def ours(
    batch: Batch, geometry: AttentionGeometry, cache_dtype: torch.dtype, layers: int
) -> tuple[Callable[[], KernelBatch], Callable[[KernelBatch], None]]:
    """(plan, layers): the plugin's per-step build and every layer's launches, over ``layers``
    caches of ``cache_dtype``."""
    from kvquant import allocate_cache

    device = batch.block_table.device
    geometry = AttentionGeometry(
        geometry.num_q_heads, geometry.num_kv_heads, geometry.head_size, geometry.block_size,
        geometry.model_dtype, cache_dtype,
    )  # fmt: skip
    caches = []
    for _ in range(layers):
        cache = allocate_cache(
            batch.num_blocks, geometry.num_kv_heads, geometry.head_size, geometry.block_size,
            cache_dtype, device,
        )  # fmt: skip
        fill_random(cache)
        caches.append(cache)
    decode_scratch = DecodeScratch(device)
    tokens = int(batch.query_start_loc[-1])
    prefill_scratch = None
    if cache_dtype == torch.int8:
        capacity = engine_pages(
            max_tokens=max(tokens, 1), max_seqs=len(batch.step.seq_lens),
            max_seq_len=batch.max_seq_len,
        )  # fmt: skip
        prefill_scratch = PrefillScratch(
            num_kv_heads=geometry.num_kv_heads, head_size=geometry.head_size, capacity=capacity,
            device=device,
        )  # fmt: skip
    scale = geometry.head_size**-0.5

    def plan() -> KernelBatch:
        return plan_kernel_batch(
            geometry, batch.query_start_loc, batch.seq_lens_host, batch.seq_lens,
            batch.block_table, batch.max_seq_len, decode_scratch=decode_scratch,
            prefill_scratch=prefill_scratch,
        )  # fmt: skip

    def run_layers(planned: KernelBatch) -> None:
        for cache in caches:
            write_with_kernels(cache, batch.key, batch.value, batch.slot_mapping)
            attend_with_kernels(batch.query, cache, planned, scale, batch.out)

    return plan, run_layers


def fill_random(cache: PagedKVCache) -> None:
    """Random data as the cache write leaves it: codes in [-127, 127], positive scales."""
    if cache.is_quantized:
        cache.k.copy_(torch.randint_like(cache.k, -127, 128))
        cache.v.copy_(torch.randint_like(cache.v, -127, 128))
        assert cache.k_scale is not None and cache.v_scale is not None
        cache.k_scale.copy_(torch.rand_like(cache.k_scale) * 0.05 + 1e-3)
        cache.v_scale.copy_(torch.rand_like(cache.v_scale) * 0.05 + 1e-3)
    else:
        cache.k.normal_()
        cache.v.normal_()


def upstream(
    batch: Batch, geometry: AttentionGeometry, kernels: UpstreamKernels, int8: bool, layers: int
) -> tuple[Callable[[], None], Callable[[None], None]]:
    """(plan, layers): vLLM's Triton backend's per-layer launches over ``layers`` caches in its
    own layout (``[blocks, block, kv heads, head]`` views of each layer's tensor)."""
    device = batch.block_table.device
    heads, head = geometry.num_kv_heads, geometry.head_size
    record = 2 * head + 8 if int8 else 2 * head  # INT8: K codes | K scale | V codes | V scale
    dtype = torch.int8 if int8 else geometry.model_dtype
    tensors = []
    for _ in range(layers):
        tensor = torch.empty(batch.num_blocks, geometry.block_size, heads, record, dtype=dtype,
                             device=device)  # fmt: skip
        if int8:
            tensor.copy_(torch.randint_like(tensor, -127, 128))
            scales = tensor.view(torch.float32)
            for column in (head // 4, (record // 2 + head) // 4):
                scales[..., column].copy_(torch.rand_like(scales[..., column]) * 0.05 + 1e-3)
        else:
            tensor.normal_()
        tensors.append(tensor)
    half = record // 2
    threshold = MIN_LAUNCH_GRID_SIZE_2D // heads
    segments = (threshold, geometry.num_q_heads, NUM_PAR_SOFTMAX_SEGMENTS)
    segm_output = torch.empty(*segments, head, device=device)
    segm_max = torch.empty(segments, device=device)
    segm_expsum = torch.empty_like(segm_max)
    ones = torch.ones(1, dtype=torch.float32, device=device)
    num_seqs = len(batch.step.seq_lens)
    descales = ones.expand(num_seqs, heads)
    scale = head**-0.5

    def run_layers(_: None) -> None:
        for tensor in tensors:
            k, v = tensor[..., :half], tensor[..., half:]
            if int8:
                floats = tensor.view(torch.float32)
                k_scale, v_scale = floats[..., head // 4], floats[..., (half + head) // 4]
                kernels.reshape_and_cache_int8(
                    batch.key, batch.value, k, v, k_scale, v_scale, batch.slot_mapping,
                    kv_quant_mode=kernels.int8_mode,
                )  # fmt: skip
                mode = {"kv_quant_mode": kernels.int8_mode, "k_scale_cache": k_scale,
                        "v_scale_cache": v_scale, "k_descale": None, "v_descale": None}  # fmt: skip
            else:
                kernels.reshape_and_cache_flash(
                    batch.key, batch.value, k, v, batch.slot_mapping, "auto", ones, ones
                )
                mode = {"k_descale": descales, "v_descale": descales}
            kernels.unified_attention(
                q=batch.query, k=k, v=v, out=batch.out, cu_seqlens_q=batch.cu_seqlens_q,
                max_seqlen_q=batch.max_query_len, seqused_k=batch.seq_lens,
                max_seqlen_k=batch.max_seq_len, softmax_scale=scale, causal=True,
                window_size=(-1, -1), block_table=batch.block_table, softcap=0.0,
                q_descale=None, seq_threshold_3D=threshold,
                num_par_softmax_segments=NUM_PAR_SOFTMAX_SEGMENTS,
                softmax_segm_output=segm_output, softmax_segm_max=segm_max,
                softmax_segm_expsum=segm_expsum, **mode,
            )  # fmt: skip

    def plan() -> None:
        return None

    return plan, run_layers


@dataclass(frozen=True)
class StepTimes:
    """ms per step: eager (wall clock, one sync), graph (replays of the layers captured once;
    None on the CPU or where the launches cannot be captured), and of the eager step the host's
    own time: planning the step, and issuing every layer's launches."""

    eager: float
    graph: float | None
    plan: float
    issue: float


def step_times(plan: Callable[[], T], layers: Callable[[T], None], steps: int,
               device: torch.device, warmups: int = 3) -> StepTimes:  # fmt: skip
    """The medians of ``steps`` synced steps, then of as many replays of the layers captured
    once."""
    for _ in range(warmups):  # compile, make launchers, warm the allocator
        layers(plan())
    _sync(device)
    eager, planning, issuing = [], [], []
    for _ in range(steps):
        started = time.perf_counter()
        planned = plan()
        planned_at = time.perf_counter()
        layers(planned)
        issued_at = time.perf_counter()
        _sync(device)
        eager.append((time.perf_counter() - started) * 1e3)
        planning.append((planned_at - started) * 1e3)
        issuing.append((issued_at - planned_at) * 1e3)
    median = statistics.median
    host = (median(eager), median(planning), median(issuing))
    if device.type != "cuda":
        return StepTimes(host[0], None, *host[1:])
    planned = plan()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layers(planned)  # launchers made on the capture's stream
    torch.cuda.current_stream().wait_stream(stream)
    try:
        with torch.cuda.graph(graph):
            layers(planned)
    except RuntimeError as error:  # a launch path that cannot be captured
        print(f"  (graph not captured: {str(error).splitlines()[0]})")
        return StepTimes(host[0], None, *host[1:])
    replays = []
    for _ in range(steps):
        torch.cuda.synchronize()
        started = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        replays.append((time.perf_counter() - started) * 1e3)
    return StepTimes(host[0], median(replays), *host[1:])


def time_ours(batch: Batch, geometry: AttentionGeometry, cache_dtype: torch.dtype, layers: int,
              steps: int) -> StepTimes:  # fmt: skip
    """Our step over ``layers`` caches of ``cache_dtype`` (`ours`), timed (`step_times`); the
    caches are freed before it returns."""
    device = batch.block_table.device
    times = step_times(*ours(batch, geometry, cache_dtype, layers), steps, device)
    _release(device)
    return times


def time_upstream(batch: Batch, geometry: AttentionGeometry, kernels: UpstreamKernels,
                  int8: bool, layers: int, steps: int) -> StepTimes:  # fmt: skip
    """Upstream's step (`upstream`), timed as ours is."""
    device = batch.block_table.device
    times = step_times(*upstream(batch, geometry, kernels, int8, layers), steps, device)
    _release(device)
    return times


def _release(device: torch.device) -> None:
    """Hand the step's caches back, so that the next step's fit (32 layers at 32k take GiBs)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
