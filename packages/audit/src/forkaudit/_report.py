"""The audit's result: the JSON document, the Markdown report (English or Chinese) and the patch."""

import os
from dataclasses import dataclass, field

from forkaudit._rules import STREAMS, Group, Rules

# Streams of a post-install patch outside every stream's areas.
NO_STREAM = "-"

_LABELS = {
    "en": {
        "fork": "Fork",
        "upstream": "Upstream",
        "base": "Base",
        "scope": "Scope",
        "verdict": "Verdict",
        "stream": "Stream",
        "summary": "Summary",
        "by_area": "Changes by area",
        "other": "Other changes",
        "ignored": "Ignored changes",
        "env_vars": "Environment variables",
        "semantic": "Semantic changes",
        "left_out": "Left out of the diff",
        "record": "Files that do not match their RECORD hash",
        "history": "History",
        "file": "File",
        "status": "Status",
        "lines": "Lines",
        "origin": "Origin",
        "keywords": "Keywords",
        "reason": "Reason",
        "side": "Side",
        "count": "Count",
        "none": "none",
        "added": "added",
        "removed": "removed",
        "default_changed": "default changed",
        "cache_dtypes": "KV-cache dtypes (CacheDType)",
        "backends": "Attention backends",
        "backend_dtypes": "Supported KV-cache dtypes per backend",
        "total": "total",
        "modified": "modified",
        "deleted": "deleted",
        "renamed": "renamed",
        "binary": "binary",
        "no_findings": "No vendor change falls in a risk area.",
    },
    "zh": {
        "fork": "厂商分支",
        "upstream": "上游",
        "base": "真实基线",
        "scope": "范围",
        "verdict": "结论",
        "stream": "工作流",
        "summary": "概要",
        "by_area": "按领域分类的改动",
        "other": "其他改动",
        "ignored": "已忽略的改动",
        "env_vars": "环境变量",
        "semantic": "语义改动",
        "left_out": "未纳入比较的文件",
        "record": "与 RECORD 哈希不符的文件",
        "history": "提交历史",
        "file": "文件",
        "status": "状态",
        "lines": "行数",
        "origin": "来源",
        "keywords": "关键词",
        "reason": "原因",
        "side": "一侧",
        "count": "数量",
        "none": "无",
        "added": "新增",
        "removed": "删除",
        "default_changed": "默认值改变",
        "cache_dtypes": "KV 缓存数据类型 (CacheDType)",
        "backends": "注意力后端",
        "backend_dtypes": "各后端支持的 KV 缓存数据类型",
        "total": "总计",
        "modified": "修改",
        "deleted": "删除",
        "renamed": "重命名",
        "binary": "二进制",
        "no_findings": "没有任何厂商改动落在风险领域。",
    },
}


@dataclass
class FileReport:
    """One changed file as the report shows it."""

    path: str
    old_path: str | None
    status: str
    old_mode: str | None
    new_mode: str | None
    similarity: int | None
    binary: bool
    lines_added: int | None
    lines_removed: int | None
    category: str
    group: Group | None
    labels: list[str]
    streams: list[str]
    risk: bool
    keywords: list[str]
    origin: str | None
    ignored_by: str | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "old_path": self.old_path,
            "status": self.status,
            "old_mode": self.old_mode,
            "new_mode": self.new_mode,
            "similarity": self.similarity,
            "binary": self.binary,
            "lines_added": self.lines_added,
            "lines_removed": self.lines_removed,
            "category": self.category,
            "group": self.group.title_path() if self.group else None,
            "labels": self.labels,
            "streams": self.streams,
            "risk": self.risk,
            "keywords": self.keywords,
            "origin": self.origin,
            "ignored": self.ignored_by is not None,
            "ignored_by": self.ignored_by,
            "notes": self.notes,
        }

    def reason(self) -> str:
        """One line: what changed, where, and what the semantic diff and keywords add."""
        if self.status == "R":
            what = f"renamed from {self.old_path}"
        elif self.status == "M" and self.old_mode != self.new_mode:
            what = f"mode {self.old_mode} -> {self.new_mode}"
        else:
            what = {"A": "added", "D": "deleted", "M": "modified"}[self.status]
        size = "binary" if self.binary else f"+{self.lines_added}/-{self.lines_removed}"
        parts = [f"{what} in {self.category} ({size})", *self.notes]
        if self.keywords:
            parts.append("keywords: " + ", ".join(self.keywords))
        return "; ".join(parts)


@dataclass
class AuditReport:
    """Everything one `forkaudit diff` found; `to_dict()` is the CLI's JSON document."""

    rules: Rules
    scope: str | None
    fork: dict[str, object]
    upstream: dict[str, object]
    base: dict[str, object] | None
    files: list[FileReport]
    left_out: list[dict[str, str]]
    record_mismatches: dict[str, list[dict[str, str]]]
    env_vars: dict[str, object]
    semantic: dict[str, object]
    history: dict[str, object]
    patch_bytes: bytes

    def patch(self) -> str:
        """The full unified patch (with binary hunks), upstream to fork, as `git diff -M`."""
        return self.patch_bytes.decode("utf-8", "surrogateescape")

    def summary(self) -> dict[str, object]:
        counted = [f for f in self.files if f.ignored_by is None]
        by_area: dict[str, int] = {}
        by_origin: dict[str, int] = {}
        for f in counted:
            by_area[f.category] = by_area.get(f.category, 0) + 1
            by_origin[f.origin or "unknown"] = by_origin.get(f.origin or "unknown", 0) + 1
        return {
            "total": len(counted),
            "added": sum(f.status == "A" for f in counted),
            "modified": sum(f.status == "M" for f in counted),
            "deleted": sum(f.status == "D" for f in counted),
            "renamed": sum(f.status == "R" for f in counted),
            "binary": sum(f.binary for f in counted),
            "lines_added": sum(f.lines_added or 0 for f in counted),
            "lines_removed": sum(f.lines_removed or 0 for f in counted),
            "ignored": len(self.files) - len(counted),
            "left_out": len(self.left_out),
            "by_area": dict(sorted(by_area.items())),
            "by_origin": dict(sorted(by_origin.items())),
        }

    def verdict(self) -> dict[str, object]:
        """Surprise unless no vendor change (or unattributed change) falls in a risk area.

        Without a base, a change cannot be told from upstream drift, so it counts as the
        vendor's. A fork file that does not match its RECORD hash is always a finding.
        """
        findings = [
            {"stream": stream, "path": f.path, "area": f.category, "reason": f.reason()}
            for f in self.files
            if f.ignored_by is None and f.risk and f.origin != "upstream-drift"
            for stream in f.streams
        ]
        for mismatch in self.record_mismatches.get("fork", []):
            classification = self.rules.classify(mismatch["path"])
            for stream in classification.streams or (NO_STREAM,):
                findings.append(
                    {
                        "stream": stream,
                        "path": mismatch["path"],
                        "area": classification.area,
                        "reason": f"patched after install: {mismatch['problem']}",
                    }
                )
        total = self.summary()["total"]
        paths = {str(f["path"]) for f in findings}
        per_stream = {s: sum(f["stream"] == s for f in findings) for s in (*STREAMS, NO_STREAM)}
        if findings:
            streams = ", ".join(f"{s}: {n}" for s, n in per_stream.items() if n)
            summary = (
                f"Surprise patch: {len(paths)} of {total} changed files are vendor changes "
                f"in risk areas ({streams})"
            )
        else:
            summary = (
                f"No surprise patch: none of {total} changed files is a vendor change "
                "in a risk area"
            )
        if self.base is None:
            summary += "; no base given, so every change counts as the vendor's"
        return {
            "surprise": bool(findings),
            "summary": summary,
            "findings": findings,
            "risk_areas": self.rules.risk_areas(),
        }

    def to_dict(self) -> dict[str, object]:
        """The JSON document `forkaudit diff --json` writes."""
        return {
            "rules": {"title": self.rules.title, "source": self.rules.source, **self.rules.pins},
            "scope": self.scope,
            "fork": self.fork,
            "upstream": self.upstream,
            "base": self.base,
            "summary": self.summary(),
            "files": [f.to_dict() for f in self.files],
            "left_out": self.left_out,
            "record_mismatches": self.record_mismatches,
            "env_vars": self.env_vars,
            "semantic": self.semantic,
            "history": self.history,
            "verdict": self.verdict(),
        }

    def to_markdown(self, lang: str = "en") -> str:
        """The report for ADR 0012; LANG "zh" gives Chinese headings and labels."""
        if lang not in _LABELS:
            msg = f"lang must be one of {', '.join(_LABELS)}, got {lang!r}"
            raise ValueError(msg)
        return _MarkdownWriter(self, _LABELS[lang]).render()


class _MarkdownWriter:
    def __init__(self, report: AuditReport, labels: dict[str, str]) -> None:
        self.report = report
        self.t = labels
        self.lines: list[str] = []

    def render(self) -> str:
        report, t = self.report, self.t
        self.lines.append(f"# {report.rules.title}\n")
        for key, side in (
            ("fork", report.fork),
            ("upstream", report.upstream),
            ("base", report.base),
        ):
            if side is not None:
                ids = ", ".join(f"{k} `{side[k]}`" for k in ("commit", "tree") if side.get(k))
                self.lines.append(
                    f"- **{t[key]}**: `{side['spec']}` ({side['kind']}{', ' + ids if ids else ''})"
                )
        if report.scope:
            self.lines.append(f"- **{t['scope']}**: `{report.scope}`")
        self._verdict()
        self._summary()
        self._by_area()
        self._env_vars()
        self._semantic()
        self._simple_table(
            t["left_out"],
            [t["file"], t["side"], t["reason"]],
            [[e["path"], e["side"], e["reason"]] for e in report.left_out],
        )
        self._simple_table(
            t["record"],
            [t["side"], t["file"], t["reason"]],
            [
                [side, m["path"], m["problem"]]
                for side, ms in report.record_mismatches.items()
                for m in ms
            ],
        )
        self._history()
        return "\n".join(self.lines) + "\n"

    def _verdict(self) -> None:
        verdict, t = self.report.verdict(), self.t
        self.lines.append(f"\n## {t['verdict']}\n\n**{verdict['summary']}**")
        findings = verdict["findings"]
        assert isinstance(findings, list)
        if not findings:
            self.lines.append(f"\n{t['no_findings']}")
        for stream in (*STREAMS, NO_STREAM):
            rows = [[f["path"], f["reason"]] for f in findings if f["stream"] == stream]
            self._simple_table(f"{t['stream']} {stream}", [t["file"], t["reason"]], rows, level=3)

    def _summary(self) -> None:
        summary, t = self.report.summary(), self.t
        keys = ["total", "added", "modified", "deleted", "renamed", "binary"]
        self.lines.append(f"\n## {t['summary']}\n")
        self.lines.append("| " + " | ".join(t[k] for k in keys) + " |")
        self.lines.append("|" + "---|" * len(keys))
        self.lines.append("| " + " | ".join(str(summary[k]) for k in keys) + " |")

    def _by_area(self) -> None:
        t = self.t
        self.lines.append(f"\n## {t['by_area']}")
        counted = [f for f in self.report.files if f.ignored_by is None]
        for group in self.report.rules.groups:
            self._group(group, counted, level=3)
        self._file_table(t["other"], [f for f in counted if f.group is None], level=3)
        self._file_table(t["ignored"], [f for f in self.report.files if f.ignored_by], level=3)

    def _group(self, group: Group, files: list[FileReport], level: int) -> None:
        def under(node: Group) -> bool:
            return any(f.group is node for f in files) or any(under(child) for child in node.sub)

        if not under(group):
            return
        self.lines.append(f"\n{'#' * level} {group.title}\n")
        if group.why:
            self.lines.append(group.why.strip())
        self._file_table(None, [f for f in files if f.group is group], level)
        for child in group.sub:
            self._group(child, files, level + 1)

    def _file_table(self, title: str | None, files: list[FileReport], level: int) -> None:
        t = self.t
        rows = [
            [
                f.path if f.old_path is None else f"{f.old_path} → {f.path}",
                f.status,
                t["binary"] if f.binary else f"+{f.lines_added}/-{f.lines_removed}",
                f.origin or "-",
                ", ".join(f.keywords) or "-",
            ]
            for f in files
        ]
        headers = [t["file"], t["status"], t["lines"], t["origin"], t["keywords"]]
        if title is None:
            if rows:
                self._table(headers, rows)
        else:
            self._simple_table(title, headers, rows, level=level)

    def _env_vars(self) -> None:
        env, t = self.report.env_vars, self.t
        rows = [[t["added"], f"`{name}`"] for name in _strings(env["added"])]
        rows += [[t["removed"], f"`{name}`"] for name in _strings(env["removed"])]
        changed = env["default_changed"]
        assert isinstance(changed, list)
        rows += [
            [t["default_changed"], f"`{c['name']}`: `{c['old']}` → `{c['new']}`"] for c in changed
        ]
        self._simple_table(t["env_vars"], ["", ""], rows)

    def _semantic(self) -> None:
        semantic, t = self.report.semantic, self.t
        rows = []
        dtypes = semantic["cache_dtypes"]
        backends = semantic["attention_backends"]
        assert isinstance(dtypes, dict) and isinstance(backends, dict)
        rows += [[t["cache_dtypes"], f"{t['added']} `{v}`"] for v in dtypes["added"]]
        rows += [[t["cache_dtypes"], f"{t['removed']} `{v}`"] for v in dtypes["removed"]]
        rows += [[t["backends"], f"{t['added']} `{v}`"] for v in backends["added"]]
        rows += [[t["backends"], f"{t['removed']} `{v}`"] for v in backends["removed"]]
        rows += [
            [t["backends"], f"`{c['name']}`: `{c['old']}` → `{c['new']}`"]
            for c in backends["changed"]
        ]
        per_backend = semantic["backend_kv_cache_dtypes"]
        assert isinstance(per_backend, list)
        rows += [
            [t["backend_dtypes"], f"`{c['backend']}`: +{c['added']} -{c['removed']}"]
            for c in per_backend
        ]
        self._simple_table(t["semantic"], ["", ""], rows)

    def _history(self) -> None:
        history = self.report.history
        if not history.get("available"):
            return
        self.lines.append(f"\n## {self.t['history']}\n")
        for key in (
            "subject",
            "commit_count",
            "root_commits",
            "grafted",
            "shallow",
            "message_fits",
            "message_reason",
        ):
            self.lines.append(f"- {key}: `{history[key]}`")

    def _simple_table(
        self, title: str, headers: list[str], rows: list[list[str]], level: int = 2
    ) -> None:
        self.lines.append(f"\n{'#' * level} {title}\n")
        if rows:
            self._table(headers, rows)
        else:
            self.lines.append(self.t["none"])

    def _table(self, headers: list[str], rows: list[list[str]]) -> None:
        self.lines.append("")
        self.lines.append("| " + " | ".join(headers) + " |")
        self.lines.append("|" + "---|" * len(headers))
        for row in rows:
            self.lines.append("| " + " | ".join(_cell(cell) for cell in row) + " |")


def _cell(text: str) -> str:
    """Table cells must not break the table: escape pipes, flatten newlines, show odd bytes."""
    return (
        os.fsencode(text).decode("utf-8", "backslashreplace").replace("|", "\\|").replace("\n", " ")
    )


def _strings(value: object) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []
