"""Decode attention over model geometries (query heads / kv heads / head size), INT8 against
our 16-bit decode and upstream vLLM's bf16 Triton decode where vLLM imports, on a CUDA device:

  python benchmarks/benchmark_decode_geometry.py [--columns CAP...] [--pv CHOICE...]
      [--groups Q/KV...] [--num-splits S...]          the geometry table, graph and eager
  python benchmarks/benchmark_decode_geometry.py --parts [--groups Q/KV...]
      each decode split into its fixed and streaming parts, and the split reducer's share
  python benchmarks/benchmark_decode_geometry.py --profile BATCH CONTEXT [--groups Q/KV]
      a few decodes of one shape, for a profiler

Timing and inputs as benchmark_decode_attention.py's (`kvquant.timing`), whose docstring says why.
"""

# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (the @triton.jit gather kernel takes Triton tensors, which have no Python types)

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import itertools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import triton
from _shapes import (
    BLOCK_SIZE,
    GRAPH_CALLS,
    HEAD_SIZE,
    MODEL_DTYPE,
    NUM_KV_HEADS,
    NUM_Q_HEADS,
    DecodeSetup,
)

from kvquant import DecodeConfig, DecodePlan, decode_config
from kvquant.ops._common import JitLaunch
from kvquant.timing import (
    graph_ms,
    paged_kv_bytes,
    read_clear,
)


def parts_table(groups: list[tuple[int, int]]) -> None:
    """Fixed and streaming parts of our INT8 and 16-bit decodes on each of GEOMETRIES x
    GEOMETRY_SHAPES (those of ``groups`` if any), in us per call of a graph of GRAPH_CALLS
    calls over GRAPH_CALLS caches, at the shipped launch shape and split count.

    "full": the decode as --geometry's graph column times it. "1 key": every sequence cut to one
    key, with the same plan (grid, split count, reducer), so every program still runs its
    prologue and epilogue: the part that does not grow with the context. "reducer": full minus
    the same graph without the split reducer's launches, the most that combining the partials
    any other way could save (part of "1 key"). "streaming": full minus 1 key, and the KV bytes
    over it. The ratios are 16-bit over INT8; "without reducers" compares both decodes with
    their reducers removed, "INT8 without" the INT8 decode without its reducer against the
    16-bit decode with.
    """
    print(
        f"us per call of a graph of {GRAPH_CALLS} calls; full = 1 key + streaming; "
        "ratios 16-bit / INT8"
    )
    print(
        f"{'q/kv':>5} {'head':>4} {'batch x ctx':>11} {'cache':>5} {'splits':>6} {'full':>6} "
        f"{'1 key':>6} {'reducer':>7} {'streaming':>9} {'TB/s':>5}"
    )
    for geometry, (batch, context) in itertools.product(GEOMETRIES, GEOMETRY_SHAPES):
        if groups and geometry[:2] not in groups:
            continue
        parts = {}
        for cache_dtype in (torch.int8, MODEL_DTYPE):
            setups = [
                DecodeSetup(batch, context, cache_dtype, geometry=geometry)
                for _ in range(GRAPH_CALLS)
            ]
            planned = [planned_run(setup) for setup in setups]
            full = graph_ms(*[run for run, _ in planned])
            without_reducer = graph_ms(*[decode_alone(setup, plan) for setup, (_, plan) in
                                         zip(setups, planned, strict=True)])  # fmt: skip
            for setup in setups:
                setup.seq_lens.fill_(1)
            one_key = graph_ms(*[run for run, _ in planned])
            splits = planned[0][1].num_splits
            reducer = full - without_reducer
            num_bytes = paged_kv_bytes(
                batch,
                context,
                num_kv_heads=geometry[1],
                head_size=geometry[2],
                block_size=BLOCK_SIZE,
                cache_dtype=cache_dtype,
            )
            parts[cache_dtype] = (full, one_key, full - one_key, without_reducer)
            print(
                f"{geometry[0]:>2}/{geometry[1]:<2} {geometry[2]:>4} "
                f"{batch:>3} x {context // 1024:>3}k "
                f"{'int8' if cache_dtype == torch.int8 else '16b':>5} {splits:>6} "
                f"{full * 1e3:>6.1f} {one_key * 1e3:>6.1f} {reducer * 1e3:>7.1f} "
                f"{(full - one_key) * 1e3:>9.1f} {num_bytes / (full - one_key) / 1e9:>5.2f}",
                flush=True,
            )
            del setups, planned
        ratios = [b / a for a, b in zip(parts[torch.int8], parts[MODEL_DTYPE], strict=True)]
        int8_without = parts[MODEL_DTYPE][0] / parts[torch.int8][3]
        print(f"{'':>24} ratio: full {ratios[0]:.2f}x, 1 key {ratios[1]:.2f}x, "
              f"streaming {ratios[2]:.2f}x, without reducers {ratios[3]:.2f}x, "
              f"INT8 without {int8_without:.2f}x")  # fmt: skip


class _NoLaunch(JitLaunch):
    """A launcher that launches nothing."""

    takes_addresses = True

    def __init__(self) -> None:
        pass

    def __call__(self, grid: tuple[int, ...], *args: object) -> None:
        return None


def decode_alone(setup: DecodeSetup, plan: DecodePlan) -> Callable[[], object]:
    """``plan``'s decode kernel without the split reducer's launch (its output left as the
    partials): what a decode that combined its partials for free would take."""
    without_reducer = dataclasses.replace(plan, _reduce=_NoLaunch())
    run, _ = planned_run(setup, plan=without_reducer)
    return run


# (query heads, kv heads, head size): Llama-3-8B, Qwen2-7B (GQA 7), head 64, MQA, and GQA 16 on
# one and GQA 16 on two kv heads; each at both shapes (batch, context).
GEOMETRIES = ((32, 8, 128), (28, 4, 128), (32, 8, 64), (32, 1, 128), (16, 1, 128), (32, 2, 128))
GEOMETRY_SHAPES = ((32, 8192), (8, 32768))
# Calls per eager timing: back to back, round robin over GRAPH_CALLS caches, no sync between.
EAGER_CALLS = 50


def eager_ms(calls: Sequence[Callable[[], object]]) -> float:
    """Median over 5 runs of the time per call of EAGER_CALLS back-to-back calls (round robin
    over ``calls``, each over its own cache), the L2 cleared before each run: the kernels' time,
    or the host's launch path where that is slower."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        read_clear()
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for index in range(EAGER_CALLS):
            calls[index % len(calls)]()
        end.record()
        torch.cuda.synchronize()
        times.append(float(start.elapsed_time(end)) / EAGER_CALLS)
    return statistics.median(times)


def planned_run(
    setup: DecodeSetup,
    config: DecodeConfig | None = None,
    num_splits: int | None = None,
    plan: DecodePlan | None = None,
) -> tuple[Callable[[], object], DecodePlan]:
    """The decode as the vLLM plugin launches it: a DecodePlan and a scratch made once, at
    ``config``'s launch shape (None: the shipped one) and ``num_splits`` (None: the launcher's),
    or ``plan`` where given."""
    plan = plan or setup.plan(config, num_splits)
    run = functools.partial(
        plan.run,
        setup.query,
        setup.cache,
        setup.block_table,
        setup.seq_lens,
        setup.geometry[2] ** -0.5,
        out=setup.out,
        scratch=plan.new_scratch(),
    )
    return run, plan


def upstream_bf16() -> Callable[[DecodeSetup], Callable[[], None]] | None:
    """benchmark_upstream's bf16 decode of a setup, or None where vLLM is not importable."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from benchmark_upstream import bf16_decode

    return bf16_decode


@dataclass(frozen=True)
class PvChoice:
    """One INT8 decode of the geometry table (--pv): its P x V dot ("auto": the launch's
    choice, "int8", "fp16"), and for fp16 optionally a forced launch shape,
    "fp16@TILExWARPS[xSTAGES]"."""

    name: str
    fp16_pv: bool | None
    shape: tuple[int, ...] | None = None


def pv_choice(text: str) -> PvChoice:
    """--pv's argument type: auto, int8, fp16 or fp16@TILExWARPS[xSTAGES]."""
    kind, _, shape = text.partition("@")
    choices = {"auto": None, "int8": False, "fp16": True}
    if kind not in choices or (shape and kind != "fp16"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected auto, int8, fp16 or fp16@TILExWARPS[xSTAGES]"
        )
    if not shape:
        return PvChoice(text, choices[kind])
    parts = shape.split("x")
    if len(parts) not in (2, 3) or not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected fp16@TILExWARPS[xSTAGES], e.g. fp16@32x2 or fp16@64x2x4"
        )
    return PvChoice(text, True, tuple(map(int, parts)))


def group_filter(text: str) -> tuple[int, int]:
    """--groups' argument type: Q/KV, query and kv heads of rows of GEOMETRIES."""
    query, _, kv = text.partition("/")
    if not (query.isdigit() and kv.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected query/kv heads, e.g. 32/1")
    return int(query), int(kv)


def int8_config(geometry: tuple[int, int, int], cap: int, choice: PvChoice) -> DecodeConfig:
    """The INT8 decode's launch shape for a geometry row: the integer decode's column cap (0:
    none), the P x V dot ``choice`` names, and its forced launch shape if any."""
    num_q_heads, num_kv_heads, head_size = geometry
    config = decode_config(
        head_size=head_size,
        block_size=BLOCK_SIZE,
        gqa=num_q_heads // num_kv_heads,
        cache_dtype=torch.int8,
        target="cuda",
        fp16_pv=choice.fp16_pv,
        max_columns=cap,
    )
    if choice.shape is None:
        return config
    tile_n, num_warps, *stages = choice.shape
    return dataclasses.replace(
        config,
        tile_n=tile_n,
        num_warps=num_warps,
        num_stages=stages[0] if stages else config.num_stages,
    )


def geometry_table(
    column_caps: list[int],
    choices: list[PvChoice],
    groups: list[tuple[int, int]],
    split_counts: list[int],
) -> None:
    """Graph and eager time per call of our INT8 and 16-bit decodes (and upstream's bf16 where
    vLLM is importable) on each of GEOMETRIES x GEOMETRY_SHAPES (those of ``groups`` if any),
    once per cap on the integer decode's query-head columns (0: none; `_decode_columns`) and
    per choice of the INT8 decode's P x V dot (--pv) and per forced split count (--num-splits; 0:
    the launcher's, the grid's last dimension shows the count).

    "graph": per call of a graph of GRAPH_CALLS decodes over GRAPH_CALLS caches, replayed.
    "eager": per call of EAGER_CALLS back-to-back launches (`eager_ms`): through the plan as the
    plugin launches it, and ("call") through decode_attention at the same launch shape (its
    checks and plan lookup per call). The 16-bit decode takes neither
    setting: it is timed once per geometry and shape, and its figures repeat.
    """
    upstream = upstream_bf16()
    print(
        f"graph: per call of a graph of {GRAPH_CALLS} calls over {GRAPH_CALLS} caches; eager: per "
        f"call of {EAGER_CALLS} back-to-back calls; ms. upstream: "
        + ("vLLM's unified_attention, bf16" if upstream else "skipped, vLLM is not importable")
    )
    print(
        f"{'cols':>4} {'pv':>10} {'q/kv':>5} {'head':>4} {'batch x ctx':>11} {'grid':>13} "
        f"{'int8 graph':>10} {'GB/s':>5} {'eager':>6} {'call':>6} "
        f"{'16b graph':>9} {'eager':>6} {'vs 16b':>6} {'up eager':>8} {'up graph':>8} "
        f"{'int8/up':>7}"
    )
    rows = [
        (geometry, shape)
        for geometry, shape in itertools.product(GEOMETRIES, GEOMETRY_SHAPES)
        if not groups or geometry[:2] in groups
    ]
    baseline: dict[tuple[object, ...], dict[str, float]] = {}
    for cap, choice, splits in itertools.product(column_caps, choices, split_counts):
        for geometry, (batch, context) in rows:
            key = (geometry, batch, context)
            if key not in baseline:
                baseline[key] = sixteen_bit_times(geometry, batch, context, upstream)
            geometry_row(cap, choice, splits or None, geometry, batch, context, baseline[key])


def sixteen_bit_times(
    geometry: tuple[int, int, int],
    batch: int,
    context: int,
    upstream: Callable[[DecodeSetup], Callable[[], None]] | None,
) -> dict[str, float]:
    """Graph and eager ms of our 16-bit decode of one geometry row, and upstream's bf16."""
    setups = [
        DecodeSetup(batch, context, MODEL_DTYPE, geometry=geometry) for _ in range(GRAPH_CALLS)
    ]
    runs = [planned_run(setup)[0] for setup in setups]
    times = {"16b graph": graph_ms(*runs), "16b eager": eager_ms(runs)}
    if upstream is not None:
        calls = [upstream(setup) for setup in setups]
        times["up eager"], times["up graph"] = eager_ms(calls), graph_ms(*calls)
    return times


def geometry_row(
    cap: int,
    choice: PvChoice,
    num_splits: int | None,
    geometry: tuple[int, int, int],
    batch: int,
    context: int,
    baseline: dict[str, float],
) -> None:
    num_q_heads, num_kv_heads, head_size = geometry
    setups = [
        DecodeSetup(batch, context, torch.int8, geometry=geometry) for _ in range(GRAPH_CALLS)
    ]
    config = int8_config(geometry, cap, choice)
    planned = [planned_run(setup, config, num_splits) for setup in setups]
    runs = [run for run, _ in planned]
    times = dict(baseline)
    times["int8 graph"] = graph_ms(*runs)
    times["int8 eager"] = eager_ms(runs)
    calls = [functools.partial(setup.run, num_splits=num_splits, config=config) for setup in setups]
    call = f"{eager_ms(calls):>6.3f}"
    plan = planned[0][1]
    del setups, planned, runs
    per_token_head = 2 * head_size + 8
    gbs = batch * context * num_kv_heads * per_token_head / times["int8 graph"] / 1e6
    grid = "x".join(map(str, plan._decode_grid))
    pv = ("fp16" if plan.fp16_pv else "int8") + (choice.name[4:] if choice.shape else "")
    upstream_cells = (
        f"{times['up eager']:>8.3f} {times['up graph']:>8.3f} "
        f"{times['int8 eager'] / times['up eager']:>6.2f}x"
        if "up eager" in times
        else f"{'-':>8} {'-':>8} {'-':>7}"
    )
    print(
        f"{cap or 'none':>4} {pv:>10} {num_q_heads:>2}/{num_kv_heads:<2} {head_size:>4} "
        f"{batch:>3} x {context // 1024:>3}k {grid:>13} {times['int8 graph']:>10.3f} {gbs:>5.0f} "
        f"{times['int8 eager']:>6.3f} {call:>6} {times['16b graph']:>9.3f} "
        f"{times['16b eager']:>6.3f} {times['16b graph'] / times['int8 graph']:>5.2f}x "
        + upstream_cells,
        flush=True,
    )


def profile_target(batch: int, context: int, groups: Sequence[tuple[int, int]]) -> None:
    """Three INT8 and three bf16 decodes of one shape, for a profiler (ncu --launch-skip), in the
    geometry of the one ``groups`` entry (query/kv heads, head size HEAD_SIZE), else the default."""
    geometry = (*groups[0], HEAD_SIZE) if groups else (NUM_Q_HEADS, NUM_KV_HEADS, HEAD_SIZE)
    for dtype in (torch.int8, MODEL_DTYPE):
        setup = DecodeSetup(batch, context, dtype, geometry=geometry)
        for _ in range(3):
            setup.run()
        torch.cuda.synchronize()
        del setup


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--parts",
        action="store_true",
        help="split both decodes' time into the fixed and the streaming part per geometry row "
        "instead (--groups selects rows)",
    )
    parser.add_argument(
        "--columns",
        nargs="+",
        type=int,
        default=[8],
        metavar="CAP",
        help="caps on the integer INT8 decode's query-head columns to time, in turn (0: no cap)",
    )
    parser.add_argument(
        "--pv",
        nargs="+",
        type=pv_choice,
        default=[PvChoice("auto", None)],
        metavar="CHOICE",
        help="the INT8 decode's P x V dot to time, in turn: auto (the launch's choice), int8, "
        "fp16, or fp16@TILExWARPS[xSTAGES] (a forced launch shape)",
    )
    parser.add_argument(
        "--groups",
        nargs="+",
        type=group_filter,
        default=[],
        metavar="Q/KV",
        help="only the rows of these query/kv heads (e.g. 32/1 16/1); --profile: its geometry",
    )
    parser.add_argument(
        "--num-splits",
        nargs="+",
        type=int,
        default=[0],
        metavar="S",
        help="split-KV counts of the INT8 decode to time, in turn (0: the launcher's choice)",
    )
    parser.add_argument(
        "--profile",
        nargs=2,
        type=int,
        metavar=("BATCH", "CONTEXT"),
        help="run a few decodes of one shape for a profiler instead (in the one --groups "
        "geometry, if given)",
    )
    args = parser.parse_args()
    if args.profile and len(args.groups) > 1:
        parser.error("--profile takes at most one --groups entry")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    if args.profile:
        batch, context = args.profile
        profile_target(batch, context, args.groups)
    elif args.parts:
        parts_table(args.groups)
    else:
        geometry_table(args.columns, args.pv, args.groups, args.num_splits)


if __name__ == "__main__":
    main()
