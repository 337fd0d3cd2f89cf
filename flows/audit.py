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
from adrkit import Record, Scalar, Table, utc_now, write_record
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
def diff_fork(
    fork: str | None, upstream: str | None, scope: str | None, cache_dir: Path | None
) -> Any:
    """Fetch both sides (from the package index, for pypi specs) and diff them; a side left out
    is the one forkaudit's rules pin."""
    return forkaudit.diff(fork, upstream, scope=scope, cache_dir=cache_dir)


def audit_record(
    ctx: RunContext, started_at: str, report: dict[str, Any], artifacts: dict[str, str]
) -> Record:
    """Turn forkaudit's JSON report into the stage's record.

    The record carries codes and figures, never forkaudit's English sentences, so that the ADR
    writer can say them in each ADR's language (see adrkit's audit blocks).
    """
    summary, verdict, env = report["summary"], report["verdict"], report["env_vars"]
    by_stream = verdict["risk_files_by_stream"]
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
            "files_large": summary["large"],
            "files_left_out": len(report.get("left_out", [])),
            "env_vars_added": len(env["added"]),
            "env_vars_removed": len(env["removed"]),
            "env_vars_default_changed": len(env["default_changed"]),
            # A finding is per (file, stream); the gate counts files, as a reviewer would.
            "vendor_risk_changes": verdict["finding_files"],
            "vendor_risk_files": verdict["risk_files"],
            "record_mismatch_files": verdict["record_files"],
            "vendor_risk_stream_a": by_stream["A"],
            "vendor_risk_stream_b": by_stream["B"],
            "vendor_risk_stream_c": by_stream["C"],
            "vendor_risk_no_stream": by_stream["none"],
            "surprise": verdict["surprise"],
            "base_given": verdict["base_given"],
            "large_file_bytes": report["large_file_bytes"],
        },
        tables={
            "questions": Table(
                QUESTION_COLUMNS,
                [
                    _cells({**answer, **evidence}, QUESTION_COLUMNS)
                    for answer in report["questions"]
                    for evidence in answer["evidence"] or [{"kind": None}]
                ],
            ),
            "findings": Table(
                FINDING_COLUMNS, [_cells(f, FINDING_COLUMNS) for f in verdict["findings"]]
            ),
            "changes": Table(CHANGE_COLUMNS, [_cells(f, CHANGE_COLUMNS) for f in report["files"]]),
            "left-out": Table(
                LEFT_OUT_COLUMNS, [_cells(f, LEFT_OUT_COLUMNS) for f in report["left_out"]]
            ),
        },
        artifacts=artifacts,
        fork_commit=fork.get("commit"),
        fork_tree=fork.get("tree"),
    )


# The record's tables: forkaudit's JSON fields, by their JSON names. A question has one row per
# piece of evidence (`kind` is the evidence's), or one row without evidence.
QUESTION_COLUMNS = ["question", "answer", "kind", "subject", "change", "name", "old", "new", "path"]
FINDING_COLUMNS = [
    "stream",
    "path",
    "old_path",
    "area",
    "change",
    "old_mode",
    "new_mode",
    "content",
    "lines_added",
    "lines_removed",
    "keywords",
    "excerpt",
]
CHANGE_COLUMNS = [
    "status",
    "path",
    "old_path",
    "category",
    "change",
    "old_mode",
    "new_mode",
    "content",
    "lines_added",
    "lines_removed",
    "streams",
    "origin",
]
LEFT_OUT_COLUMNS = ["path", "side", "code"]


def _cells(item: dict[str, Any], columns: list[str]) -> list[Scalar]:
    """ITEM's fields as table cells; a list, which no cell holds, is joined: a finding's changed
    lines by line breaks, keywords and streams by commas."""
    return [
        ("\n" if column == "excerpt" else ",").join(value) or None
        if isinstance(value := item.get(column), list)
        else value
        for column in columns
    ]


@flow(name="audit", flow_run_name="audit-{run_id}", log_prints=True)
def audit_stage(
    run_id: str,
    results_root: Path,
    fork: str | None = None,
    upstream: str | None = None,
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
