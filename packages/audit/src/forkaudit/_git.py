"""Running git so that no configuration can make it execute anything.

git reads a repository's own configuration, and several keys there name commands that git runs
on its own accord: `core.fsmonitor` (run by any command that looks at the index, `diff-tree
--stdin` among them), hooks and `core.hooksPath`, filter drivers (clean, smudge, process), diff
drivers (textconv, command), `diff.external`, `core.pager`. A repository that arrives as a
tarball is hostile input, so an audited repository is never handed to git as itself: git reads it
through a *view* (`RepositoryView`), a git directory of forkaudit's own whose config it writes
(bare, the repository's object format and ref storage, nothing else), which borrows the
repository's objects as an alternate and links its refs, `packed-refs`, `HEAD`'s target,
`shallow` and `info/grafts`. The repository's config, hooks, `info/attributes` and work tree are
never read. Every call also runs without the user's global and system configuration, without any
`GIT_*` variable of the caller's (`GIT_CONFIG_PARAMETERS`, `GIT_EXTERNAL_DIFF`, `GIT_DIR`...),
without replace refs (which would show other objects than the repository's), and never fetches a
missing object. A failure is one line, a `GitError`.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

from forkaudit._errors import GitError

_ISOLATED_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_NO_LAZY_FETCH": "1",
    "GIT_OPTIONAL_LOCKS": "0",
    "LC_ALL": "C",
}
# A repository's HEAD names a ref or a commit in a line; its config is a few hundred bytes.
_MAX_HEAD_BYTES = 4096
_MAX_CONFIG_BYTES = 1 << 20
# The extensions a view keeps: the ones that say how objects and refs are stored. Every other one
# (a partial clone's promisor remote, worktree config) would only make git do more than read.
_KEPT_EXTENSIONS = ("objectformat", "refstorage")


def run_git(
    git_dir: Path,
    args: Sequence[str],
    *,
    stdin: bytes | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> bytes:
    """Run `git --git-dir=GIT_DIR ARGS` and return its stdout; raise `GitError` on failure.

    GIT_DIR is forkaudit's own: its scratch repository or a `RepositoryView`, never an audited
    repository itself.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env |= _ISOLATED_ENV | dict(extra_env or {})
    completed = subprocess.run(
        ["git", f"--git-dir={git_dir}", *args],
        input=stdin,
        capture_output=True,
        env=env,
        cwd=git_dir,
        check=False,
    )
    if completed.returncode != 0:
        raise GitError(f"git {args[0]} failed in {git_dir}: {_last_message(completed.stderr)}")
    return completed.stdout


class RepositoryView:
    """A git directory through which git reads the repository at ``common_dir`` (its common git
    directory) and nothing of its configuration; removed when the view is collected or the
    process exits."""

    def __init__(self, common_dir: Path) -> None:
        source = common_dir.resolve()
        self.source = source
        self.git_dir = Path(tempfile.mkdtemp(prefix="forkaudit-view-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.git_dir, True)
        try:
            self._build(source)
        except OSError as error:
            self._cleanup()
            msg = f"cannot read the repository {source}: {error.strerror or error}"
            raise GitError(msg) from None

    def _build(self, source: Path) -> None:
        view = self.git_dir
        (view / "objects" / "info").mkdir(parents=True)
        (view / "objects" / "info" / "alternates").write_text(f"{source / 'objects'}\n")
        for name in ("refs", "packed-refs", "reftable", "shallow"):
            if os.path.lexists(source / name):
                (view / name).symlink_to(source / name)
        if not (view / "refs").exists():
            (view / "refs").mkdir()
        if os.path.lexists(source / "info" / "grafts"):
            (view / "info").mkdir()
            (view / "info" / "grafts").symlink_to(source / "info" / "grafts")
        (view / "HEAD").write_text(_head(source / "HEAD"))
        (view / "config").write_text(_config(source / "config"))


def _read_small(path: Path, limit: int) -> str:
    """A small text file of the repository, refusing anything but a regular file (a FIFO would
    block the reader) or one over LIMIT bytes; '' when it is absent."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return ""
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            msg = f"{path} is not a regular file"
            raise GitError(msg)
        data = file.read(limit + 1)
    if len(data) > limit:
        msg = f"{path} holds more than {limit} bytes; expected a small text file"
        raise GitError(msg)
    return data.decode("utf-8", "replace")


def _head(path: Path) -> str:
    """The repository's HEAD as a view states it: a symbolic ref or a commit id."""
    if path.is_symlink():  # a HEAD of old gits: a link to the branch's ref file
        return f"ref: {path.readlink()}\n"
    head = _read_small(path, _MAX_HEAD_BYTES).strip()
    if not head:
        msg = f"{path} is missing or empty; a repository has a HEAD"
        raise GitError(msg)
    return head + "\n"


_SECTION = re.compile(r"\s*\[\s*([A-Za-z0-9.-]+)\s*(?:\"[^\"]*\")?\s*\]\s*(.*)")
_ENTRY = re.compile(r"\s*([A-Za-z][A-Za-z0-9-]*)\s*=\s*\"?([^\"#;\s]*)\"?")


def _config(path: Path) -> str:
    """The view's config: a bare repository with the format version and the storage extensions
    of the repository's own config (`_KEPT_EXTENSIONS`), and nothing else of it."""
    section, version, extensions = "", "0", {}
    for line in _read_small(path, _MAX_CONFIG_BYTES).splitlines():
        header = _SECTION.match(line)
        if header:
            section, line = header.group(1).lower(), header.group(2)
        entry = _ENTRY.match(line)
        if entry is None:
            continue
        key, value = entry.group(1).lower(), entry.group(2)
        if section == "core" and key == "repositoryformatversion":
            version = value
        elif section == "extensions" and key in _KEPT_EXTENSIONS:
            extensions[key] = value
    lines = ["[core]", f"\trepositoryformatversion = {version}", "\tbare = true"]
    if extensions:
        lines += ["[extensions]", *(f"\t{key} = {value}" for key, value in extensions.items())]
    return "\n".join(lines) + "\n"


def _last_message(stderr: bytes) -> str:
    """Pick git's most telling line: the last `fatal:`/`error:` line, else the last line."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line]
    for line in reversed(lines):
        if line.startswith(("fatal:", "error:")):
            return line
    return lines[-1] if lines else "no message"
