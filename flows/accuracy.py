"""Stage `accuracy`: what does the INT8 KV cache cost in accuracy?

Runs `kvbench accuracy` (paired lm-eval comparison of the 16-bit and the INT8 cache on a real
model, and the token-level divergence of the two caches on running text with its two controls)
and turns the result into a record:
- table `deltas`: one row per task metric, its verdict passed, inconclusive (the smallest delta
  it could detect exceeds the tolerance) or failed; one gate per row, |delta| within
  max(tolerance, 2 x stderr of the paired delta);
- table `divergence`: the candidate cache, the degraded control and the prefill trap, with
  llama.cpp's --kl-divergence statistics, what each must show and what it showed; gates on the
  candidate's mean KLD, same top-1 and perplexity ratio (thresholds from kvbench's config), and
  on the controls through gates.toml (`divergence_controls_failed`).
Fills ADR 0009's accuracy and divergence blocks, with the plot of the deltas and of the KLDs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task

from adrkit import Gate, Record, Scalar, Table, utc_now, write_record
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
    "detectable_delta",
    "verdict",
]
DIVERGENCE_COLUMNS = [
    "arm",
    "cache",
    "prefill",
    "attention",
    "positions",
    "mean_kld",
    "median_kld",
    "p99_kld",
    "p999_kld",
    "max_kld",
    "same_top1",
    "ppl_ratio",
    "rms_dp",
    "expected",
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


def _with_error(value: float, stderr: float) -> str:
    return f"{value:.4g} ± {stderr:.2g}"


def _divergence_row(row: dict[str, Any]) -> list[Scalar]:
    return [
        row["arm"],
        row["kv_cache_dtype"],
        "reads-cache" if row["prefill_reads_cache"] else "skips-cache",
        row["attention"],
        row["tokens"],
        _with_error(row["mean_kld"], row["mean_kld_stderr"]),
        row["median_kld"],
        row["p99_kld"],
        row["p999_kld"],
        row["max_kld"],
        _with_error(row["same_top1"], row["same_top1_stderr"]),
        _with_error(row["ppl_ratio"], row["ppl_ratio_stderr"]),
        _with_error(row["rms_dp"], row["rms_dp_stderr"]),
        row["expected"],
        row["verdict"],
    ]


def _divergence_gates(run: dict[str, Any]) -> list[Gate]:
    """The divergence gate on each candidate row, and the attention paths' agreement."""
    gate = run["gate"]
    gates = []
    for row in run["rows"]:
        if row["control"]:
            continue
        where = f"divergence {row['kv_cache_dtype']} ({row['attention']})"
        gates += [
            Gate.judge(f"{where} mean KLD", row["mean_kld"], "<=", gate["max_mean_kld"]),
            Gate.judge(f"{where} same top-1", row["same_top1"], ">=", gate["min_same_top1"]),
            Gate.judge(f"{where} PPL ratio", row["ppl_ratio"], "<=", gate["max_ppl_ratio"]),
        ]
    agreement = run["agreement"]
    if agreement is not None:
        gates.append(
            Gate.judge(
                f"divergence {run['candidate']} mean KLD, kernels - reference |difference|",
                abs(agreement["difference"]),
                "<=",
                agreement["allowed"],
            )
        )
    return gates


def _divergence_metrics(divergence: list[dict[str, Any]]) -> dict[str, Scalar]:
    """The first divergence run's candidate, on its first attention path, and its controls."""
    rows = [row for run in divergence for row in run["rows"]]
    controls = [row for row in rows if row["control"]]
    metrics: dict[str, Scalar] = {
        "divergence_controls_run": len(controls),
        "divergence_controls_failed": sum(not row["behaved"] for row in controls),
    }
    if not divergence:
        return metrics
    run = divergence[0]
    first = {row["arm"]: row for row in reversed(run["rows"])}  # each arm's first path
    candidate = first["candidate"]
    metrics |= {
        "divergence_candidate": candidate["kv_cache_dtype"],
        "divergence_attention": candidate["attention"],
        "divergence_corpus": run["corpus"],
        "divergence_positions": candidate["tokens"],
        "divergence_mean_kld": candidate["mean_kld"],
        "divergence_mean_kld_stderr": candidate["mean_kld_stderr"],
        "divergence_p99_kld": candidate["p99_kld"],
        "divergence_max_kld": candidate["max_kld"],
        "divergence_same_top1": candidate["same_top1"],
        "divergence_same_top1_stderr": candidate["same_top1_stderr"],
        "divergence_ppl_ratio": candidate["ppl_ratio"],
        "divergence_ppl_ratio_stderr": candidate["ppl_ratio_stderr"],
        "divergence_rms_dp": candidate["rms_dp"],
        "divergence_gate": candidate["verdict"],
    }
    if "degraded" in first:
        metrics |= {
            "degraded_mean_kld": first["degraded"]["mean_kld"],
            "degraded_gate": first["degraded"]["verdict"],
        }
    if "trap" in first:
        metrics |= {
            "trap_max_kld": first["trap"]["max_kld"],
            "trap_verdict": first["trap"]["verdict"],
        }
    if run["agreement"] is not None:
        metrics["divergence_paths_agree"] = run["agreement"]["agree"]
    return metrics


def accuracy_record(
    ctx: RunContext, started_at: str, result: dict[str, Any], artifacts: dict[str, str]
) -> Record:
    rows, tolerance = result["rows"], result["gate"]["tolerance"]
    divergence = result["divergence"]
    row_gates = [_row_gate(row, tolerance) for row in rows]
    verdicts = [row["verdict"] for row in rows]
    counts = {v: verdicts.count(v) for v in ("passed", "inconclusive", "failed")}
    summary = (
        f"INT8 against the 16-bit cache on {result['model']} ({result['device']}): "
        f"{len(rows)} task metrics, {counts['passed']} passed, {counts['inconclusive']} "
        f"inconclusive, {counts['failed']} failed (|delta| within max({tolerance:g}, 2 stderr))"
    )
    metrics = _divergence_metrics(divergence)
    if "divergence_mean_kld" in metrics:
        summary += (
            f"; divergence on {metrics['divergence_positions']} positions: mean KLD "
            f"{metrics['divergence_mean_kld']:.3g}, same top-1 "
            f"{metrics['divergence_same_top1']:.4f}, PPL ratio "
            f"{metrics['divergence_ppl_ratio']:.4f} ({metrics['divergence_gate']}); controls "
            f"not as expected: {metrics['divergence_controls_failed']}"
        )
    tables = {
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
                    r["detectable_delta"],
                    r["verdict"],
                ]
                for r in rows
            ],
        )
    }
    if divergence:
        tables["divergence"] = Table(
            DIVERGENCE_COLUMNS,
            [_divergence_row(row) for run in divergence for row in run["rows"]],
        )
    return build_record(
        ctx,
        STAGE,
        started_at,
        summary=summary,
        metrics={
            "model": result["model"],
            "device": result["device"],
            "rows": len(rows),
            "rows_passed": counts["passed"],
            "rows_inconclusive": counts["inconclusive"],
            "rows_failed": counts["failed"],
            "tolerance": tolerance,
            **metrics,
            "elapsed_s": round(result["elapsed_s"], 1),
        },
        tables=tables,
        gates=row_gates + [gate for run in divergence for gate in _divergence_gates(run)],
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
        plots = [result["plot"], *(run["plot"] for run in result["divergence"])]
        artifacts |= {Path(plot).name: plot for plot in plots if plot is not None}
        record = accuracy_record(ctx, started_at, result, artifacts)
    write_record(ctx.results_root, record)
    publish(record, tables_markdown(record, "INT8 KV cache accuracy"), "deltas")
    return record
