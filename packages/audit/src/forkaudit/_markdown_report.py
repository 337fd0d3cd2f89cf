"""The audit's Markdown report (English or Chinese), written from an `AuditReport`."""

import os
import re
from typing import TYPE_CHECKING

from forkaudit._artifacts import LEFT_OUT_REASONS
from forkaudit._questions import Evidence
from forkaudit._report import AuditReport, FileReport
from forkaudit._rules import STREAMS, Group
from forkaudit._snapshot import LARGE_FILE_BYTES

if TYPE_CHECKING:
    from forkaudit._hooks import HookResult

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


def markdown_report(report: AuditReport, lang: str) -> str:
    """The report for ADR 0012; LANG "zh" gives Chinese headings and labels."""
    if lang not in _LABELS:
        msg = f"lang must be one of {', '.join(_LABELS)}, got {lang!r}"
        raise ValueError(msg)
    return _MarkdownWriter(report, _LABELS[lang]).render()


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
