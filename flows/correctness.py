"""Stage `correctness`: do kvquant's kernels match their fp32 references, on nasty inputs too?

Runs `kvquant check` in its own process: on a machine without CUDA the kernels must run in
Triton's interpreter, which is chosen when Triton is first imported, and the pipeline's own
process must keep compiled Triton for the other stages. Fills ADR 0009's correctness blocks.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prefect import flow, task

from adrkit.schema import Record
from flows._stage import RunContext, run_stage
from kvquant import CorrectnessResult

STAGE = "correctness"
CHECK_TIMEOUT_S = 1800
RESULTS_NAME = "check.json"


@task
def run_check(out: Path, full: bool) -> CorrectnessResult:
    """Run `kvquant check` and read its JSON back; exit 1 (a failed case) still has a report."""
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
    return CorrectnessResult.read(out)


@flow(name="correctness", flow_run_name="correctness-{run_id}", log_prints=True)
def correctness_stage(
    run_id: str, results_root: Path, full: bool = False, flow_run_id: str | None = None
) -> Record:
    """Check every kvquant kernel against its fp32 reference, and the edge cases."""
    return run_stage(
        STAGE,
        RunContext(run_id, Path(results_root), flow_run_id),
        lambda out_dir: run_check(out_dir / RESULTS_NAME, full).record_parts(),
        title="kvquant correctness",
        table="errors",
        gpu=True,
    )
