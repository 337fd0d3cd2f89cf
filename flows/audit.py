"""Stage `audit`: is the vendor fork upstream vLLM, or does it carry surprise patches?

Fills ADR 0012's `audit-summary` and `audit-findings` blocks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import Task, flow, task
from prefect.client.schemas.objects import TaskRun
from prefect.states import State

import forkaudit
from adrkit import Record, Table, utc_now, write_record
from flows._stage import RunContext, build_record, publish

STAGE = "audit"


def _fetch_failed(task: Task[Any, Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Retry only a failed download: a bad ref or a corrupt repository fails the same way again."""
    try:
        state.result()
    except forkaudit.FetchError:
        return True
    except Exception:  # any other failure is final; the stage records it
        return False
    return False


@task(retries=2, retry_delay_seconds=[10, 60], retry_condition_fn=_fetch_failed)
def diff_fork(fork: str, upstream: str, scope: str | None, cache_dir: Path | None) -> Any:
    """Fetch both sides (from the package index, for pypi specs) and diff them."""
    return forkaudit.diff(fork, upstream, scope=scope, cache_dir=cache_dir)


def audit_record(
    ctx: RunContext, started_at: str, report: dict[str, Any], artifacts: dict[str, str]
) -> Record:
    """Turn forkaudit's JSON report into the stage's record."""
    summary, verdict, env = report["summary"], report["verdict"], report["env_vars"]
    findings = verdict["findings"]
    # A finding is per (file, stream); the gate counts files, as a reviewer would.
    risky_files = len({finding["path"] for finding in findings})
    fork = report.get("fork") or {}
    return build_record(
        ctx,
        STAGE,
        started_at,
        summary=verdict["summary"],
        metrics={
            "fork": fork.get("spec"),
            "upstream": (report.get("upstream") or {}).get("spec"),
            "scope": report.get("scope"),
            "fork_commit": fork.get("commit"),
            "fork_tree": fork.get("tree"),
            "files_total": summary["total"],
            "files_added": summary["added"],
            "files_modified": summary["modified"],
            "files_deleted": summary["deleted"],
            "files_renamed": summary["renamed"],
            "files_binary": summary["binary"],
            "files_left_out": len(report.get("left_out", [])),
            "env_vars_added": len(env["added"]),
            "env_vars_removed": len(env["removed"]),
            "env_vars_default_changed": len(env["default_changed"]),
            "vendor_risk_changes": risky_files,
        },
        tables={
            "findings": Table(
                ["stream", "path", "reason"],
                [[f["stream"], f["path"], f["reason"]] for f in findings],
            ),
            "changes": Table(
                ["status", "path", "area", "streams", "origin", "lines"],
                [
                    [
                        f["status"],
                        f"{f['old_path']} → {f['path']}" if f["old_path"] else f["path"],
                        f["category"],
                        ",".join(f["streams"]) or None,
                        f["origin"],
                        "binary" if f["binary"] else f"+{f['lines_added']}/-{f['lines_removed']}",
                    ]
                    for f in report["files"]
                ],
            ),
            "left-out": Table(
                ["path", "side", "reason"],
                [[f["path"], f["side"], f["reason"]] for f in report.get("left_out", [])],
            ),
        },
        artifacts=artifacts,
        fork_commit=fork.get("commit"),
        fork_tree=fork.get("tree"),
    )


@flow(name="audit", flow_run_name="audit-{run_id}", log_prints=True)
def audit_stage(
    run_id: str,
    results_root: Path,
    fork: str = forkaudit.DEFAULT_FORK,
    upstream: str = forkaudit.DEFAULT_UPSTREAM,
    scope: str | None = forkaudit.DEFAULT_SCOPE,
    cache_dir: Path | None = None,
    flow_run_id: str | None = None,
) -> Record:
    """Diff the vendor fork against upstream and judge whether it hides vendor patches."""
    ctx = RunContext(run_id, Path(results_root), flow_run_id)
    started_at = utc_now()
    report = diff_fork(fork, upstream, scope, cache_dir)
    out = ctx.stage_dir(STAGE)
    document = report.to_dict()
    (out / "report.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(report.to_markdown("en"), encoding="utf-8")
    (out / "fork.patch").write_text(report.patch(), encoding="utf-8", errors="surrogateescape")
    artifacts = {name: str(out / name) for name in ("report.json", "report.md", "fork.patch")}
    record = audit_record(ctx, started_at, document, artifacts)
    write_record(ctx.results_root, record)
    publish(record, report.to_markdown("en"), "findings")
    print(f"audit: {record.summary}")
    return record
