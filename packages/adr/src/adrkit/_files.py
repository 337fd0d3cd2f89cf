"""Reading a file without trusting it, and replacing files so that a reader, or a crash, sees the
old file or the new one, never a mix.

A read opens the path once, refuses anything but a regular file (a FIFO would block the reader,
a device never end) and reads at most a capped number of bytes, so a wrong path is a one-line
error, not a hang or an exhausted memory.

New content goes to a temp file beside its target (same filesystem, so the rename is atomic), is
flushed to disk, and is renamed over the target. A process killed before the rename leaves the
target untouched and its temp file behind. Temp files carry adrkit's own suffix, so
`remove_stale_temps` can tell them from anyone else's hidden files; only a caller that holds the
lock every writer of the directory takes may call it, because only then is every temp file it
finds one whose writer is dead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from adrkit._errors import AdrError

TEMP_SUFFIX = ".adrkit.tmp"
_READ_CHUNK = 2**20


class FileReadError(Exception):
    """Raised when a file cannot be read as a regular file within its size cap; the message says
    why ("not a regular file"), without the path, which the caller names."""


def read_capped(path: Path, limit: int, *, follow_links: bool = True) -> bytes:
    """The bytes of the regular file at ``path``, refusing a file over ``limit`` bytes unread.

    ``follow_links=False`` refuses a symbolic link as the last component, for a path that was
    resolved and checked just before: a link put there since is not followed.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            msg = "a symbolic link, which is not followed"
            raise FileReadError(msg) from None
        raise FileReadError(exc.strerror or str(exc)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            msg = "not a regular file"
            raise FileReadError(msg)
        if info.st_size > limit:
            msg = f"{info.st_size} bytes, over the limit of {limit}"
            raise FileReadError(msg)
        # One byte more than allowed: a file that grows, or reports no size (as /proc files
        # do), is caught as well.
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, _READ_CHUNK))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise FileReadError(exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        msg = f"more than {limit} bytes, the limit"
        raise FileReadError(msg)
    return data


def write_temp(path: Path, data: bytes) -> Path:
    """Write ``data`` to a new temp file beside ``path``, synced to disk, with the permission
    bits of ``path`` (0o644 for a new file); the caller renames it over ``path``."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    tmp = path.parent / Path(tmp_name).name  # named as its target is, relative or not
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``."""
    tmp = write_temp(path, data)
    try:
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def is_temp_of(temp: Path, target: Path) -> bool:
    """Whether ``temp`` is a name `write_temp` gives to a temp file of ``target``."""
    return (
        temp.parent == target.parent
        and temp.name.startswith(f".{target.name}.")
        and temp.name.endswith(TEMP_SUFFIX)
    )


def remove_stale_temps(directory: Path) -> None:
    """Delete the temp files that writers killed before their rename left in ``directory``:
    regular files of adrkit's temp name; anything else of that name (a folder) is not adrkit's."""
    for stale in directory.glob(f".*{TEMP_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISREG(stale.lstat().st_mode):
                stale.unlink()


def fsync_directory(directory: Path) -> None:
    """Make the renames and removals done in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_declarations(path: Path, limit: int) -> dict[str, Any] | None:
    """A TOML file of declarations beside the ADRs (hardware, sources, decisions), read whole
    and at most ``limit`` bytes; None when there is no such file. Any fault is one line."""
    if not path.exists():
        return None
    try:
        return tomllib.loads(read_capped(path, limit).decode("utf-8"))
    except (FileReadError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:
        msg = f"cannot read {path}: {exc}"
        raise AdrError(msg) from None


def is_language_table(value: object) -> bool:
    """Whether ``value`` is a non-empty table of language = non-empty text."""
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(k, str) and isinstance(v, str) and v for k, v in value.items())
    )
