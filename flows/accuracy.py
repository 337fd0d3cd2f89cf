"""Stage `accuracy`: what does the INT8 KV cache cost in accuracy?

Runs `kvbench accuracy` (paired lm-eval comparison of the 16-bit and the INT8 cache on a real
model, decode mode included) and turns its rows into a record: one gate per row, |delta| within
max(tolerance, 2 x stderr of the paired delta). Fills ADR 0009's accuracy block, with the plot of
the deltas and their 95% intervals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task

from adrkit import Gate, Record, Table, utc_now, write_record
from flows._stage import RunContext, build_record, gpu_slot, publish, tables_markdown

STAGE = "accuracy"
COLUMNS = [
    "task",
    "metric",
    "mode",
    "n",
    "baseline",
    "int8",
    "delta",
    "stderr",
    "ci95",
    "flips",
    "mcnemar_p",
    "verdict",
]


# Not log_prints: the libraries under lm-eval print whole bytecode disassemblies of the task
# code (seen in the nightly log); kvbench's own result is the record.
@task(log_prints=False)
def run_benchmark(
    out_dir: Path, config: str | None, model: str | None, device: str | None, limit: int | None
) -> dict[str, Any]:
    from kvbench.accuracy import run_accuracy

    return run_accuracy(
        Path(config) if config else None,
        model=model,
        device=device,
        limit=limit,
        out_dir=out_dir,
        progress=False,
    )


def _row_gate(row: dict[str, Any], tolerance: float) -> Gate:
    return Gate.judge(
        f"{row['task']} {row['metric']} ({row['mode']}) |delta|",
        abs(row["delta"]),
        "<=",
        max(tolerance, 2 * row["stderr"]),
    )


def accuracy_record(
    ctx: RunContext, started_at: str, result: dict[str, Any], artifacts: dict[str, str]
) -> Record:
    rows, tolerance = result["rows"], result["gate"]["tolerance"]
    gates = [_row_gate(row, tolerance) for row in rows]
    failed = sum(not gate.passed for gate in gates)
    return build_record(
        ctx,
        STAGE,
        started_at,
        summary=(
            f"INT8 against the 16-bit cache on {result['model']} ({result['device']}): "
            f"{len(rows) - failed}/{len(rows)} task metrics within max({tolerance:g}, 2 stderr)"
        ),
        metrics={
            "model": result["model"],
            "device": result["device"],
            "rows": len(rows),
            "rows_passed": len(rows) - failed,
            "tolerance": tolerance,
            "elapsed_s": round(result["elapsed_s"], 1),
        },
        tables={
            "deltas": Table(
                COLUMNS,
                [
                    [
                        r["task"],
                        r["metric"],
                        r["mode"],
                        r["n"],
                        r["baseline"],
                        r["int8"],
                        r["delta"],
                        r["stderr"],
                        f"[{r['ci_low']:.4g}, {r['ci_high']:.4g}]",
                        # Items that flipped apply to per-item pass/fail metrics only.
                        None if r["flips_up"] is None else f"+{r['flips_up']} / -{r['flips_down']}",
                        r["mcnemar_p"],
                        "passed" if gate.passed else "failed",
                    ]
                    for r, gate in zip(rows, gates, strict=True)
                ],
            )
        },
        gates=gates,
        artifacts=artifacts,
    )


@flow(name="accuracy", flow_run_name="accuracy-{run_id}", log_prints=True)
def accuracy_stage(
    run_id: str,
    results_root: Path,
    config: str | None = None,
    model: str | None = None,
    device: str | None = None,
    limit: int | None = None,
    flow_run_id: str | None = None,
) -> Record:
    """Paired lm-eval comparison of the 16-bit and the INT8 KV cache (kvbench's config by
    default: SmolLM2-135M on the CPU)."""
    ctx = RunContext(run_id, Path(results_root), flow_run_id)
    with gpu_slot():
        started_at = utc_now()
        out_dir = ctx.stage_dir(STAGE)
        result = run_benchmark(out_dir, config, model, device, limit)
        artifacts = {"accuracy.json": str(out_dir / "accuracy.json")}
        artifacts[Path(result["plot"]).name] = result["plot"]
        record = accuracy_record(ctx, started_at, result, artifacts)
    write_record(ctx.results_root, record)
    publish(record, tables_markdown(record, "INT8 KV cache accuracy"), "deltas")
    return record
