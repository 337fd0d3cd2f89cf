"""Turning a SPEC into a snapshot: every file of a tree with its git mode and blob id.

Blob ids are computed exactly as git computes them, so a git tree, an sdist, a wheel, an
installed distribution and a plain directory can all be compared id by id. A file over
`LARGE_FILE_BYTES` is hashed while it is read and never held in memory: it is compared by blob
id only (see `_audit`).
"""

import base64
import csv
import hashlib
import importlib.metadata
import lzma
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import git

from forkaudit._errors import GitError, SpecError
from forkaudit._git import RepositoryView, run_git
from forkaudit._pypi import fetch_from_index

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
_READ_CHUNK = 1 << 20


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
    #: The view itself, kept as long as the snapshot (the view's folder goes with it).
    view: RepositoryView | None = None
    #: Files whose content does not match the distribution's RECORD (wheel and installed).
    record_mismatches: list[dict[str, str]] = field(default_factory=list)
    #: Files of the distribution that lie outside its install root, so are not compared.
    outside_root: list[str] = field(default_factory=list)

    def tree_id(self) -> str:
        """The git tree id these entries would have if committed (matches `git write-tree`)."""
        return _hash_tree(self.entries)


def blob_id(data: bytes) -> str:
    """The id git gives a blob holding DATA."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def open_spec(spec: str, *, scope: str | None = None, cache_dir: Path | None = None) -> Snapshot:
    """Read the snapshot a SPEC names; a plain PATH[@REV] means a git repository.

    SCOPE (a prefix such as `vllm/`) keeps only the paths under it; outside it nothing counts.
    """
    snapshot = _open_unscoped(spec, cache_dir)
    if scope:
        prefix = os.fsencode(scope)
        snapshot.entries = {p: e for p, e in snapshot.entries.items() if p.startswith(prefix)}
        snapshot.record_mismatches = [
            m for m in snapshot.record_mismatches if m["path"].startswith(scope)
        ]
    return snapshot


def _open_unscoped(spec: str, cache_dir: Path | None) -> Snapshot:
    kind, _, target = spec.partition(":")
    if kind == "git":
        return _open_git(spec, target)
    if kind == "dir":
        return _open_dir(spec, Path(target))
    if kind == "sdist":
        return _open_sdist(spec, _existing_file(spec, target))
    if kind == "wheel":
        return _open_wheel(spec, _existing_file(spec, target))
    if kind == "pypi":
        return _open_sdist(spec, fetch_from_index(spec, target, "sdist", cache_dir))
    if kind == "pypi-wheel":
        return _open_wheel(spec, fetch_from_index(spec, target, "wheel", cache_dir))
    if kind == "installed":
        return _open_installed(spec, target)
    return _open_git(spec, spec)


def _existing_file(spec: str, path: str) -> Path:
    file = Path(path)
    if not file.is_file():
        msg = f"`{spec}`: file {path!r} does not exist"
        raise SpecError(msg)
    if not os.access(file, os.R_OK):
        msg = f"`{spec}`: file {path!r} is not readable"
        raise SpecError(msg)
    return file


def split_path_rev(target: str) -> tuple[str, str]:
    """Split PATH[@REV]; a path that exists as written keeps any `@` it contains."""
    path, at, rev = target.rpartition("@")
    if not at or Path(target).exists() or not path:
        return target, "HEAD"
    return path, rev


def open_repo(spec: str, path: str) -> RepositoryView:
    """The view git reads the repository at PATH (bare or with a work tree) through, without
    searching parents; GitPython only finds its git directory, and runs nothing."""
    if not Path(path).exists():
        msg = f"`{spec}`: path {path!r} does not exist"
        raise SpecError(msg)
    try:
        common_dir = git.Repo(path).common_dir
    except git.InvalidGitRepositoryError:
        msg = f"`{spec}`: {path!r} is not a git repository"
        raise SpecError(msg) from None
    except git.NoSuchPathError:
        msg = f"`{spec}`: path {path!r} does not exist"
        raise SpecError(msg) from None
    return RepositoryView(Path(common_dir))


def resolve_commit(spec: str, view: RepositoryView, rev: str) -> str:
    """The full commit id REV names in the repository; clear errors for an empty repository or
    an unknown ref."""
    git_dir = view.git_dir
    try:
        out = run_git(git_dir, ["rev-parse", "--verify", "--end-of-options", f"{rev}^{{commit}}"])
    except GitError:
        if not run_git(git_dir, ["for-each-ref", "--count=1"]).strip():
            msg = f"`{spec}`: repository {str(view.source)!r} is empty (it has no commits)"
            raise SpecError(msg) from None
        msg = f"`{spec}`: unknown ref {rev!r} (expected a branch, tag or commit)"
        raise SpecError(msg) from None
    return out.decode().strip()


def list_tree(git_dir: Path, commit: str) -> dict[bytes, Entry]:
    """Every path of COMMIT's whole tree, recursively, with its mode and object id."""
    listing = run_git(git_dir, ["ls-tree", "-r", "-z", "--full-tree", commit])
    entries = {}
    for record in listing.split(b"\0"):
        if record:
            meta, _, path = record.partition(b"\t")
            mode, _kind, oid = meta.decode().split(" ")
            entries[path] = Entry(mode, oid)
    return entries


def _open_git(spec: str, target: str) -> Snapshot:
    path, rev = split_path_rev(target)
    view = open_repo(spec, path)
    commit = resolve_commit(spec, view, rev)
    return Snapshot(
        spec=spec,
        kind="git",
        entries=list_tree(view.git_dir, commit),
        commit=commit,
        git_dir=view.git_dir,
        view=view,
    )


class _SnapshotBuilder:
    """Collects files read from an archive or a directory, hashing them as git does."""

    def __init__(self, spec: str, kind: str) -> None:
        self.snapshot = Snapshot(spec=spec, kind=kind, entries={})

    def add(self, path: bytes, data: bytes, mode: str) -> None:
        oid = blob_id(data)
        self.snapshot.entries[path] = Entry(mode, oid)
        self.snapshot.blobs[oid] = data
        self.snapshot.sizes[oid] = len(data)

    def add_file(
        self, path: bytes, mode: str, size: int, stream: IO[bytes], digest_name: str | None = None
    ) -> bytes | None:
        """Add SIZE bytes read from STREAM; return their DIGEST_NAME digest (for RECORD checks).

        A large file is read in chunks, each hashed and dropped, so memory stays flat.
        """
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
                f"but {'more' if read > expected else read} were read (did it change meanwhile?)"
            )
            raise SpecError(msg)


def _file_mode(st_mode: int) -> str:
    if stat.S_ISLNK(st_mode):
        return MODE_SYMLINK
    # git records only whether the owner may execute the file.
    return MODE_EXECUTABLE if st_mode & stat.S_IXUSR else MODE_FILE


def _open_dir(spec: str, root: Path) -> Snapshot:
    if not root.is_dir():
        msg = f"`{spec}`: directory {str(root)!r} does not exist"
        raise SpecError(msg)
    builder = _SnapshotBuilder(spec, "dir")
    for relative, absolute in _walk_files(os.fsencode(root)):
        try:
            _add_from_disk(builder, relative, Path(os.fsdecode(absolute)))
        except OSError as error:
            msg = f"`{spec}`: cannot read {os.fsdecode(absolute)!r}: {error.strerror}"
            raise SpecError(msg) from None
    return builder.snapshot


def _add_from_disk(
    builder: _SnapshotBuilder, path: bytes, location: Path, digest_name: str | None = None
) -> bytes | None:
    """Add the file or symlink at LOCATION as PATH; return its DIGEST_NAME digest if asked."""
    st = location.lstat()
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        msg = (
            f"{str(location)!r} is neither a file nor a symlink (a socket, pipe or device);"
            " git could not track it either"
        )
        raise SpecError(msg)
    if stat.S_ISLNK(st.st_mode):
        target = os.fsencode(location.readlink())
        builder.add(path, target, MODE_SYMLINK)
        return hashlib.new(digest_name, target).digest() if digest_name else None
    with location.open("rb") as stream:
        return builder.add_file(path, _file_mode(st.st_mode), st.st_size, stream, digest_name)


def _walk_files(root: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Yield (relative path, absolute path) of every file and symlink, skipping `.git`.

    A stack, not recursion: a tree may nest deeper than Python's recursion limit.
    """
    pending = [b""]
    while pending:
        relative = pending.pop()
        directory = root + b"/" + relative if relative else root
        try:
            with os.scandir(directory) as scan:
                children = sorted(scan, key=lambda child: child.name)
        except OSError as error:
            msg = f"cannot list directory {os.fsdecode(directory)!r}: {error.strerror}"
            raise SpecError(msg) from None
        for child in children:
            if child.name == b".git":
                continue
            child_relative = relative + b"/" + child.name if relative else child.name
            if child.is_dir(follow_symlinks=False):
                pending.append(child_relative)
            else:
                yield child_relative, child.path


def _open_sdist(spec: str, file: Path) -> Snapshot:
    builder = _SnapshotBuilder(spec, "sdist")
    try:
        with tarfile.open(file, "r:*") as archive:
            members = [m for m in archive.getmembers() if m.isfile() or m.issym() or m.islnk()]
            top = _common_top_dir([m.name for m in members])
            for member in members:
                path = os.fsencode(member.name[len(top) :])
                if member.issym():
                    builder.add(path, os.fsencode(member.linkname), MODE_SYMLINK)
                    continue
                # A hard link holds no data of its own: it reads as the member it names.
                content = _link_target(spec, archive, member) if member.islnk() else member
                extracted = archive.extractfile(content)
                if extracted is None:
                    continue
                mode = MODE_EXECUTABLE if member.mode & stat.S_IXUSR else MODE_FILE
                with extracted:
                    builder.add_file(path, mode, content.size, extracted)
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError) as error:
        if isinstance(error, OSError) and error.strerror:  # the file itself: permissions, I/O
            msg = f"`{spec}`: cannot read sdist {str(file)!r}: {error.strerror}"
        else:  # not an archive, or a truncated or corrupt one; tarfile's own message lists
            # every decompressor it tried, over several lines, so it is not repeated here
            msg = (
                f"`{spec}`: file {str(file)!r} is not a readable tar archive "
                "(.tar.gz, .tar.bz2 or .tar.xz)"
            )
        raise SpecError(msg) from None
    return builder.snapshot


def _link_target(spec: str, archive: tarfile.TarFile, member: tarfile.TarInfo) -> tarfile.TarInfo:
    try:
        return archive.getmember(member.linkname)
    except KeyError:
        msg = f"`{spec}`: {member.name!r} is a hard link to {member.linkname!r}, which is missing"
        raise SpecError(msg) from None


def _common_top_dir(names: list[str]) -> str:
    """The `name-version/` directory every member of an sdist sits in ('' if there is none)."""
    tops = {name.split("/", 1)[0] for name in names}
    if len(tops) == 1 and all("/" in name for name in names):
        return tops.pop() + "/"
    return ""


def _open_wheel(spec: str, file: Path) -> Snapshot:
    builder = _SnapshotBuilder(spec, "wheel")
    try:
        with zipfile.ZipFile(file) as archive:
            files = [info for info in archive.infolist() if not info.is_dir()]
            # RECORD is read first, so each file's RECORD digest is taken in the same pass.
            record = _read_wheel_record(spec, archive, files)
            digests = {}
            for info in files:
                unix_mode = info.external_attr >> 16
                mode = _file_mode(unix_mode) if unix_mode else MODE_FILE
                algorithm = _record_algorithm(record.get(info.filename))
                with archive.open(info) as stream:
                    digest = builder.add_file(
                        os.fsencode(info.filename), mode, info.file_size, stream, algorithm
                    )
                if digest is not None:
                    digests[info.filename] = digest
    except (zipfile.BadZipFile, OSError) as error:
        msg = f"`{spec}`: cannot read wheel {str(file)!r}: {error}"
        raise SpecError(msg) from None
    snapshot = builder.snapshot
    present = {info.filename for info in files}
    snapshot.record_mismatches = [
        mismatch
        for path, hash_field in record.items()
        if (mismatch := _record_mismatch(path, hash_field, path in present, digests.get(path)))
    ]
    return snapshot


def _read_wheel_record(
    spec: str, archive: zipfile.ZipFile, files: list[zipfile.ZipInfo]
) -> dict[str, str]:
    """The hashed rows of the wheel's RECORD, path -> `algorithm=digest`, in RECORD's order."""
    info = next((i for i in files if i.filename.endswith(".dist-info/RECORD")), None)
    if info is None:
        return {}
    if info.file_size > LARGE_FILE_BYTES:
        msg = f"`{spec}`: {info.filename} holds {info.file_size} bytes; a RECORD is small"
        raise SpecError(msg)
    text = archive.read(info).decode("utf-8", "replace")
    try:
        rows = list(csv.reader(text.splitlines()))
    except csv.Error as error:
        msg = f"`{spec}`: {info.filename} is not a valid RECORD (CSV): {error}"
        raise SpecError(msg) from None
    # RECORD lists itself (and maybe .pyc files) without a hash; a path listed twice keeps
    # its last row.
    return {row[0]: row[1] for row in rows if len(row) >= 2 and row[1]}


#: Hash algorithms a RECORD may name: hashlib's guaranteed ones of fixed length.
_RECORD_ALGORITHMS = frozenset(hashlib.algorithms_guaranteed) - {"shake_128", "shake_256"}

#: Why a file fails its RECORD check, as a code (which records carry) and in words.
RECORD_PROBLEMS = {
    "missing": "listed in RECORD but missing",
    "content-differs": "content does not match its RECORD {algorithm} hash",
    "unknown-algorithm": "RECORD uses unknown hash algorithm {algorithm!r}",
}


def _record_algorithm(hash_field: str | None) -> str | None:
    algorithm = (hash_field or "").partition("=")[0]
    return algorithm if algorithm in _RECORD_ALGORITHMS else None


def _record_mismatch(
    path: str, hash_field: str, present: bool, digest: bytes | None
) -> dict[str, str] | None:
    """The RECORD problem of PATH, whose content has DIGEST by HASH_FIELD's algorithm; None if
    it matches. HASH_FIELD is a RECORD hash such as `sha256=<urlsafe base64>`."""
    algorithm, _, expected = hash_field.partition("=")
    if not present:
        code = "missing"
    elif algorithm not in _RECORD_ALGORITHMS or digest is None:
        code = "unknown-algorithm"
    elif base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != expected:
        code = "content-differs"
    else:
        return None
    return {
        "path": path,
        "code": code,
        "algorithm": algorithm,
        "problem": RECORD_PROBLEMS[code].format(algorithm=algorithm),
    }


def _open_installed(spec: str, name: str) -> Snapshot:
    try:
        distribution = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        msg = f"`{spec}`: distribution {name!r} is not installed in this environment"
        raise SpecError(msg) from None
    builder = _SnapshotBuilder(spec, "installed")
    snapshot = builder.snapshot
    for package_path in distribution.files or []:
        relative = package_path.as_posix()
        if ".." in package_path.parts:
            snapshot.outside_root.append(relative)
            continue
        location = Path(str(distribution.locate_file(package_path)))
        hash_field = (
            f"{package_path.hash.mode}={package_path.hash.value}" if package_path.hash else None
        )
        try:
            digest = _add_from_disk(
                builder, os.fsencode(relative), location, _record_algorithm(hash_field)
            )
        except FileNotFoundError:
            digest, present = None, False
        except OSError as error:
            msg = f"`{spec}`: cannot read {str(location)!r}: {error.strerror}"
            raise SpecError(msg) from None
        else:
            present = True
        if hash_field is None and present:
            continue
        mismatch = _record_mismatch(relative, hash_field or "", present, digest)
        if mismatch:
            snapshot.record_mismatches.append(mismatch)
    return snapshot


def _hash_tree(entries: dict[bytes, Entry]) -> str:
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
