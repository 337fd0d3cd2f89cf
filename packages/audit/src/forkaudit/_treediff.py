"""The content-addressed tree diff, computed by git itself in a scratch repository.

Paths whose mode and blob id agree on both sides are dropped first, so git only sees the
differing paths. `git diff -M` pairs renames only among added and deleted paths, so this gives
exactly what `git diff -M` gives on the full trees, at a fraction of the cost.

The audited repositories are only read. Their objects are copied in, not borrowed as
alternates: git "freshens" (touches) an alternate's object whenever it writes one it already
has, which would change files inside the audited repository.
"""

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from forkaudit._errors import GitError
from forkaudit._git import run_git
from forkaudit._snapshot import MODE_EXECUTABLE, MODE_FILE, MODE_GITLINK, Entry, Snapshot

# Mode changes of a type (file <-> symlink) are reported by git as T; the audit calls them M.
_STATUS_NAMES = {"A": "A", "M": "M", "D": "D", "R": "R", "T": "M"}


@dataclass
class FileChange:
    """One changed path, upstream (old) to fork (new), as `git diff -M` reports it.

    A large change (a file over `LARGE_FILE_BYTES` on either side) is found by blob id alone:
    no line counts, no patch.
    """

    path: bytes
    old_path: bytes | None
    status: str
    old_mode: str | None
    new_mode: str | None
    old_oid: str | None
    new_oid: str | None
    similarity: int | None
    binary: bool
    lines_added: int | None
    lines_removed: int | None
    patch: bytes
    large: bool = False


class ScratchRepo:
    """A temporary bare repository holding the changed files of both sides; removed on exit."""

    def __init__(self) -> None:
        self.git_dir = Path(tempfile.mkdtemp(prefix="forkaudit-"))

    def __enter__(self) -> "ScratchRepo":
        run_git(self.git_dir, ["init", "--quiet", "--bare"])
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        shutil.rmtree(self.git_dir, ignore_errors=True)

    def import_trees(self, sides: list[tuple[dict[bytes, Entry], Snapshot]]) -> list[str]:
        """Store each side's ENTRIES, blobs included, as a commit; return the commit ids.

        One `git fast-import` writes everything into one pack. Writing loose objects (a file
        per blob and per tree) cost twice `git diff --no-index` on a vLLM-sized pair.
        """
        stream = bytearray()
        for number, (entries, snapshot) in enumerate(sides, start=1):
            oids = [e.oid for e in entries.values() if e.mode != MODE_GITLINK]
            missing = [oid for oid in oids if oid not in snapshot.blobs]
            copied = cat_blobs(snapshot.git_dir, missing) if snapshot.git_dir and missing else {}
            stream += b"commit refs/heads/side%d\nmark :%d\n" % (number, number)
            stream += b"committer forkaudit <forkaudit> 0 +0000\ndata 0\n"
            for path, entry in entries.items():
                stream += b"M %s " % entry.mode.encode()
                if entry.mode == MODE_GITLINK:
                    stream += b"%s %s\n" % (entry.oid.encode(), _quote(path))
                    continue
                data = (
                    snapshot.blobs[entry.oid] if entry.oid in snapshot.blobs else copied[entry.oid]
                )
                stream += b"inline %s\ndata %d\n%s\n" % (_quote(path), len(data), data)
        run_git(self.git_dir, ["fast-import", "--quiet", "--done"], stdin=bytes(stream) + b"done\n")
        refs = [f"refs/heads/side{number}" for number in range(1, len(sides) + 1)]
        return run_git(self.git_dir, ["rev-parse", *refs]).decode().split()

    def read_blobs(self, oids: list[str]) -> dict[str, bytes]:
        """The contents of blobs written into this repository."""
        return cat_blobs(self.git_dir, oids)

    def diff(self, old: str, new: str) -> tuple[list[FileChange], bytes]:
        """Every change from commit OLD to commit NEW, renames detected, and the whole patch."""
        trees = [old, new]
        raw = run_git(self.git_dir, ["diff-tree", "-r", "-M", "-z", "--raw", *trees])
        numstat = run_git(self.git_dir, ["diff-tree", "-r", "-M", "-z", "--numstat", *trees])
        patch = run_git(
            self.git_dir, ["diff-tree", "-r", "-M", "-p", "--binary", "--no-color", *trees]
        )
        sections = _split_patch(patch)
        changes = []
        for raw_record, (added, removed) in zip(
            _parse_raw(raw), _parse_numstat(numstat), strict=True
        ):
            old_mode, new_mode, old_oid, new_oid, letter, score, old_path, path = raw_record
            # A type change prints as a deletion and a creation: two patch sections.
            own_sections = [next(sections) for _ in range(2 if letter == "T" else 1)]
            changes.append(
                FileChange(
                    path=path,
                    old_path=old_path if letter == "R" else None,
                    status=_STATUS_NAMES.get(letter, letter),
                    old_mode=None if letter == "A" else old_mode,
                    new_mode=None if letter == "D" else new_mode,
                    old_oid=None if letter == "A" else old_oid,
                    new_oid=None if letter == "D" else new_oid,
                    similarity=score,
                    binary=added is None,
                    lines_added=added,
                    lines_removed=removed,
                    patch=b"".join(own_sections),
                )
            )
        return changes, patch


def large_changes(
    paths: list[bytes], old: dict[bytes, Entry], new: dict[bytes, Entry]
) -> list[FileChange]:
    """The changes of PATHS, files too large to diff, judged by mode and blob id alone.

    A large file deleted at one path and added with the same content at another is a rename,
    as git pairs an exact rename; a large file that moved and changed shows as deleted + added.
    """
    regular = {MODE_FILE, MODE_EXECUTABLE}
    deleted = {old[p].oid: p for p in paths if p not in new and old[p].mode in regular}
    renamed_from: dict[bytes, bytes] = {}
    for path in paths:
        if path not in old and new[path].mode in regular and new[path].oid in deleted:
            renamed_from[path] = deleted.pop(new[path].oid)
    changes = []
    for path in paths:
        if path in renamed_from.values():
            continue
        before = old.get(renamed_from.get(path, path))
        after = new.get(path)
        if path in renamed_from:
            status = "R"
        else:
            status = "A" if before is None else "D" if after is None else "M"
        changes.append(
            FileChange(
                path=path,
                old_path=renamed_from.get(path),
                status=status,
                old_mode=before.mode if before else None,
                new_mode=after.mode if after else None,
                old_oid=before.oid if before else None,
                new_oid=after.oid if after else None,
                similarity=100 if status == "R" else None,
                binary=False,
                lines_added=None,
                lines_removed=None,
                patch=b"",
                large=True,
            )
        )
    return changes


def blob_sizes(git_dir: Path, oids: list[str]) -> dict[str, int]:
    """The sizes of the given blobs of a repository, from one `git cat-file --batch-check`."""
    unique = list(dict.fromkeys(oids))
    if not unique:
        return {}
    request = "".join(f"{oid}\n" for oid in unique).encode()
    lines = run_git(git_dir, ["cat-file", "--batch-check"], stdin=request).decode().splitlines()
    sizes = {}
    for oid, line in zip(unique, lines, strict=True):
        fields = line.split(" ")
        if len(fields) != 3:  # "<oid> missing": a repository that lost an object
            msg = f"object {oid} is missing from {git_dir}"
            raise GitError(msg)
        sizes[oid] = int(fields[2])
    return sizes


def changed_lines(patch: bytes) -> list[bytes]:
    """The added and removed lines of one file's patch section, `+` or `-` first; a binary
    patch, or none, has no lines."""
    _header, hunk_marker, body = patch.partition(b"\n@@")
    if not hunk_marker:
        return []
    return [line for line in body.split(b"\n") if line.startswith((b"+", b"-"))]


def cat_blobs(git_dir: Path, oids: list[str]) -> dict[str, bytes]:
    """The contents of the given blobs of a repository, read in one `git cat-file --batch`."""
    unique = list(dict.fromkeys(oids))
    if not unique:
        return {}
    request = "".join(f"{oid}\n" for oid in unique).encode()
    out = run_git(git_dir, ["cat-file", "--batch"], stdin=request)
    blobs, position = {}, 0
    for oid in unique:
        header_end = out.index(b"\n", position)
        header = out[position:header_end].decode().split(" ")
        if len(header) != 3:  # "<oid> missing": a repository that lost an object
            msg = f"object {oid} is missing from {git_dir}"
            raise GitError(msg)
        size = int(header[2])
        blobs[oid] = out[header_end + 1 : header_end + 1 + size]
        position = header_end + 1 + size + 1
    return blobs


def _quote(path: bytes) -> bytes:
    """A path in fast-import's C-style quotes, so that any byte (newline, non-UTF-8) survives."""
    out = bytearray(b'"')
    for byte in path:
        if byte in b'"\\':
            out += b"\\" + bytes([byte])
        elif 0x20 <= byte < 0x7F:
            out.append(byte)
        else:
            out += b"\\%03o" % byte
    return bytes(out + b'"')


_RawRecord = tuple[str, str, str, str, str, int | None, bytes, bytes]


def _parse_raw(raw: bytes) -> Iterator[_RawRecord]:
    """Parse `--raw -z`: `:oldmode newmode oldid newid STATUS\\0path\\0[newpath\\0]`."""
    fields = raw.split(b"\0")
    position = 0
    while position < len(fields) and fields[position]:
        old_mode, new_mode, old_oid, new_oid, status = fields[position][1:].decode().split(" ")
        letter, score = status[0], (int(status[1:]) if status[1:] else None)
        old_path = fields[position + 1]
        if letter in "RC":
            path, position = fields[position + 2], position + 3
        else:
            path, position = old_path, position + 2
        yield old_mode, new_mode, old_oid, new_oid, letter, score, old_path, path


def _parse_numstat(numstat: bytes) -> Iterator[tuple[int | None, int | None]]:
    """Parse `--numstat -z`; a binary file's counts are `-` and come back as None."""
    fields = numstat.split(b"\0")
    position = 0
    while position < len(fields) and fields[position]:
        added, removed, path = fields[position].split(b"\t", 2)
        # A rename leaves the path empty and names old and new path in the next two fields.
        position += 3 if not path else 1
        yield (None, None) if added == b"-" else (int(added), int(removed))


def _split_patch(patch: bytes) -> Iterator[bytes]:
    """Cut a patch into its `diff --git` sections, in output order."""
    starts = [0] if patch.startswith(b"diff --git ") else []
    search = 0
    while (found := patch.find(b"\ndiff --git ", search)) != -1:
        starts.append(found + 1)
        search = found + 1
    for start, end in zip(starts, [*starts[1:], len(patch)], strict=True):
        yield patch[start:end]


def changed_paths(old: dict[bytes, Entry], new: dict[bytes, Entry]) -> list[bytes]:
    """Paths whose mode or blob id differ, or which only one side has."""
    return sorted(path for path in old.keys() | new.keys() if old.get(path) != new.get(path))
