"""Running git plumbing with a predictable configuration.

Every call ignores the user's global and system git configuration, so that the diff matches
plain `git diff -M` on any machine, and turns a failure into a one-line `GitError`.
"""

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from forkaudit._errors import GitError

_ISOLATED_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}


def run_git(
    git_dir: Path,
    args: Sequence[str],
    *,
    stdin: bytes | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> bytes:
    """Run `git --git-dir=GIT_DIR ARGS` and return its stdout; raise `GitError` on failure."""
    env = {**os.environ, **_ISOLATED_ENV, **(extra_env or {})}
    # A caller's GIT_DIR or GIT_INDEX_FILE must never redirect us to another repository.
    for inherited in ("GIT_DIR", "GIT_WORK_TREE", "GIT_OBJECT_DIRECTORY"):
        if inherited not in (extra_env or {}):
            env.pop(inherited, None)
    completed = subprocess.run(
        ["git", f"--git-dir={git_dir}", *args],
        input=stdin,
        capture_output=True,
        env=env,
        check=False,
    )
    if completed.returncode != 0:
        raise GitError(f"git {args[0]} failed in {git_dir}: {_last_message(completed.stderr)}")
    return completed.stdout


def _last_message(stderr: bytes) -> str:
    """Pick git's most telling line: the last `fatal:`/`error:` line, else the last line."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line]
    for line in reversed(lines):
        if line.startswith(("fatal:", "error:")):
            return line
    return lines[-1] if lines else "no message"
