"""Freshness: whether the code a record measured is still the code in the work tree.

``<adr dir>/sources.toml`` declares, per stage, the source files its figures depend on (globs
under the repository root, which the file names relative to the ADR directory). A stage's record
carries the SHA-256 of each such file as it ran (`Provenance.sources`, from `source_hashes`); the
ADR writer hashes the same globs in the work tree and compares, file by file. A record whose
files differ is stale, and says which files changed since its commit; one that carries no hashes
(written before records had them) cannot be judged fresh, and says so. Neither needs git history:
the hashes are of the files' bytes, so a shallow clone or an exported tree judges the same.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from adrkit._errors import AdrError
from adrkit._files import FileReadError, is_language_table, read_capped, read_declarations
from adrkit._labels import label
from adrkit._markdown import code_cell, markdown_text
from adrkit.schema import Record

SOURCES_FILE = "sources.toml"
_MAX_SOURCES_BYTES = 64 * 2**10
# A source file is code or configuration; a file this large is neither, and is not hashed whole.
MAX_SOURCE_BYTES = 16 * 2**20
_STAGE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


@dataclass(frozen=True)
class SourceSet:
    """The files a stage's figures depend on: what they are, in words, and their globs."""

    stage: str
    what: dict[str, str]
    patterns: tuple[str, ...]


@dataclass(frozen=True)
class Sources:
    """The declared source sets and the repository root their globs are under; empty (no
    freshness judged) when the ADR directory has no sources.toml."""

    root: Path | None = None
    sets: dict[str, SourceSet] = field(default_factory=dict)

    def hashes(self, stage: str) -> dict[str, str] | None:
        """The work tree's hashes of ``stage``'s files; None when no set is declared for it."""
        declared = self.sets.get(stage)
        if declared is None or self.root is None:
            return None
        return source_hashes(self.root, declared.patterns)

    def what(self, stage: str, lang: str) -> str:
        declared = self.sets[stage]
        return declared.what.get(lang) or declared.what.get("en") or stage


@dataclass(frozen=True)
class Stale:
    """Why a record's figures may no longer hold: the files (relative paths) that changed, were
    added or were removed since it ran; empty ``changed`` with ``unrecorded`` when the record
    carries no hashes to compare."""

    stage: str
    commit: str | None
    changed: tuple[str, ...] = ()
    unrecorded: bool = False


def source_hashes(root: Path, patterns: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``{path relative to root: sha256 of its bytes}`` of every file the globs match."""
    found: dict[str, str] = {}
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            relative = path.relative_to(root).as_posix()
            try:
                data = read_capped(path, MAX_SOURCE_BYTES)
            except FileReadError as exc:
                msg = f"cannot hash source file {path}: {exc}"
                raise AdrError(msg) from None
            found[relative] = hashlib.sha256(data).hexdigest()
    return dict(sorted(found.items()))


def stale(record: Record, sources: Sources) -> Stale | None:
    """How ``record`` is stale against the work tree, or None: fresh, or its stage has no
    declared sources (nothing to judge)."""
    now = sources.hashes(record.stage)
    if now is None:
        return None
    commit = record.provenance.repo_commit
    then = record.provenance.sources
    if not then:
        return Stale(record.stage, commit, unrecorded=True)
    changed = tuple(sorted(p for p in then.keys() | now.keys() if then.get(p) != now.get(p)))
    return Stale(record.stage, commit, changed) if changed else None


def load_sources(adr_dir: Path) -> Sources:
    """``<adr dir>/sources.toml``, checked whole; no file means no freshness is judged."""
    path = adr_dir / SOURCES_FILE
    data = read_declarations(path, _MAX_SOURCES_BYTES)
    if data is None:
        return Sources()
    root = data.pop("root", None)
    if not isinstance(root, str) or not root:
        msg = f'{path}: `root` must be the repository root relative to this file, e.g. "../.."'
        raise AdrError(msg)
    sets = {}
    for stage, entry in data.items():
        where = f"{path}: [{stage}]"
        if not _STAGE.fullmatch(stage):
            msg = f"{where} is not a stage name (lowercase letters, digits, '-' or '_')"
            raise AdrError(msg)
        if not isinstance(entry, dict) or set(entry) != {"what", "files"}:
            msg = f"{where} must be a table with exactly `what` and `files`"
            raise AdrError(msg)
        what, files = entry["what"], entry["files"]
        if not is_language_table(what):
            msg = f'{where} `what` must be a table of language = words, e.g. {{ en = "..." }}'
            raise AdrError(msg)
        if not isinstance(files, list) or not files or not all(_relative_glob(f) for f in files):
            msg = (
                f"{where} `files` must be a list of globs relative to the root (no leading '/', "
                "no '..')"
            )
            raise AdrError(msg)
        sets[stage] = SourceSet(stage, dict(what), tuple(files))
    return Sources((adr_dir / root).resolve(), sets)


def _relative_glob(pattern: object) -> bool:
    if not isinstance(pattern, str) or not pattern or pattern.startswith("/"):
        return False
    return ".." not in Path(pattern).parts


# Files a stale note names before it counts the rest.
_NAMED_FILES = 3


def stale_note(found: Stale, sources: Sources, lang: str) -> str:
    """The stale note of a record, as Markdown: which files changed since its commit, or that it
    carries no hashes to tell."""
    commit = code_cell((found.commit or "unknown")[:12])
    if found.unrecorded:
        what = markdown_text(sources.what(found.stage, lang))
        return label(lang, "stale-unrecorded", what=what, commit=commit)
    named = [code_cell(path) for path in found.changed[:_NAMED_FILES]]
    rest = len(found.changed) - len(named)
    files = label(lang, "list-separator").join(named)
    if rest:
        files += label(lang, "and-more", count=str(rest))
    return label(lang, "stale", files=files, commit=commit)
