"""The lock that serialises the writers of one ADR directory: flock(2) on the directory itself.

The lock is taken on a file descriptor of the directory, so it belongs to the directory's inode:
every writer meets it, whatever path it names the directory by (relative, through a link, from
another working directory) and whatever its temp directory, and it leaves no file behind to show
up as untracked in the repository. The kernel drops it when its holder dies, so a killed writer
never leaves the directory locked.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

from adrkit._errors import AdrError

# How often a waiting writer tries again. An update takes well under a second, so a waiter
# loses at most a few percent of it to polling.
POLL_INTERVAL_S = 0.05


class DirectoryLock:
    """An exclusive lock on ``directory``, held from `acquire` until `release` or the end of the
    ``with`` block that `acquire` opens."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None

    def acquire(self, timeout: float) -> DirectoryLock:
        """Wait up to ``timeout`` seconds for the lock; a one-line `AdrError` if it stays held."""
        try:
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            msg = f"cannot open the ADR directory {self.directory} to lock it: {exc.strerror}"
            raise AdrError(msg) from None
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        msg = (
                            f"another adrkit update is holding the lock on {self.directory} "
                            f"(waited {timeout:g} s)"
                        )
                        raise AdrError(msg) from None
                    time.sleep(POLL_INTERVAL_S)
                except OSError as exc:
                    msg = (
                        f"cannot lock the ADR directory {self.directory}: {exc.strerror} "
                        "(adrkit locks it with flock(2), which its filesystem must support)"
                    )
                    raise AdrError(msg) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the lock
            self._fd = None

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
