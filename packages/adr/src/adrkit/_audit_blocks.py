"""The blocks of the fork audit (ADR 0012): the summary, with its verdict composed in the ADR's
language from the record's counts, the changed files' metrics and the gates; and the tables of
the questions answered, the vendor changes in risk areas, every changed file, the files left
out and the plugin hooks checked, each presented in words from the codes of forkaudit's report,
with every path, name and changed line quoted as code exactly as recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from adrkit._block_sources import BLOCK_SOURCES
from adrkit._labels import LABELS, label
from adrkit._markdown import (
    Markdown,
    code_cell,
    markdown_table,
    markdown_text,
    source_line,
    stage_message,
)
from adrkit._stage_renderer import Records, Renderer, render_record_table, require_record
from adrkit.schema import Record, Scalar, Table


def _gate_table(record: Record, lang: str) -> str:
    rows: list[list[Scalar]] = [
        [
            g.name,
            g.value,
            f"{g.op} {g.threshold:g}",
            label(lang, "passed" if g.passed else "failed"),
        ]
        for g in record.gates
    ]
    return markdown_table(lang, ["gate", "value", "threshold", "verdict"], rows)


def _metrics_table(record: Record, lang: str, keys: Sequence[str]) -> str:
    rows: list[list[Scalar]] = [[label(lang, k), record.metrics.get(k)] for k in keys]
    return markdown_table(lang, ["detail", "value"], rows)


_AUDIT_SUMMARY_METRICS = (
    "fork",
    "upstream",
    "scope",
    "fork_commit",
    "fork_tree",
    "files_total",
    "files_added",
    "files_modified",
    "files_deleted",
    "files_renamed",
    "files_binary",
    "files_large",
    "files_left_out",
    "env_vars_added",
    "env_vars_removed",
    "env_vars_default_changed",
    "vendor_risk_changes",
    "plugin_hooks_release",
    "plugin_hooks_checked",
    "plugin_hooks_changed",
    "plugin_hooks_missing",
)


def render_audit_summary(records: Records, lang: str) -> str:
    """ADR 0012: the verdict, in the ADR's language, and what differs, in counts."""
    record = require_record(records, BLOCK_SOURCES["audit-summary"].stage, lang)
    if isinstance(record, str):
        return record
    parts = [f"**{markdown_text(label(lang, 'verdict'))}:** {_audit_verdict(record, lang)}"]
    if record.status != "skipped" and record.metrics:
        parts += [_metrics_table(record, lang, _AUDIT_SUMMARY_METRICS), _gate_table(record, lang)]
    elif record.reason:
        parts.append(stage_message(record.reason, lang))
    parts.append(source_line(record, lang))
    return "\n\n".join(parts)


def _audit_verdict(record: Record, lang: str) -> str:
    """The verdict sentence, composed from the record's counts; a record without them (a crashed
    or skipped stage, or one written before they were recorded) shows its own summary."""
    m = record.metrics
    if not isinstance(m.get("surprise"), bool):
        return markdown_text(record.summary)
    counts = [
        label(lang, "audit-stream-count", stream=stream, count=_count(m.get(key)))
        for stream, key in (
            ("A", "vendor_risk_stream_a"),
            ("B", "vendor_risk_stream_b"),
            ("C", "vendor_risk_stream_c"),
        )
        if m.get(key)
    ]
    if m.get("vendor_risk_no_stream"):
        counts.append(
            label(lang, "audit-no-stream-count", count=_count(m["vendor_risk_no_stream"]))
        )
    record_files, integrity_files = m.get("record_mismatch_files"), m.get("integrity_problem_files")
    fields = {
        "risk": _count(m.get("vendor_risk_files")),
        "total": _count(m.get("files_total")),
        "record": (
            label(lang, "audit-record-files", count=_count(record_files)) if record_files else ""
        )
        + (
            label(lang, "audit-integrity-files", count=_count(integrity_files))
            if integrity_files
            else ""
        ),
        "streams": label(lang, "audit-list-separator").join(counts),
    }
    sentence = label(lang, "audit-surprise" if m["surprise"] else "audit-no-surprise", **fields)
    if m.get("base_given") is False:
        sentence += ("" if lang == "zh" else " ") + label(lang, "audit-no-base")
    return sentence


class _Fields(dict[str, str]):
    """Fields of a label; one a record lacks shows as a dash instead of failing the render."""

    def __missing__(self, key: str) -> str:
        return "—"


def _compose(lang: str, key: str, **fields: str) -> Markdown:
    """The label KEY with FIELDS (Markdown already) filled in."""
    return Markdown(LABELS[lang][key].format_map(_Fields(fields)))


def _word(lang: str, prefix: str, code: Scalar) -> Markdown:
    """The label of a code of forkaudit's report; an unknown code shows as code."""
    key = f"{prefix}:{code}"
    return _compose(lang, key) if key in LABELS[lang] else code_cell(str(code))


def _code_fields(row: Mapping[str, Scalar], *keys: str) -> dict[str, str]:
    return {key: code_cell(str(row[key])) for key in keys if row.get(key) is not None}


_STREAMS = frozenset({"A", "B", "C"})
_STATUSES = frozenset({"A", "M", "D", "R"})


def _known(value: Scalar, known: frozenset[str]) -> Markdown:
    """VALUE as it is when it is one of KNOWN (a stream, a git status), else as code."""
    return Markdown(value) if value in known and isinstance(value, str) else code_cell(str(value))


def _count(value: Scalar) -> str:
    """A count from a record: a whole number as it is, anything else as code."""
    is_count = isinstance(value, int) and not isinstance(value, bool)
    return str(value) if is_count else code_cell(str(value))


def _lines(cells: Sequence[str]) -> Markdown | None:
    return Markdown("<br>".join(cells)) if cells else None


def _present_questions(table: Table, lang: str) -> tuple[list[str], list[list[Scalar]]]:
    """One row per question: the question and its answer in words, then each piece of
    evidence with its file."""
    by_question: dict[Scalar, list[dict[str, Scalar]]] = {}
    for row in table.keyed_rows():
        by_question.setdefault(row["question"], []).append(row)
    rows: list[list[Scalar]] = []
    for question, evidence in by_question.items():
        shown = [
            _compose(lang, "evidence-in", what=_evidence(e, lang), path=code_cell(str(e["path"])))
            for e in evidence
            if e["kind"] is not None
        ]
        answer = _word(lang, "answer", evidence[0]["answer"])
        rows.append([_word(lang, "question", question), answer, _lines(shown)])
    return ["question", "answer", "evidence"], rows


def _evidence(row: Mapping[str, Scalar], lang: str) -> Markdown:
    """One piece of evidence in words: a fact of the semantic diff, or why a file counts."""
    if row["kind"] == "fact":
        key = f"fact:{row['subject']}:{row['change']}"
    else:
        key = f"evidence:{row['kind']}"
    if key not in LABELS[lang]:
        return code_cell(" ".join(str(row[k]) for k in ("kind", "subject", "change", "name")))
    return _compose(lang, key, **_code_fields(row, "name", "old", "new", "change"))


def _change(row: Mapping[str, Scalar], lang: str) -> Markdown:
    """What happened to a file and how much: "modified, +4/-1"; a file patched after install
    has no size of change."""
    key = f"change:{row['change']}"
    if key in LABELS[lang]:
        what = _compose(lang, key, **_code_fields(row, "old_path", "old_mode", "new_mode"))
    else:
        what = code_cell(str(row["change"]))
    if row["content"] is None:
        return what
    if row["content"] == "text":
        size = f"+{_count(row['lines_added'])}/-{_count(row['lines_removed'])}"
    else:
        size = _word(lang, "content", row["content"])
    return Markdown(what + label(lang, "audit-list-separator") + size)


def _present_findings(table: Table, lang: str) -> tuple[list[str], list[list[Scalar]]]:
    """The vendor changes in risk areas: the streams each touches, what changed, and its first
    changed lines (an ellipsis when there are more). The record has a row per stream; a change
    that touches several streams shows once."""
    streams: dict[tuple[Scalar, ...], list[str]] = {}
    for row in table.keyed_rows():
        change = tuple(v for k, v in row.items() if k != "stream")
        stream = row["stream"]
        streams.setdefault(change, []).append(
            label(lang, "audit-no-stream") if stream is None else _known(stream, _STREAMS)
        )
    rows: list[list[Scalar]] = []
    for change, touched in streams.items():
        row = dict(zip([c for c in table.columns if c != "stream"], change, strict=True))
        excerpt = str(row["excerpt"]).split("\n") if row["excerpt"] else []
        shown: list[str] = [code_cell(line) for line in excerpt]
        added, removed = row["lines_added"], row["lines_removed"]
        if isinstance(added, int) and isinstance(removed, int) and added + removed > len(excerpt):
            shown.append("…")
        rows.append(
            [
                Markdown(",".join(touched)),
                code_cell(str(row["path"])),
                code_cell(str(row["area"])),
                _change(row, lang),
                _lines(shown),
            ]
        )
    return ["streams", "path", "area", "change", "excerpt"], rows


def _present_changes(table: Table, lang: str) -> tuple[list[str], list[list[Scalar]]]:
    rows: list[list[Scalar]] = [
        [
            _known(row["status"], _STATUSES),
            code_cell(str(row["path"])),
            code_cell(str(row["category"])),
            None
            if row["streams"] is None
            else Markdown(",".join(_known(s, _STREAMS) for s in str(row["streams"]).split(","))),
            None if row["origin"] is None else _word(lang, "origin", row["origin"]),
            _change(row, lang),
        ]
        for row in table.keyed_rows()
    ]
    return ["status", "path", "area", "streams", "origin", "change"], rows


def _present_left_out(table: Table, lang: str) -> tuple[list[str], list[list[Scalar]]]:
    rows: list[list[Scalar]] = [
        [
            code_cell(str(row["path"])),
            _word(lang, "side", row["side"]),
            _word(lang, "left-out", row["code"]),
        ]
        for row in table.keyed_rows()
    ]
    return ["path", "side", "reason"], rows


def _present_hooks(table: Table, lang: str) -> tuple[list[str], list[list[Scalar]]]:
    """Each plugin hook: where it lives upstream, the fork's status (where it lives now if it
    moved, what it no longer offers, its first changed lines) and what to do."""
    rows: list[list[Scalar]] = []
    for row in table.keyed_rows():
        status = _word(lang, "hook", row["status"])
        if row["fork_path"] is not None and row["fork_path"] != row["upstream_path"]:
            where = code_cell(f"{row['fork_path']}:{row['fork_line']}")
            status = _compose(lang, "hook-moved", status=status, where=where)
        if row["problem"] is not None:
            key = f"hook-problem:{row['problem']}"
            problem = (
                _compose(lang, key, detail=code_cell(str(row["detail"])))
                if key in LABELS[lang]
                else code_cell(f"{row['problem']} {row['detail']}")
            )
            status = Markdown(status + label(lang, "audit-list-separator") + problem)
        excerpt = str(row["excerpt"]).split("\n") if row["excerpt"] else []
        shown = [status, *(code_cell(line) for line in excerpt)]
        rows.append(
            [
                code_cell(str(row["symbol"])),
                code_cell(f"{row['upstream_path']}:{row['upstream_line']}"),
                _lines(shown),
                _word(lang, "hook-action", row["action"]),
            ]
        )
    return ["symbol", "upstream_location", "fork_status", "to_do"], rows


# The columns each presenter reads (forkaudit's record parts write them).
_QUESTION_COLUMNS = frozenset(
    {"question", "answer", "kind", "subject", "change", "name", "old", "new", "path"}
)
_CHANGE_COLUMNS = frozenset(
    {"change", "old_path", "old_mode", "new_mode", "content", "lines_added", "lines_removed"}
)
_FINDING_COLUMNS = _CHANGE_COLUMNS | {"stream", "path", "area", "excerpt"}
_CHANGES_COLUMNS = _CHANGE_COLUMNS | {"status", "path", "category", "streams", "origin"}
_LEFT_OUT_COLUMNS = frozenset({"path", "side", "code"})
_HOOK_COLUMNS = frozenset(
    {
        "symbol",
        "status",
        "action",
        "problem",
        "detail",
        "upstream_path",
        "upstream_line",
        "fork_path",
        "fork_line",
        "excerpt",
    }
)


AUDIT_BLOCKS: dict[str, Renderer] = {
    "audit-summary": render_audit_summary,
    "audit-questions": render_record_table(
        "audit-questions", "no-questions", present=(_present_questions, _QUESTION_COLUMNS)
    ),
    "audit-findings": render_record_table(
        "audit-findings", "no-findings", present=(_present_findings, _FINDING_COLUMNS)
    ),
    "audit-changes": render_record_table(
        "audit-changes", "no-changes", present=(_present_changes, _CHANGES_COLUMNS)
    ),
    "audit-left-out": render_record_table(
        "audit-left-out", "nothing-left-out", present=(_present_left_out, _LEFT_OUT_COLUMNS)
    ),
    "audit-hooks": render_record_table(
        "audit-hooks", "no-hooks", present=(_present_hooks, _HOOK_COLUMNS)
    ),
}
