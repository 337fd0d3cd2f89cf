"""An audited repository's own configuration can make git execute nothing.

A repository that arrives as a tarball is hostile input. Each test plants one way git could be
told to run a command (the command would create a marker file) and runs every git-reading path
of the audit on it: `diff` (the tree, its blobs, its history) with the repository as fork,
upstream and base, and `find-base` over a range (one `git diff-tree --stdin`).
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

import git
import pytest

from forkaudit.__main__ import main

from conftest import commit_tree

HOOKS = [
    "applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
    "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout",
    "post-merge", "pre-push", "pre-receive", "update", "proc-receive", "post-receive",
    "post-update", "reference-transaction", "push-to-checkout", "pre-auto-gc", "post-rewrite",
    "sendemail-validate", "fsmonitor-watchman", "p4-changelist", "p4-prepare-changelist",
    "p4-post-changelist", "p4-pre-submit", "post-index-change",
]  # fmt: skip


def _script(path: Path, marker: Path) -> str:
    """An executable at PATH that creates MARKER and prints nothing; its path, for git."""
    path.write_text(f"#!/bin/sh\ntouch '{marker}'\ncat >/dev/null 2>&1\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _fsmonitor(repo: git.Repo, command: str, home: Path) -> None:
    repo.git.config("core.fsmonitor", command)


def _hooks(repo: git.Repo, command: str, home: Path) -> None:
    hooks = home / "hooks"
    hooks.mkdir()
    own = Path(repo.git_dir) / "hooks"
    own.mkdir(exist_ok=True)
    for name in HOOKS:
        for folder in (hooks, own):
            (folder / name).write_text(f"#!/bin/sh\n{command}\n")
            (folder / name).chmod(0o755)
    repo.git.config("core.hooksPath", str(hooks))


def _filters(repo: git.Repo, command: str, home: Path) -> None:
    (Path(repo.git_dir) / "info").mkdir(exist_ok=True)
    (Path(repo.git_dir) / "info" / "attributes").write_text("* filter=evil\n")
    for key in ("clean", "smudge", "process"):
        repo.git.config(f"filter.evil.{key}", command)
    repo.git.config("filter.evil.required", "true")


def _textconv(repo: git.Repo, command: str, home: Path) -> None:
    (Path(repo.git_dir) / "info").mkdir(exist_ok=True)
    (Path(repo.git_dir) / "info" / "attributes").write_text("* diff=evil\n")
    repo.git.config("diff.evil.textconv", command)
    repo.git.config("diff.evil.cachetextconv", "false")


def _external_diff(repo: git.Repo, command: str, home: Path) -> None:
    (Path(repo.git_dir) / "info").mkdir(exist_ok=True)
    (Path(repo.git_dir) / "info" / "attributes").write_text("* diff=evil\n")
    repo.git.config("diff.external", command)
    repo.git.config("diff.evil.command", command)


def _pager(repo: git.Repo, command: str, home: Path) -> None:
    repo.git.config("core.pager", command)
    for name in ("diff", "show", "log", "diff-tree", "cat-file", "ls-tree", "rev-list"):
        repo.git.config(f"pager.{name}", command)


def _included(repo: git.Repo, command: str, home: Path) -> None:
    included = home / "included.config"
    included.write_text(f'[core]\n\tfsmonitor = "{command}"\n\tpager = "{command}"\n')
    repo.git.config("include.path", str(included))


def _committed_attributes(repo: git.Repo, command: str, home: Path) -> None:
    # A .gitattributes in the audited tree itself, with drivers in the repository's config.
    _filters(repo, command, home)
    repo.git.config("diff.evil.textconv", command)
    (Path(repo.git_dir) / "info" / "attributes").unlink()


VECTORS: dict[str, Callable[[git.Repo, str, Path], None]] = {
    "core.fsmonitor": _fsmonitor,
    "hooks and core.hooksPath": _hooks,
    "filter drivers": _filters,
    "diff textconv": _textconv,
    "external diff": _external_diff,
    "pager": _pager,
    "an included config file": _included,
    "attributes in the tree": _committed_attributes,
}


def _repository(root: Path) -> tuple[Path, list[str]]:
    """A repository with a work tree and three commits on main; the commit ids."""
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "Test")
        config.set_value("user", "email", "test@example.com")
    files = {
        ".gitattributes": b"* filter=evil diff=evil\n",
        "vllm/envs.py": b"environment_variables = {}\n",
        "vllm/a.py": b"A = 1\n",
    }
    commits = [commit_tree(repo, files, "one")]
    files["vllm/a.py"] = b"A = 2\n"
    commits.append(commit_tree(repo, files, "two"))
    files["vllm/b.py"] = b"B = 1\n"
    commits.append(commit_tree(repo, files, "three"))
    (root / "vllm" / "a.py").write_text("A = 'dirty work tree'\n")  # an index to refresh
    return root, commits


@pytest.mark.parametrize("vector", sorted(VECTORS))
def test_the_audited_repositorys_config_executes_nothing(
    vector: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "EXECUTED"
    command = _script(tmp_path / "payload.sh", marker)
    path, commits = _repository(tmp_path / "repo")
    VECTORS[vector](git.Repo(path), command, tmp_path)
    runs = [
        ["diff", "--fork", str(path), "--upstream", f"git:{path}@{commits[0]}", "--scope", ""],
        [
            *("diff", "--fork", f"git:{path}@{commits[1]}", "--upstream", f"git:{path}@main"),
            *("--base", f"git:{path}@{commits[0]}", "--scope", "vllm/"),
        ],
        [
            *("find-base", "--fork", f"dir:{path}", "--upstream-repo", str(path)),
            *("--candidates", f"{commits[0]}..main"),
        ],
    ]
    for argv in runs:
        assert main(argv) == 0, capsys.readouterr().err
        assert not marker.exists(), f"{vector}: `forkaudit {argv[0]}` ran the planted command"
    captured = capsys.readouterr()
    assert "vllm/b.py" in captured.out or "files changed" in captured.out


def test_the_callers_git_variables_execute_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "EXECUTED"
    command = _script(tmp_path / "payload.sh", marker)
    path, commits = _repository(tmp_path / "repo")
    monkeypatch.setenv("GIT_CONFIG_COUNT", "2")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.fsmonitor")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", command)
    monkeypatch.setenv("GIT_CONFIG_KEY_1", "core.pager")
    monkeypatch.setenv("GIT_CONFIG_VALUE_1", command)
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.fsmonitor'='{command}'")
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", command)
    monkeypatch.setenv("GIT_PAGER", command)
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    argv = ["find-base", "--fork", f"dir:{path}", "--upstream-repo", str(path)]
    assert main([*argv, "--candidates", f"{commits[0]}..main"]) == 0, capsys.readouterr().err
    assert main(["diff", "--fork", str(path), "--upstream", f"git:{path}@{commits[0]}"]) == 0
    assert not marker.exists()
    assert not (tmp_path / "elsewhere").exists()
