"""No session or issue numbers and no machine-local paths anywhere in the repository's text.

Code, comments and docs describe the system as it is; the history of how it got there stays in
git. A session or issue number in a comment points at a diary nobody keeps up, and a path under
one machine's root home works on no other. The check is the one a person runs by hand,
`git grep -nE` of the pattern below over every tracked file; tests' fixtures may hold such text
on purpose and are left out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# The root home is written with a character class so that this file does not match itself.
FORBIDDEN = r"[Ss]ession [0-9]|[Ii]ssue [0-9]|/r[o]ot/"
FIXTURES = ":(exclude,glob)**/tests/**/fixtures/**"


def forbidden_lines(root: Path) -> list[str]:
    """`path:line:text` of every tracked text line under ``root`` that matches FORBIDDEN."""
    # The user's git configuration and a caller's GIT_DIR must not change what is searched.
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env |= {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(
        ["git", "-C", str(root), "grep", "-nIE", FORBIDDEN, "--", ".", FIXTURES],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode not in (0, 1):  # 1: nothing matched
        pytest.fail(f"git grep failed in {root}: {done.stderr.strip()}")
    return done.stdout.splitlines()


def _message(lines: list[str]) -> str:
    return (
        f"{len(lines)} line(s) name a session or an issue number, or a machine-local path; say "
        "what the code does and why, and point at a DESIGN.md section instead:\n" + "\n".join(lines)
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_repository_names_no_session_issue_or_machine_path() -> None:
    if not (REPO / ".git").exists():
        pytest.skip(f"{REPO} is not a git checkout (an installed copy of the tests)")
    lines = forbidden_lines(REPO)
    assert not lines, _message(lines)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_planted_lines_are_found_and_fixtures_are_left_out(tmp_path: Path) -> None:
    # Built from parts, so that this file itself holds none of them.
    number, root_home = 7, "/" + "root/"
    planted = {
        "docs/notes.md": ["# Decode", "", f"Measured in Session {number} on the H200."],
        "src/pkg/ops.py": ["x = 1", f"# see issue {number}, the cache write"],
        "configs/run.toml": [f'python = "{root_home}venv/bin/python"'],
        "src/pkg/tests/fixtures/diary.md": [f"session {number}: kept on purpose"],
        "README.md": [
            "Sessions and issues are fine words, and issue #12 has no digit after the space."
        ],
    }
    for name, lines in planted.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    (tmp_path / "untracked.md").write_text(f"session {number}\n")  # git grep reads tracked files
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, env=env)
    subprocess.run(["git", "-C", str(tmp_path), "add", *planted], check=True, env=env)

    found = forbidden_lines(tmp_path)

    assert found == [
        f'configs/run.toml:1:python = "{root_home}venv/bin/python"',
        f"docs/notes.md:3:Measured in Session {number} on the H200.",
        f"src/pkg/ops.py:2:# see issue {number}, the cache write",
    ]
    message = _message(found)
    assert message.startswith("3 line(s) name a session or an issue number")
    assert message.splitlines()[1:] == found
