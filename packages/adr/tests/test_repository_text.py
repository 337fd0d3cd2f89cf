"""No session or issue numbers and no machine-local paths anywhere in the repository's text.

Code, comments and docs describe the system as it is; the history of how it got there stays in
git. A session or issue number in a comment points at a diary nobody keeps up, and a path under
one machine's home, temp folder or /opt works on no other. The check is the one a person runs by
hand, `git grep -nE` of the pattern below over every tracked file; tests' fixtures may hold such
text on purpose and are left out, and so are the generated locks, whose file URLs name where the
machine that wrote them keeps its wheels (data, rewritten by `nox -s lock`). One absolute path is
the project's own: INSTALL_PREFIX, where the infra guide, its images and its systemd units put
the checkout on a node.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# The machine paths are written with character classes so that this file does not match itself.
FORBIDDEN = r"[Ss]ession [0-9]|[Ii]ssue [0-9]|/r[o]ot/|/h[o]me/|/t[m]p/|/o[p]t/"
LEFT_OUT = [":(exclude,glob)**/tests/**/fixtures/**", ":(exclude)pylock.*.toml"]
INSTALL_PREFIX = "/" + "opt/kvcache-port"


def forbidden_lines(root: Path) -> list[str]:
    """`path:line:text` of every tracked text line under ``root`` that matches FORBIDDEN."""
    # The user's git configuration and a caller's GIT_DIR must not change what is searched.
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env |= {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(
        ["git", "-C", str(root), "grep", "-nIE", FORBIDDEN, "--", ".", *LEFT_OUT],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode not in (0, 1):  # 1: nothing matched
        pytest.fail(f"git grep failed in {root}: {done.stderr.strip()}")
    return [
        line
        for line in done.stdout.splitlines()
        if re.search(
            FORBIDDEN, line.partition(":")[2].partition(":")[2].replace(INSTALL_PREFIX, "")
        )
    ]


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
    number, root_home, tmp_dir, opt = 7, "/" + "root/", "/" + "tmp/", "/" + "opt/"
    planted = {
        "docs/notes.md": ["# Decode", "", f"Measured in Session {number} on the H200."],
        "src/pkg/ops.py": ["x = 1", f"# see issue {number}, the cache write"],
        "configs/run.toml": [f'python = "{root_home}venv/bin/python"'],
        "infra/unit.service": [
            f"WorkingDirectory={INSTALL_PREFIX}",
            f"ExecStartPre=cp {INSTALL_PREFIX}/a.txt {tmp_dir}a.txt",
        ],
        "pylock.test.toml": [f'url = "file://{opt}pypi/files/x.whl"'],
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
        f"infra/unit.service:2:ExecStartPre=cp {INSTALL_PREFIX}/a.txt {tmp_dir}a.txt",
        f"src/pkg/ops.py:2:# see issue {number}, the cache write",
    ]
    message = _message(found)
    assert message.startswith("4 line(s) name a session or an issue number")
    assert message.splitlines()[1:] == found
