"""Stage `correctness`: do kvquant's kernels match their fp32 references, on nasty inputs too?

Runs `kvquant check` in its own process: on a machine without CUDA the kernels must run in
Triton's interpreter, which is chosen when Triton is first imported, and the pipeline's own
process must keep compiled Triton for the other stages. Fills ADR 0009's correctness blocks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from prefect import flow, task

from adrkit import Record, Table, utc_now, write_record
from flows._stage import RunContext, build_record, gpu_slot, publish, tables_markdown

STAGE = "correctness"
CHECK_TIMEOUT_S = 1800


@task
def run_check(out: Path, full: bool) -> dict[str, Any]:
    """Run `kvquant check` and return its JSON; exit 1 (a failed case) still has a report."""
    command = [sys.executable, "-m", "kvquant", "check", "--json", str(out)]
    done = subprocess.run(
        [*command, *(["--full"] if full else [])],
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        check=False,
    )
    print(done.stdout)
    if done.returncode not in (0, 1) or not out.exists():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        msg = f"kvquant check exited {done.returncode}: {last}"
        raise RuntimeError(msg)
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def _error_to_tolerance(error: float, tolerance: float) -> float:
    """How much of its tolerance a case used; an exact case (tolerance 0) uses none or all."""
    if tolerance > 0:
        return error / tolerance
    return 0.0 if error == 0 else float("inf")


def correctness_record(
    ctx: RunContext, started_at: str, result: dict[str, Any], artifacts: dict[str, str]
) -> Record:
    cases, edges = result["cases"], result["edge_cases"]
    worst = max((_error_to_tolerance(c["rel_l2"], c["tolerance"]) for c in cases), default=0.0)
    edge_failures = sum(not e["passed"] for e in edges)
    passed_cases = sum(c["passed"] for c in cases)
    return build_record(
        ctx,
        STAGE,
        started_at,
        summary=(
            f"{passed_cases}/{len(cases)} kernel cases and {len(edges) - edge_failures}/"
            f"{len(edges)} edge cases pass on {result['device']} (triton {result['triton']})"
        ),
        metrics={
            "device": result["device"],
            "triton": result["triton"],
            "cases": len(cases),
            "cases_passed": passed_cases,
            "edge_cases": len(edges),
            "edge_cases_passed": len(edges) - edge_failures,
            "edge_cases_failed": edge_failures,
            "worst_error_to_tolerance": worst,
        },
        tables={
            "errors": Table(
                [
                    "kernel",
                    "dtype",
                    "head_size",
                    "block_size",
                    "gqa",
                    "rel_l2",
                    "tolerance",
                    "quant_rel_l2",
                    "verdict",
                ],
                [
                    [
                        c["kernel"],
                        c["dtype"],
                        c["head_size"],
                        c["block_size"],
                        c["gqa"],
                        c["rel_l2"],
                        c["tolerance"],
                        c["quant_rel_l2"],
                        "passed" if c["passed"] else c.get("error") or "failed",
                    ]
                    for c in cases
                ],
            ),
            "edge-cases": Table(
                ["case", "verdict", "detail"],
                [[e["name"], "passed" if e["passed"] else "failed", e["detail"]] for e in edges],
            ),
        },
        artifacts=artifacts,
    )


@flow(name="correctness", flow_run_name="correctness-{run_id}", log_prints=True)
def correctness_stage(
    run_id: str, results_root: Path, full: bool = False, flow_run_id: str | None = None
) -> Record:
    """Check every kvquant kernel against its fp32 reference, and the edge cases."""
    ctx = RunContext(run_id, Path(results_root), flow_run_id)
    with gpu_slot():
        started_at = utc_now()
        report = ctx.stage_dir(STAGE) / "check.json"
        result = run_check(report, full)
        record = correctness_record(ctx, started_at, result, {"check.json": str(report)})
    write_record(ctx.results_root, record)
    publish(record, tables_markdown(record, "kvquant correctness"), "errors")
    return record
