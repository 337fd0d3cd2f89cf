"""The audit's result: the JSON document, the Markdown report (English or Chinese) and the patch."""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

from forkaudit._questions import Answer
from forkaudit._rules import STREAMS, Group, Rules
from forkaudit._snapshot import LARGE_FILE_BYTES

if TYPE_CHECKING:
    from forkaudit._hooks import HookCheck

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
        from forkaudit._markdown_report import markdown_report

        return markdown_report(self, lang)
