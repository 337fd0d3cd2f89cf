"""The audit's results record: what an `AuditReport` gives the pipeline's audit stage.

The record carries codes and figures, never forkaudit's English sentences (but its summary), so that
the ADR writer can say them in each ADR's language. Its tables are the report's JSON fields, by
their JSON names. The parts are `adrkit.schema`'s `RecordParts`; the pipeline makes them a record.
Its gates are empty: the audit is judged by the pipeline's own gate on ``vendor_risk_changes``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from adrkit.schema import RecordParts, Scalar, Table
from forkaudit._snapshot import LARGE_FILE_BYTES

if TYPE_CHECKING:
    from forkaudit._report import AuditReport

# A question has one row per piece of evidence (`kind` is the evidence's), or one row without.
QUESTION_COLUMNS = ["question", "answer", "kind", "subject", "change", "name", "old", "new", "path"]
# What happened to a file and how much, in a finding and in a change alike.
_CHANGE_FIELDS = ["change", "old_mode", "new_mode", "content", "lines_added", "lines_removed"]
FINDING_COLUMNS = ["stream", "path", "old_path", "area", *_CHANGE_FIELDS, "keywords", "excerpt"]
CHANGE_COLUMNS = ["status", "path", "old_path", "category", *_CHANGE_FIELDS, "streams", "origin"]
LEFT_OUT_COLUMNS = ["path", "side", "code"]
# A plugin hook: where it lives on each side, how the fork differs, what to do (`_hooks`).
HOOK_COLUMNS = [
    "symbol",
    "kind",
    "status",
    "action",
    "problem",
    "detail",
    "upstream_path",
    "upstream_line",
    "fork_path",
    "fork_line",
    "excerpt",
]
RECORD_TABLES = ("questions", "findings", "changes", "left-out", "hooks")


def write_reports(report: AuditReport, out_dir: Path) -> dict[str, str]:
    """The JSON document, the English Markdown report and the patch, in ``out_dir``; returns
    each file's name and path."""
    texts = {
        "report.json": json.dumps(report.to_dict(), indent=2) + "\n",
        "report.md": report.to_markdown("en"),
        "fork.patch": report.patch(),
    }
    for name, text in texts.items():
        (out_dir / name).write_text(text, encoding="utf-8", errors="surrogateescape")
    return {name: str(out_dir / name) for name in texts}


def record_parts(report: AuditReport, artifacts: Mapping[str, str]) -> RecordParts:
    """The audit stage's record of ``report``, naming ``artifacts`` (`write_reports`)."""
    counts, verdict = report.summary(), report.verdict()
    by_stream = verdict["risk_files_by_stream"]
    assert isinstance(by_stream, dict)
    metrics: dict[str, Scalar] = {
        "fork": _scalar(report.fork.get("spec")),
        "upstream": _scalar(report.upstream.get("spec")),
        "scope": report.scope,
        "fork_commit": _scalar(report.fork.get("commit")),
        "fork_tree": _scalar(report.fork.get("tree")),
        **{
            f"files_{kind}": _scalar(counts[kind])
            for kind in ("total", "added", "modified", "deleted", "renamed", "binary", "large")
        },
        "files_left_out": len(report.left_out),
        **{f"env_vars_{kind}": _count(report.env_vars[kind]) for kind in _ENV_VAR_CHANGES},
        # A finding is per (file, stream); the gate counts files, as a reviewer would.
        "vendor_risk_changes": _scalar(verdict["finding_files"]),
        "vendor_risk_files": _scalar(verdict["risk_files"]),
        "record_mismatch_files": _scalar(verdict["record_files"]),
        "integrity_problem_files": _scalar(verdict["integrity_files"]),
        "vendor_risk_stream_a": _scalar(by_stream["A"]),
        "vendor_risk_stream_b": _scalar(by_stream["B"]),
        "vendor_risk_stream_c": _scalar(by_stream["C"]),
        "vendor_risk_no_stream": _scalar(by_stream["none"]),
        "surprise": _scalar(verdict["surprise"]),
        "base_given": _scalar(verdict["base_given"]),
        "large_file_bytes": LARGE_FILE_BYTES,
        **_hook_metrics(report),
    }
    questions = [
        {"question": answer.question, "answer": answer.answer, **evidence}
        for answer in report.questions
        for evidence in [e.to_dict() for e in answer.evidence] or [{"kind": None}]
    ]
    tables = (
        _table(QUESTION_COLUMNS, questions),
        _table(FINDING_COLUMNS, [finding.to_dict() for finding in report.findings()]),
        _table(CHANGE_COLUMNS, [file.to_dict() for file in report.files]),
        _table(LEFT_OUT_COLUMNS, report.left_out),
        _table(HOOK_COLUMNS, [r.to_dict() for r in report.hooks.results] if report.hooks else []),
    )
    summary = str(verdict["summary"])
    if report.hooks is not None:
        summary += f"; {report.hooks.summary()}"
    return RecordParts(
        summary=summary,
        metrics=metrics,
        tables=dict(zip(RECORD_TABLES, tables, strict=True)),
        artifacts=dict(artifacts),
    )


_ENV_VAR_CHANGES = ("added", "removed", "default_changed")


def _hook_metrics(report: AuditReport) -> dict[str, Scalar]:
    """The hooks check in counts. Without a hooks file none is checked: `plugin_hooks_checked`
    is 0, which the pipeline's gate refuses, so an audit that skipped the check never passes."""
    check = report.hooks
    return {
        "plugin_hooks_release": check.release if check else None,
        "plugin_hooks_checked": len(check.results) if check else 0,
        "plugin_hooks_changed": check.count("changed") if check else 0,
        "plugin_hooks_missing": check.count("missing") if check else 0,
    }


def _count(value: object) -> int:
    assert isinstance(value, list)  # each change's names (`SemanticDiff.env_vars`)
    return len(value)


def _scalar(value: object) -> Scalar:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"{value!r} is not a JSON scalar")


def _table(columns: list[str], items: Sequence[Mapping[str, object]]) -> Table:
    """ITEMS' fields as table cells; a list, which no cell holds, is joined: a finding's changed
    lines by line breaks, keywords and streams by commas."""
    return Table(
        columns,
        [
            [
                ("\n" if column == "excerpt" else ",").join(value) or None
                if isinstance(value := item.get(column), list)
                else _scalar(value)
                for column in columns
            ]
            for item in items
        ],
    )
