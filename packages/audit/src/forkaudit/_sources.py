"""Turning a SPEC into a snapshot (`_snapshot`): a git revision, a directory or an installed
distribution here, an sdist or a wheel in `_archives`, fetched from the package index by `_pypi`.
"""

import hashlib
import importlib.metadata
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import git

from forkaudit._archives import open_sdist, open_wheel
from forkaudit._distrecord import UNHASHED_NAMES, mismatch, record_algorithm, record_mismatch
from forkaudit._errors import GitError, SpecError
from forkaudit._git import RepositoryView, run_git
from forkaudit._pypi import fetch_from_index
from forkaudit._snapshot import (
    MODE_SYMLINK,
    Entry,
    ReadBudget,
    Snapshot,
    SnapshotBuilder,
    file_mode,
    member_path,
)


def open_spec(
    spec: str,
    *,
    scope: str | None = None,
    cache_dir: Path | None = None,
    budget: ReadBudget | None = None,
) -> Snapshot:
    """Read the snapshot a SPEC names; a plain PATH[@REV] means a git repository.

    SCOPE (a prefix such as `vllm/`) keeps only the paths under it; outside it nothing counts.
    BUDGET counts the bytes read (the audit's, shared by its sides; a new one if None).
    """
    snapshot = _open_unscoped(spec, cache_dir, budget or ReadBudget())
    if scope:
        prefix = os.fsencode(scope)
        snapshot.entries = {p: e for p, e in snapshot.entries.items() if p.startswith(prefix)}
        snapshot.record_mismatches = [
            m for m in snapshot.record_mismatches if m["path"].startswith(scope)
        ]
        # A name outside the root has no place in any subtree: it stays whatever the scope.
        snapshot.problems = [
            p
            for p in snapshot.problems
            if p["path"].startswith(scope) or p["code"] == "name-outside-root"
        ]
    return snapshot


def _open_unscoped(spec: str, cache_dir: Path | None, budget: ReadBudget) -> Snapshot:
    kind, _, target = spec.partition(":")
    if kind == "git":
        return _open_git(spec, target)
    if kind == "dir":
        return _open_dir(spec, Path(target), budget)
    if kind == "sdist":
        return open_sdist(spec, _existing_file(spec, target), budget)
    if kind == "wheel":
        return open_wheel(spec, _existing_file(spec, target), budget)
    if kind == "pypi":
        return open_sdist(spec, fetch_from_index(spec, target, "sdist", cache_dir), budget)
    if kind == "pypi-wheel":
        return open_wheel(spec, fetch_from_index(spec, target, "wheel", cache_dir), budget)
    if kind == "installed":
        return _open_installed(spec, target, budget)
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


def _open_dir(spec: str, root: Path, budget: ReadBudget) -> Snapshot:
    if not root.is_dir():
        msg = f"`{spec}`: directory {str(root)!r} does not exist"
        raise SpecError(msg)
    builder = SnapshotBuilder(spec, "dir", budget)
    for relative, absolute in _walk_files(os.fsencode(root)):
        try:
            _add_from_disk(builder, relative, Path(os.fsdecode(absolute)))
        except OSError as error:
            msg = f"`{spec}`: cannot read {os.fsdecode(absolute)!r}: {error.strerror}"
            raise SpecError(msg) from None
    return builder.finish()


def _add_from_disk(
    builder: SnapshotBuilder, path: bytes, location: Path, digest_name: str | None = None
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
        return builder.add_file(path, file_mode(st.st_mode), st.st_size, stream, digest_name)


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


_UNHASHED_SUFFIXES = tuple(f".dist-info/{name}" for name in UNHASHED_NAMES)


def _open_installed(spec: str, name: str, budget: ReadBudget) -> Snapshot:
    """The files of an installed distribution: those its RECORD lists, checked against it, and
    every other file in the folders they lie in that no other installed distribution's RECORD
    lists (`not-listed`)."""
    try:
        distribution = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        msg = f"`{spec}`: distribution {name!r} is not installed in this environment"
        raise SpecError(msg) from None
    builder = SnapshotBuilder(spec, "installed", budget)
    snapshot = builder.snapshot
    root = Path(str(distribution.locate_file("")))
    listed = set()
    for package_path in distribution.files or []:
        relative = package_path.as_posix()
        if member_path(relative) is None:  # console scripts and data files: ../../bin/vllm
            snapshot.outside_root.append(relative)
            continue
        path = builder.place(relative)
        if path is None:
            continue
        resolved = os.fsdecode(path)
        listed.add(resolved)
        hash_field = (
            f"{package_path.hash.mode}={package_path.hash.value}" if package_path.hash else ""
        )
        digest, present = _read_installed(spec, builder, path, root / resolved, hash_field)
        # RECORD lists itself, and the bytecode the installer compiled (checked against its
        # source by the audit), without a hash.
        if not hash_field and present and resolved.endswith((".pyc", *_UNHASHED_SUFFIXES)):
            continue
        found = record_mismatch(resolved, hash_field, present, digest)
        if found:
            snapshot.record_mismatches.append(found)
    for relative in _unlisted(root, listed):
        path = builder.place(relative, normal=False)
        if path is not None:
            _read_installed(spec, builder, path, root / relative, "")
            if not relative.endswith(".pyc"):
                snapshot.record_mismatches.append(mismatch(relative, "not-listed"))
    return builder.finish()


def _read_installed(
    spec: str, builder: SnapshotBuilder, path: bytes, location: Path, hash_field: str
) -> tuple[bytes | None, bool]:
    """Add the installed file at LOCATION as PATH: its digest by HASH_FIELD's algorithm, and
    whether it is there."""
    try:
        digest = _add_from_disk(builder, path, location, record_algorithm(hash_field))
    except FileNotFoundError:
        return None, False
    except OSError as error:
        msg = f"`{spec}`: cannot read {str(location)!r}: {error.strerror}"
        raise SpecError(msg) from None
    return digest, True


def _unlisted(root: Path, listed: set[str]) -> list[str]:
    """The files in the folders of the distribution's files (its packages, its dist-info) that
    neither its RECORD nor any other distribution's installed there lists."""
    folders = sorted({path.split("/", 1)[0] for path in listed if "/" in path})
    others = {
        member_path(str(file)) or ""
        for other in importlib.metadata.distributions(path=[str(root)])
        for file in other.files or []
    }
    found = []
    for folder in folders:
        if not (root / folder).is_dir() or (root / folder).is_symlink():
            continue
        for relative, _absolute in _walk_files(os.fsencode(root / folder)):
            path = f"{folder}/{os.fsdecode(relative)}"
            if path not in listed and path not in others:
                found.append(path)
    return found
