"""Reading an sdist (a tar archive) or a wheel (a zip archive) into a snapshot.

Every member name is normalized before anything sees it (`SnapshotBuilder.place`), every byte read
counts against the audit's budget, and every way an archive can be broken (not an archive, a
compression method no installer reads, an encrypted member, a corrupt or truncated stream, a size
or checksum that lies, a hard link to nothing) is one line, a `SpecError`, never a traceback.

A tar archive is read once, as a stream: a hard link is the entry of the earlier member it names
(no second read), and the compressed stream is read to its end afterwards, so a truncated
`.tar.gz` (or one whose checksum fails) is refused even where the tar part looks whole.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, cast

from forkaudit._distrecord import (
    UNHASHED_NAMES,
    mismatch,
    parse_record,
    record_algorithm,
    record_mismatch,
)
from forkaudit._errors import AuditError, SpecError
from forkaudit._snapshot import (
    LARGE_FILE_BYTES,
    MODE_EXECUTABLE,
    MODE_FILE,
    MODE_SYMLINK,
    ReadBudget,
    Snapshot,
    SnapshotBuilder,
    file_mode,
    member_path,
)

_READ_CHUNK = 1 << 20
# The compressions an sdist comes in, by the bytes its file starts with.
_DECOMPRESSORS: tuple[tuple[bytes, Callable[[BinaryIO], object]], ...] = (
    (b"\x1f\x8b", lambda raw: gzip.GzipFile(fileobj=raw, mode="rb")),
    (b"BZh", bz2.BZ2File),
    (b"\xfd7zXZ\x00", lzma.LZMAFile),
)
# What a broken archive raises while it is read: tarfile's and zipfile's own errors, the
# decompressors' (zlib, lzma; bz2 and gzip raise OSError), EOFError for a stream that ends early.
_ARCHIVE_ERRORS = (
    tarfile.TarError,
    zipfile.BadZipFile,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    OSError,
    ValueError,
)
# The zip compression methods installers read (pip reads wheels with zipfile).
_ZIP_METHODS = {
    zipfile.ZIP_STORED: "stored",
    zipfile.ZIP_DEFLATED: "deflate",
    zipfile.ZIP_BZIP2: "bzip2",
    zipfile.ZIP_LZMA: "lzma",
}


def open_sdist(spec: str, file: Path, budget: ReadBudget) -> Snapshot:
    """The files of the sdist FILE (a tar archive, plain or gzip, bzip2 or xz compressed), each
    without the `name-version/` folder they all lie in."""
    builder = SnapshotBuilder(spec, "sdist", budget)
    try:
        with file.open("rb") as raw, _decompressed(raw) as stream:
            with tarfile.open(fileobj=stream, mode="r|") as archive:
                for member in archive:
                    _add_tar_member(spec, builder, archive, member)
            # To the end of the compressed stream: a truncated one, or one whose checksum
            # fails, raises here even where the tar part ended cleanly.
            while stream.read(_READ_CHUNK):
                pass
    except AuditError:
        raise
    except _ARCHIVE_ERRORS as error:
        if isinstance(error, OSError) and error.strerror:  # the file itself: permissions, I/O
            msg = f"`{spec}`: cannot read sdist {str(file)!r}: {error.strerror}"
        else:
            msg = (
                f"`{spec}`: file {str(file)!r} is not a readable tar archive "
                f"(.tar.gz, .tar.bz2 or .tar.xz): {_why(error)}"
            )
        raise SpecError(msg) from None
    names = [os.fsdecode(path) for path in builder.snapshot.entries]
    return builder.finish(top=_common_top_dir(names))


def _decompressed(raw: BinaryIO) -> BinaryIO:
    """RAW's content, decompressed as the bytes it starts with say."""
    start = raw.read(6)
    raw.seek(0)
    for magic, opener in _DECOMPRESSORS:
        if start.startswith(magic):
            return cast(BinaryIO, opener(raw))
    return raw


def _why(error: BaseException) -> str:
    """A broken archive's problem in a few words."""
    if isinstance(error, EOFError):
        return "its compressed stream ends early (the file is truncated)"
    text = " ".join(str(error).split())
    return text.removeprefix("Error -3 while decompressing data: ") or type(error).__name__


def _add_tar_member(
    spec: str, builder: SnapshotBuilder, archive: tarfile.TarFile, member: tarfile.TarInfo
) -> None:
    if not (member.isfile() or member.issym() or member.islnk()):
        return  # folders, and what git could not track either (devices, FIFOs)
    path = builder.place(member.name)
    if path is None:
        return
    if member.issym():
        builder.add(path, os.fsencode(member.linkname), MODE_SYMLINK)
        return
    if member.islnk():
        # A hard link holds no data of its own: it is the earlier member it names.
        target = builder.snapshot.entries.get(os.fsencode(member_path(member.linkname) or ""))
        if target is None:
            msg = (
                f"`{spec}`: {member.name!r} is a hard link to {member.linkname!r}, which is not "
                "a member before it"
            )
            raise SpecError(msg)
        builder.snapshot.entries[path] = target
        return
    extracted = archive.extractfile(member)
    if extracted is None:  # a regular member always has a file object; nothing to read else
        return
    mode = MODE_EXECUTABLE if member.mode & stat.S_IXUSR else MODE_FILE
    with extracted:
        builder.add_file(path, mode, member.size, extracted)


def _common_top_dir(names: list[str]) -> str:
    """The `name-version/` directory every member of an sdist sits in ('' if there is none)."""
    tops = {name.split("/", 1)[0] for name in names}
    if len(tops) == 1 and all("/" in name for name in names):
        return tops.pop() + "/"
    return ""


def open_wheel(spec: str, file: Path, budget: ReadBudget) -> Snapshot:
    """The files of the wheel FILE, each checked against the wheel's RECORD as it is read."""
    builder = SnapshotBuilder(spec, "wheel", budget)
    try:
        archive = zipfile.ZipFile(file)
    except _ARCHIVE_ERRORS as error:
        why = error.strerror if isinstance(error, OSError) and error.strerror else _why(error)
        msg = f"`{spec}`: cannot read wheel {str(file)!r}: {why}"
        raise SpecError(msg) from None
    with archive:
        files = [info for info in archive.infolist() if not info.is_dir()]
        for info in files:  # every member's claim, before a byte is read
            _check_member(spec, info)
            budget.take(spec, info.filename, info.file_size)
        # RECORD is read first, so each file's RECORD digest is taken in the same pass.
        record_name, record = _read_wheel_record(spec, archive, files)
        digests, present = {}, set()
        for info in files:
            path = builder.place(info.filename)
            if path is None:
                continue
            resolved = os.fsdecode(path)
            present.add(resolved)
            unix_mode = info.external_attr >> 16
            mode = file_mode(unix_mode) if unix_mode else MODE_FILE
            algorithm = record_algorithm(record.get(resolved))
            with _member_errors(spec, info.filename), archive.open(info) as stream:
                digest = builder.add_file(
                    path, mode, info.file_size, stream, algorithm, budgeted=True
                )
            if digest is not None:
                digests[resolved] = digest
    snapshot = builder.finish()
    dist_info = record_name.rpartition("/")[0]
    unhashed = {f"{dist_info}/{name}" for name in UNHASHED_NAMES} if record_name else set()
    snapshot.record_mismatches = [
        found
        for path, hash_field in record.items()
        if not (path in unhashed and not hash_field)
        if (found := record_mismatch(path, hash_field, path in present, digests.get(path)))
    ]
    if record_name:
        snapshot.record_mismatches += [
            mismatch(path, "not-listed")
            for path in sorted(present - record.keys())
            if path not in unhashed
        ]
    return snapshot


def _check_member(spec: str, info: zipfile.ZipInfo) -> None:
    """Refuse, before anything is read, a member no installer could read either."""
    if info.flag_bits & 0x1:
        msg = f"`{spec}`: member {info.filename!r} is encrypted; a wheel's members are not"
        raise SpecError(msg)
    if info.compress_type not in _ZIP_METHODS:
        msg = (
            f"`{spec}`: member {info.filename!r} is compressed with zip method "
            f"{info.compress_type}; a wheel uses {', '.join(_ZIP_METHODS.values())}"
        )
        raise SpecError(msg)


@contextlib.contextmanager
def _member_errors(spec: str, name: str) -> Iterator[None]:
    """A member whose data is corrupt, or whose size or checksum lies, as one line."""
    try:
        yield
    except AuditError:
        raise
    except _ARCHIVE_ERRORS as error:
        msg = f"`{spec}`: member {name!r} cannot be read: {_why(error)}"
        raise SpecError(msg) from None


def _read_wheel_record(
    spec: str, archive: zipfile.ZipFile, files: list[zipfile.ZipInfo]
) -> tuple[str, dict[str, str]]:
    """The wheel's RECORD (`<name>.dist-info/RECORD` at its root, resolved), its name and its
    rows; '' and none without one."""
    info = next(
        (
            i
            for i in files
            if (path := member_path(i.filename)) is not None
            and path.count("/") == 1
            and path.endswith(".dist-info/RECORD")
        ),
        None,
    )
    if info is None:
        return "", {}
    if info.file_size > LARGE_FILE_BYTES:
        msg = f"`{spec}`: {info.filename} holds {info.file_size} bytes; a RECORD is small"
        raise SpecError(msg)
    with _member_errors(spec, info.filename):
        text = archive.read(info).decode("utf-8", "replace")
    return member_path(info.filename) or "", parse_record(spec, info.filename, text)
