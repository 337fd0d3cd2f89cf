"""The pipeline: run the stages, record each one, and always end by writing the ADRs.

Deployed twice from flows/prefect.yaml:
- `pipeline/nightly` runs every stage on a cron. A stage that fails is recorded as failed, the
  stages that do not need it still run, and the flow completes.
- `pipeline/milestone` is run by hand before a plan milestone, with `strict=True`: the same flow
  then fails if any stage or gate failed, after the ADRs are written.

Run locally with the embedded defaults: ``python -m flows.pipeline`` (what `nox -s nightly` does).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from prefect.states import State

import forkaudit
from adrkit import Record, new_run_id, update_adrs, utc_now, write_record
from flows._stage import REPO_ROOT, RunContext, failed_record, skipped_record
from flows.audit import audit_stage
from flows.correctness import correctness_stage

# Each stage, in run order, with the stages whose results it needs. A stage whose need failed is
# skipped with that reason; every other stage still runs.
STAGES: dict[str, tuple[str, ...]] = {
    "audit": (),
    "correctness": (),
}


class MilestoneGateError(Exception):
    """Raised in strict mode when a stage or a gate failed; the ADRs are written first."""


@task
def write_adrs(adr_dir: Path, results_root: Path) -> list[str]:
    """Render every generated ADR block from the latest records."""
    changed = [str(p) for p in update_adrs(adr_dir, results_root).changed]
    create_markdown_artifact(
        key="adr-update",
        markdown="\n".join(["# ADR update", "", *(f"- `{p}`" for p in changed or ["none"])]),
        description=f"{len(changed)} ADR file(s) changed",
    )
    return changed


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def _run_stage(stage: str, ctx: RunContext, params: dict[str, Any]) -> Record:
    """Run one stage flow and return its record; a crash becomes a failed record, not a crash."""
    started_at = utc_now()
    run = {"run_id": ctx.run_id, "results_root": ctx.results_root, "flow_run_id": ctx.flow_run_id}
    state: State[Record]
    if stage == "audit":
        state = audit_stage(**run, **params["audit"], return_state=True)
    elif stage == "correctness":
        state = correctness_stage(**run, **params["correctness"], return_state=True)
    else:  # STAGES and this dispatch change together
        msg = f"stage {stage!r} has no flow"
        raise ValueError(msg)
    result = state.result(raise_on_failure=False)
    if state.is_completed() and isinstance(result, Record):
        return result
    reason = _one_line(result) if isinstance(result, BaseException) else str(state.message)
    return failed_record(ctx, stage, started_at, reason)


@flow(name="pipeline", flow_run_name="{milestone}", log_prints=True)
def pipeline(
    milestone: str = "nightly",
    stages: list[str] | None = None,
    strict: bool = False,
    fork: str = forkaudit.DEFAULT_FORK,
    upstream: str = forkaudit.DEFAULT_UPSTREAM,
    scope: str | None = forkaudit.DEFAULT_SCOPE,
    correctness_full: bool = False,
    adr_dir: str = str(REPO_ROOT / "docs" / "adr"),
    results_root: str = str(REPO_ROOT / ".results"),
) -> dict[str, str]:
    """Run the selected stages (default: all), record each, and write the ADRs from the records."""
    selected = list(STAGES) if stages is None else stages
    unknown = sorted(set(selected) - set(STAGES))
    if unknown:
        msg = f"unknown stage(s) {unknown}; known stages: {list(STAGES)}"
        raise ValueError(msg)
    ctx = RunContext(new_run_id(), Path(results_root), flow_run.id)
    params: dict[str, dict[str, Any]] = {
        "audit": {"fork": fork, "upstream": upstream, "scope": scope},
        "correctness": {"full": correctness_full},
    }
    print(f"run {ctx.run_id} ({milestone}): stages {selected}")
    records: dict[str, Record] = {}
    try:
        for stage in (s for s in STAGES if s in selected):
            failed_needs = [
                need
                for need in STAGES[stage]
                if (done := records.get(need)) is not None and done.status == "failed"
            ]
            if failed_needs:
                reason = f"needs {', '.join(failed_needs)}, which failed"
                record = skipped_record(ctx, stage, reason)
            else:
                record = _run_stage(stage, ctx, params)
            write_record(ctx.results_root, record)
            records[stage] = record
            print(f"{stage}: {record.status}: {record.reason or record.summary}")
    finally:
        write_adrs(Path(adr_dir), ctx.results_root)
    failures = [f"{s}: {r.reason}" for s, r in records.items() if r.status == "failed"]
    if strict and failures:
        msg = f"milestone {milestone!r} failed: " + "; ".join(failures)
        raise MilestoneGateError(msg)
    return {stage: record.status for stage, record in records.items()}


if __name__ == "__main__":
    state = pipeline(return_state=True)
    sys.exit(0 if state.is_completed() else 1)
