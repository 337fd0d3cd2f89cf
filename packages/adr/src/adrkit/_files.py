"""Replacing a file so that a reader, or a crash, sees the old file or the new one, never a mix.

The new content goes to a temp file beside the target (same filesystem, so the rename is atomic),
is flushed to disk, and is renamed over the target. A process killed before the rename leaves the
target untouched and its temp file behind; `remove_stale_temps` clears those, and only a caller
that holds the lock every writer of the directory takes may call it, or it could delete a live
writer's temp file.
"""

from __future__ import annotations

import glob
import os
import tempfile
from pathlib import Path

_TEMP_SUFFIX = ".tmp"


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


def atomic_write(path: Path, content: str | bytes) -> None:
    """Replace ``path`` with ``content``, keeping its permission bits (0o644 for a new file)."""
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path), suffix=_TEMP_SUFFIX)
    tmp = Path(tmp_name)
    try:
        data = content.encode("utf-8") if isinstance(content, str) else content
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.chmod(mode)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_stale_temps(path: Path) -> None:
    """Delete the temp files that writers of ``path`` killed before their rename left behind."""
    pattern = glob.escape(_temp_prefix(path)) + "*" + _TEMP_SUFFIX
    for stale in path.parent.glob(pattern):
        stale.unlink(missing_ok=True)
