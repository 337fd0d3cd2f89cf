"""The audit's result: the JSON document, the Markdown report (English or Chinese) and the patch."""

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

from forkaudit._artifacts import LEFT_OUT_REASONS
from forkaudit._questions import Answer, Evidence
from forkaudit._rules import STREAMS, Group, Rules
from forkaudit._snapshot import LARGE_FILE_BYTES

if TYPE_CHECKING:
    from forkaudit._hooks import HookCheck, HookResult

#: What a change is, as records carry it: the file's change, a fork file that fails its RECORD
#: check (`record-` and the problem's code), or a fork file with an integrity problem (a name
#: that resolves elsewhere or twice, bytecode that is not its source's; `_snapshot`).
ChangeKind = Literal[
    "added",
    "deleted",
    "modified",
    "renamed",
    "mode-changed",
    "record-missing",
    "record-content-differs",
    "record-unknown-algorithm",
    "record-weak-algorithm",
    "record-unhashed",
    "record-not-listed",
    "name-outside-root",
    "name-not-normal",
    "name-duplicate",
    "bytecode-differs",
    "bytecode-unchecked",
    "bytecode-without-source",
]
_RECORD_CHANGES: dict[str, ChangeKind] = {
    "missing": "record-missing",
    "content-differs": "record-content-differs",
    "unknown-algorithm": "record-unknown-algorithm",
    "weak-algorithm": "record-weak-algorithm",
    "unhashed": "record-unhashed",
    "not-listed": "record-not-listed",
}
#: The integrity problems (`_snapshot.INTEGRITY_PROBLEMS`), as changes: their own codes.
_INTEGRITY_CHANGES: dict[str, ChangeKind] = {
    code: code
    for code in (
        "name-outside-root",
        "name-not-normal",
        "name-duplicate",
        "bytecode-differs",
        "bytecode-unchecked",
        "bytecode-without-source",
    )
}
CHANGE_KINDS: tuple[ChangeKind, ...] = get_args(ChangeKind)
#: How a file was compared: line by line (text), as binary, or by blob id alone (large).
ContentKind = Literal["text", "binary", "large"]
CONTENT_KINDS: tuple[ContentKind, ...] = get_args(ContentKind)

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
        "integrity": "Integrity problems (member names, bytecode)",
        "member": "Member as written",
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
        "no_stream": "Outside the plan's streams",
        "large": "large",
        "large_files": "Large files",
        "large_note": (
            "Files over {size} bytes are compared by blob id only: no line counts, no patch."
        ),
        "size": "Bytes (upstream → fork)",
        "questions": "Questions",
        "question": "Question",
        "answer": "Answer",
        "evidence": "Evidence",
        "hooks": "Plugin hooks",
        "hooks_of": "{release}, declared in {source}; the fork reports {version}",
        "symbol": "Symbol",
        "where_upstream": "Upstream",
        "fork_status": "Fork",
        "to_do": "What to do",
        "hooks_not_checked": "Not checked: no hooks file given (--hooks).",
        "hook:unchanged": "unchanged",
        "hook:changed": "changed",
        "hook:missing": "missing",
        "do:none": "nothing",
        "do:review": "review the change; the plugin's guard still accepts it",
        "do:adapt": "adapt the plugin: its guard refuses this fork",
        "problem:module-missing": "module {detail} is gone",
        "problem:name-missing": "{detail} is not defined",
        "problem:member-missing": "no member {detail}",
        "problem:unparsable": "{detail} does not parse",
        "problem:kind-differs": "now a {detail}",
        "problem:parameters-differ": "takes ({detail})",
        "problem:value-missing": "lacks {detail}",
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
        "integrity": "完整性问题（成员名称、字节码）",
        "member": "原始成员名",
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
        "no_stream": "不属于任何计划流",
        "large": "大文件",
        "large_files": "大文件",
        "large_note": "超过 {size} 字节的文件只按 blob id 比较：没有行数，也不在补丁中。",
        "size": "字节（上游 → 分支）",
        "questions": "问题",
        "question": "问题",
        "answer": "回答",
        "evidence": "依据",
        "hooks": "插件挂钩",
        "hooks_of": "{release}，声明于 {source}；分支报告的版本为 {version}",
        "symbol": "符号",
        "where_upstream": "上游位置",
        "fork_status": "分支",
        "to_do": "处理",
        "hooks_not_checked": "未检查：没有给出挂钩文件（--hooks）。",
        "hook:unchanged": "未改变",
        "hook:changed": "已改变",
        "hook:missing": "缺失",
        "do:none": "无需处理",
        "do:review": "审阅改动；插件的导入检查仍接受它",
        "do:adapt": "调整插件：其导入检查会拒绝这个分支",
        "problem:module-missing": "模块 {detail} 已不存在",
        "problem:name-missing": "{detail} 未定义",
        "problem:member-missing": "缺少成员 {detail}",
        "problem:unparsable": "{detail} 无法解析",
        "problem:kind-differs": "现在是 {detail}",
        "problem:parameters-differ": "参数为 ({detail})",
        "problem:value-missing": "缺少 {detail}",
    },
}


#: The first changed lines a finding shows, and how much of each line.
EXCERPT_LINES = 6
EXCERPT_CHARS = 160


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
    large: bool = False
    old_size: int | None = None
    new_size: int | None = None
    #: The first `EXCERPT_LINES` changed lines, `+` or `-` first, each cut to `EXCERPT_CHARS`.
    excerpt: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def change(self) -> ChangeKind:
        if self.status == "M" and self.old_mode != self.new_mode:
            return "mode-changed"
        kinds: dict[str, ChangeKind] = {
            "A": "added",
            "D": "deleted",
            "M": "modified",
            "R": "renamed",
        }
        return kinds[self.status]

    @property
    def content(self) -> ContentKind:
        return "large" if self.large else "binary" if self.binary else "text"

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "old_path": self.old_path,
            "status": self.status,
            "change": self.change,
            "old_mode": self.old_mode,
            "new_mode": self.new_mode,
            "similarity": self.similarity,
            "content": self.content,
            "binary": self.binary,
            "large": self.large,
            "old_size": self.old_size,
            "new_size": self.new_size,
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
            "excerpt": self.excerpt,
            "notes": self.notes,
        }

    def reason(self) -> str:
        """One line: what changed, where, and what the semantic diff and keywords add."""
        what = {
            "renamed": f"renamed from {self.old_path}",
            "mode-changed": f"mode {self.old_mode} -> {self.new_mode}",
        }.get(self.change, self.change)
        size = {
            "text": f"+{self.lines_added}/-{self.lines_removed}",
            "binary": "binary",
            "large": f"large, {self.old_size} -> {self.new_size} bytes, compared by blob id",
        }[self.content]
        parts = [f"{what} in {self.category} ({size})", *self.notes]
        if self.keywords:
            parts.append("keywords: " + ", ".join(self.keywords))
        return "; ".join(parts)


@dataclass(frozen=True)
class Finding:
    """A vendor change (or an unattributed one) in a risk area, for one stream it touches; or a
    fork file that fails its RECORD check. STREAM is None outside every stream's areas."""

    stream: str | None
    path: str
    area: str
    change: ChangeKind
    reason: str
    old_path: str | None = None
    old_mode: str | None = None
    new_mode: str | None = None
    content: ContentKind | None = None
    lines_added: int | None = None
    lines_removed: int | None = None
    keywords: tuple[str, ...] = ()
    excerpt: tuple[str, ...] = ()

    @classmethod
    def of_file(cls, file: FileReport, stream: str) -> "Finding":
        return cls(
            stream=stream,
            path=file.path,
            area=file.category,
            change=file.change,
            reason=file.reason(),
            old_path=file.old_path,
            old_mode=file.old_mode,
            new_mode=file.new_mode,
            content=file.content,
            lines_added=file.lines_added,
            lines_removed=file.lines_removed,
            keywords=tuple(file.keywords),
            excerpt=tuple(file.excerpt),
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "stream": self.stream,
            "path": self.path,
            "area": self.area,
            "change": self.change,
            "reason": self.reason,
            "old_path": self.old_path,
            "old_mode": self.old_mode,
            "new_mode": self.new_mode,
            "content": self.content,
            "lines_added": self.lines_added,
            "lines_removed": self.lines_removed,
            "keywords": list(self.keywords),
            "excerpt": list(self.excerpt),
        }


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
    questions: list[Answer]
    history: dict[str, object]
    patch_bytes: bytes
    #: The plugin hooks check, when a hooks file was given.
    hooks: "HookCheck | None" = None
    #: Integrity problems per side (`fork`, `upstream`): `path`, `member`, `code`, `problem`.
    integrity: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def patch(self) -> str:
        """The full unified patch (with binary hunks), upstream to fork, as `git diff -M`; large
        files are not in it."""
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
            "large": sum(f.large for f in counted),
            "lines_added": sum(f.lines_added or 0 for f in counted),
            "lines_removed": sum(f.lines_removed or 0 for f in counted),
            "ignored": len(self.files) - len(counted),
            "left_out": len(self.left_out),
            "by_area": dict(sorted(by_area.items())),
            "by_origin": dict(sorted(by_origin.items())),
        }

    def findings(self) -> list[Finding]:
        """Vendor changes (or unattributed ones) in risk areas, one per stream they touch, and
        fork files that fail their RECORD check or have an integrity problem.

        Without a base, a change cannot be told from upstream drift, so it counts as the
        vendor's. A fork file that does not match its RECORD, or that a member name hides or
        bytecode stands in for, is always a finding.
        """
        findings = [
            Finding.of_file(f, stream)
            for f in self.files
            if f.ignored_by is None and f.risk and f.origin != "upstream-drift"
            for stream in f.streams
        ]
        for mismatch in self.record_mismatches.get("fork", []):
            classification = self.rules.classify(mismatch["path"])
            change = _RECORD_CHANGES[mismatch["code"]]
            for stream in classification.streams or (None,):
                findings.append(
                    Finding(
                        stream=stream,
                        path=mismatch["path"],
                        area=classification.area,
                        change=change,
                        reason=f"patched after install: {mismatch['problem']}",
                    )
                )
        for problem in self.integrity.get("fork", []):
            classification = self.rules.classify(problem["path"])
            member = problem["member"]
            written = f" (written {member!r})" if member != problem["path"] else ""
            for stream in classification.streams or (None,):
                findings.append(
                    Finding(
                        stream=stream,
                        path=problem["path"],
                        area=classification.area,
                        change=_INTEGRITY_CHANGES[problem["code"]],
                        reason=f"{problem['problem']}{written}",
                    )
                )
        return findings

    def verdict(self) -> dict[str, object]:
        """Surprise unless no vendor change (or unattributed change) falls in a risk area and
        no fork file fails its RECORD check; the counts behind it, and the same in one English
        line (`summary`).

        `finding_files` counts the files of all findings (what the pipeline's gate judges);
        `risk_files` the changed files among them, `record_files` those failing RECORD,
        `integrity_files` those with an integrity problem (a file can be several);
        `risk_files_by_stream` the files of the findings of each stream.
        """
        findings = self.findings()
        total = self.summary()["total"]
        record_files = {f.path for f in findings if f.change.startswith("record-")}
        integrity_files = {f.path for f in findings if f.change in _INTEGRITY_CHANGES}
        risk_files = {
            f.path
            for f in findings
            if not f.change.startswith("record-") and f.change not in _INTEGRITY_CHANGES
        }
        per_stream = {
            key: len({f.path for f in findings if f.stream == stream})
            for key, stream in (*((s, s) for s in STREAMS), ("none", None))
        }
        if findings:
            streams = ", ".join(f"{s}: {n}" for s, n in per_stream.items() if n)
            record = f", {len(record_files)} fail their RECORD check" if record_files else ""
            if integrity_files:
                record += f", {len(integrity_files)} fail an integrity check (names, bytecode)"
            summary = (
                f"Surprise patch: {len(risk_files)} of {total} changed files are vendor changes "
                f"in risk areas{record} ({streams})"
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
            "changed_files": total,
            "finding_files": len(risk_files | record_files | integrity_files),
            "risk_files": len(risk_files),
            "record_files": len(record_files),
            "integrity_files": len(integrity_files),
            "risk_files_by_stream": per_stream,
            "base_given": self.base is not None,
            "findings": [f.to_dict() for f in findings],
            "risk_areas": self.rules.risk_areas(),
        }

    def to_dict(self) -> dict[str, object]:
        """The JSON document `forkaudit diff --json` writes."""
        return {
            "rules": {
                "title": self.rules.title,
                "source": self.rules.source,
                "fork": self.rules.fork,
                "upstream": self.rules.upstream,
            },
            "scope": self.scope,
            "large_file_bytes": LARGE_FILE_BYTES,
            "fork": self.fork,
            "upstream": self.upstream,
            "base": self.base,
            "summary": self.summary(),
            "files": [f.to_dict() for f in self.files],
            "left_out": self.left_out,
            "record_mismatches": self.record_mismatches,
            "integrity": self.integrity,
            "env_vars": self.env_vars,
            "semantic": self.semantic,
            "questions": [answer.to_dict() for answer in self.questions],
            "history": self.history,
            "verdict": self.verdict(),
            "hooks": self.hooks.to_dict() if self.hooks is not None else None,
        }

    def to_markdown(self, lang: str = "en") -> str:
        """The report for ADR 0012; LANG "zh" gives Chinese headings and labels."""
        if lang not in _LABELS:
            msg = f"lang must be one of {', '.join(_LABELS)}, got {lang!r}"
            raise ValueError(msg)
        return _MarkdownWriter(self, _LABELS[lang]).render()


class _MarkdownWriter:
    """The Markdown report. Every name that comes from the fork, the upstream or the rules
    (paths, specs, env vars, keywords, commit subjects) is a code span, so no character of it
    is read as Markdown; a rules group's `why` is Markdown on purpose."""

    def __init__(self, report: AuditReport, labels: dict[str, str]) -> None:
        self.report = report
        self.t = labels
        self.lines: list[str] = []

    def render(self) -> str:
        report, t = self.report, self.t
        self.lines.append(f"# {_escape(report.rules.title)}\n")
        for key, side in (
            ("fork", report.fork),
            ("upstream", report.upstream),
            ("base", report.base),
        ):
            if side is not None:
                ids = ", ".join(
                    f"{k} {_code(str(side[k]))}" for k in ("commit", "tree") if side.get(k)
                )
                self.lines.append(
                    f"- **{t[key]}**: {_code(str(side['spec']))} "
                    f"({side['kind']}{', ' + ids if ids else ''})"
                )
        if report.scope:
            self.lines.append(f"- **{t['scope']}**: {_code(report.scope)}")
        self._verdict()
        self._summary()
        self._questions()
        self._hooks()
        self._by_area()
        self._large_files()
        self._env_vars()
        self._semantic()
        self._simple_table(
            t["left_out"],
            [t["file"], t["side"], t["reason"]],
            [[_code(e["path"]), e["side"], LEFT_OUT_REASONS[e["code"]]] for e in report.left_out],
        )
        self._simple_table(
            t["record"],
            [t["side"], t["file"], t["reason"]],
            [
                [side, _code(m["path"]), m["problem"]]
                for side, ms in report.record_mismatches.items()
                for m in ms
            ],
        )
        self._simple_table(
            t["integrity"],
            [t["side"], t["file"], t["member"], t["reason"]],
            [
                [side, _code(p["path"]), _code(p["member"]), p["problem"]]
                for side, problems in report.integrity.items()
                for p in problems
            ],
        )
        self._history()
        return "\n".join(self.lines) + "\n"

    def _verdict(self) -> None:
        verdict, t = self.report.verdict(), self.t
        self.lines.append(f"\n## {t['verdict']}\n\n**{verdict['summary']}**")
        findings = self.report.findings()
        if not findings:
            self.lines.append(f"\n{t['no_findings']}")
        for stream in (*STREAMS, None):
            rows = [[_code(f.path), _escape(f.reason)] for f in findings if f.stream == stream]
            title = t["no_stream"] if stream is None else f"{t['stream']} {stream}"
            self._simple_table(title, [t["file"], t["reason"]], rows, level=3)

    def _summary(self) -> None:
        summary, t = self.report.summary(), self.t
        keys = ["total", "added", "modified", "deleted", "renamed", "binary", "large"]
        self.lines.append(f"\n## {t['summary']}\n")
        self.lines.append("| " + " | ".join(t[k] for k in keys) + " |")
        self.lines.append("|" + "---|" * len(keys))
        self.lines.append("| " + " | ".join(str(summary[k]) for k in keys) + " |")

    def _questions(self) -> None:
        rows = [
            [
                answer.question,
                answer.answer,
                "; ".join(_evidence_text(e) for e in answer.evidence) or "-",
            ]
            for answer in self.report.questions
        ]
        t = self.t
        self._simple_table(t["questions"], [t["question"], t["answer"], t["evidence"]], rows)

    def _hooks(self) -> None:
        check, t = self.report.hooks, self.t
        self.lines.append(f"\n## {t['hooks']}\n")
        if check is None:
            self.lines.append(t["hooks_not_checked"])
            return
        of = t["hooks_of"].format(
            release=_code(check.release),
            source=_code(check.source),
            version=_code(check.fork_version or "-"),
        )
        self.lines.append(f"{of}\n\n**{_escape(check.summary())}**")
        rows = [
            [
                _code(result.hook.symbol),
                _code(result.upstream),
                "<br>".join(self._hook_fork(result)),
                t[f"do:{result.action}"],
            ]
            for result in check.results
        ]
        self._table([t["symbol"], t["where_upstream"], t["fork_status"], t["to_do"]], rows)

    def _hook_fork(self, result: "HookResult") -> list[str]:
        """The fork's side of a hook: its status, where it lives if it moved, the problem, and
        the first changed lines."""
        t = self.t
        status = t[f"hook:{result.status}"]
        if result.fork is not None and result.fork.path != result.upstream.path:
            status += f" ({_code(result.fork)})"
        if result.problem is not None:
            status += ": " + t[f"problem:{result.problem}"].format(detail=_code(result.detail))
        return [status, *(_code(line) for line in result.excerpt)]

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
        self.lines.append(f"\n{'#' * level} {_escape(group.title)}\n")
        if group.why:
            self.lines.append(group.why.strip())
        self._file_table(None, [f for f in files if f.group is group], level)
        for child in group.sub:
            self._group(child, files, level + 1)

    def _file_table(self, title: str | None, files: list[FileReport], level: int) -> None:
        t = self.t
        rows = [
            [
                _code(f.path) if f.old_path is None else f"{_code(f.old_path)} → {_code(f.path)}",
                f.status,
                {
                    "text": f"+{f.lines_added}/-{f.lines_removed}",
                    "binary": t["binary"],
                    "large": t["large"],
                }[f.content],
                f.origin or "-",
                ", ".join(_code(k) for k in f.keywords) or "-",
            ]
            for f in files
        ]
        headers = [t["file"], t["status"], t["lines"], t["origin"], t["keywords"]]
        if title is None:
            if rows:
                self._table(headers, rows)
        else:
            self._simple_table(title, headers, rows, level=level)

    def _large_files(self) -> None:
        large = [f for f in self.report.files if f.large]
        if not large:
            return
        t = self.t
        self._simple_table(
            t["large_files"],
            [t["file"], t["status"], t["size"]],
            [[_code(f.path), f.status, f"{f.old_size} → {f.new_size}"] for f in large],
        )
        self.lines.append(f"\n{t['large_note'].format(size=LARGE_FILE_BYTES)}")

    def _env_vars(self) -> None:
        env, t = self.report.env_vars, self.t
        rows = [[t["added"], _code(name)] for name in _strings(env["added"])]
        rows += [[t["removed"], _code(name)] for name in _strings(env["removed"])]
        changed = env["default_changed"]
        assert isinstance(changed, list)
        rows += [
            [t["default_changed"], f"{_code(c['name'])}: {_code(c['old'])} → {_code(c['new'])}"]
            for c in changed
        ]
        self._simple_table(t["env_vars"], ["", ""], rows)

    def _semantic(self) -> None:
        semantic, t = self.report.semantic, self.t
        rows = []
        dtypes = semantic["cache_dtypes"]
        backends = semantic["attention_backends"]
        assert isinstance(dtypes, dict) and isinstance(backends, dict)
        rows += [[t["cache_dtypes"], f"{t['added']} {_code(v)}"] for v in dtypes["added"]]
        rows += [[t["cache_dtypes"], f"{t['removed']} {_code(v)}"] for v in dtypes["removed"]]
        rows += [[t["backends"], f"{t['added']} {_code(v)}"] for v in backends["added"]]
        rows += [[t["backends"], f"{t['removed']} {_code(v)}"] for v in backends["removed"]]
        rows += [
            [t["backends"], f"{_code(c['name'])}: {_code(c['old'])} → {_code(c['new'])}"]
            for c in backends["changed"]
        ]
        per_backend = semantic["backend_kv_cache_dtypes"]
        assert isinstance(per_backend, list)
        rows += [
            [
                t["backend_dtypes"],
                f"{_code(c['backend'])}: "
                + ", ".join(
                    [*(f"+{_code(d)}" for d in c["added"]), *(f"-{_code(d)}" for d in c["removed"])]
                ),
            ]
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
            self.lines.append(f"- {key}: {_code(str(history[key]))}")

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


def _evidence_text(evidence: Evidence) -> str:
    """One piece of evidence in words, with its file."""
    if evidence.kind == "fact":
        values = " → ".join(_code(v) for v in (evidence.old, evidence.new) if v is not None)
        what = f"{evidence.subject} {evidence.change} {_code(evidence.name or '')}"
        return f"{what}{' ' + values if values else ''} in {_code(evidence.path)}"
    if evidence.kind == "mention":
        return f"changed lines name {_code(evidence.name or '')} in {_code(evidence.path)}"
    if evidence.kind == "unread":
        return f"not parsed: {_code(evidence.path)}"
    return f"{evidence.change} {_code(evidence.path)}"


# Characters a visible name must not carry raw: line breaks and other control characters.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Characters that inline Markdown reads as syntax, and `#`, which closes a heading. `|` is left
# to `_cell`: outside a table it is plain text.
_MARKDOWN_SYNTAX = re.compile(r"([\\`*_\[\]<>~&#])")


def _visible(text: str) -> str:
    """TEXT with undecodable path bytes and control characters spelled out (`\\xe9`, `\\n`)."""
    shown = os.fsencode(text).decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], shown)


def _code(text: object) -> str:
    """TEXT as a code span: a fence of more backticks than any run inside, padded when the
    text starts or ends with a backtick or a space, so that the text shows exactly."""
    shown = _visible(str(text))
    longest = max((len(run) for run in re.findall(r"`+", shown)), default=0)
    fence = "`" * (longest + 1)
    if shown.startswith(("`", " ")) or shown.endswith(("`", " ")):
        shown = f" {shown} "
    return f"{fence}{shown}{fence}"


def _escape(text: str) -> str:
    """TEXT as running Markdown text (a title, a reason): syntax characters escaped."""
    return _MARKDOWN_SYNTAX.sub(r"\\\1", _visible(text))


def _cell(text: str) -> str:
    """Table cells must not break the table: escape pipes (inside code spans too, as GFM
    wants), flatten newlines."""
    return text.replace("|", "\\|").replace("\n", " ")


def _strings(value: object) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []
