"""The command line: outputs, exit codes, and a one-line error (never a traceback) for bad input."""

import json
import shutil
from pathlib import Path

import git
import pytest

from forkaudit.__main__ import main

from conftest import Repos


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_diff_writes_json_markdown_and_patch(
    repos: Repos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    code, stdout, _ = _run(
        capsys,
        "diff",
        "--fork",
        str(repos.fork),
        "--upstream",
        f"git:{repos.upstream}@v0.1.1",
        "--json",
        str(out / "a.json"),
        "--markdown",
        str(out / "a.md"),
        "--patch",
        str(out / "a.patch"),
    )
    assert code == 0
    assert "total 11" in stdout
    document = json.loads((out / "a.json").read_text())
    assert set(document) >= {
        "summary",
        "files",
        "env_vars",
        "semantic",
        "verdict",
        "history",
        "left_out",
    }
    assert (out / "a.patch").read_bytes().count(b"\ndiff --git ") + 1 == 11
    assert "## Verdict" in (out / "a.md").read_text()


def test_fail_on_surprise_exits_1(repos: Repos, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["diff", "--fork", str(repos.fork), "--upstream", f"git:{repos.upstream}@v0.1.1"]
    assert _run(capsys, *argv, "--fail-on-surprise")[0] == 1
    same = [
        "diff",
        "--fork",
        f"{repos.upstream}@v0.1.1",
        "--upstream",
        f"git:{repos.upstream}@v0.1.1",
    ]
    assert _run(capsys, *same, "--fail-on-surprise")[0] == 0


def test_find_base_prints_best_and_json(repos: Repos, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = _run(
        capsys,
        "find-base",
        "--fork",
        str(repos.fork2),
        "--upstream-repo",
        str(repos.upstream),
        "--candidates",
        "v0.1.1..v0.2.0",
        "--json",
        "-",
    )
    assert code == 0
    assert json.loads(stdout)["best"] == {"commit": repos.commits["c4"], "files_changed": 2}


@pytest.fixture
def bad_inputs(repos: Repos, tmp_path: Path) -> dict[str, list[str]]:
    empty = tmp_path / "empty"
    git.Repo.init(empty)
    plain = tmp_path / "plain"
    plain.mkdir()
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"not a tarball")
    corrupt = tmp_path / "corrupt"
    shutil.copytree(repos.fork, corrupt)
    tree = git.Repo(corrupt).head.commit.tree.hexsha
    loose = corrupt / ".git" / "objects" / tree[:2] / tree[2:]
    loose.chmod(0o644)
    loose.write_bytes(b"\x78\x9c garbage")
    rules = tmp_path / "rules.toml"
    rules.write_text('title = "x"\ntypo = 1\n[[group]]\ntitle = "a"\narea = "a"\n')
    negative = tmp_path / "negative.toml"
    negative.write_text('[[group]]\ntitle = "a"\narea = "a"\n[history]\nfiles_per_topic = -3\n')
    upstream = f"git:{repos.upstream}@v0.1.1"
    diff_fork = ["diff", "--fork", str(repos.fork), "--upstream", upstream]
    find_base = ["find-base", "--fork", str(repos.fork2), "--upstream-repo", str(repos.upstream)]
    return {
        "missing path": ["diff", "--fork", str(tmp_path / "nowhere"), "--upstream", upstream],
        "not a git repository": ["diff", "--fork", str(plain), "--upstream", upstream],
        "unknown ref": ["diff", "--fork", f"{repos.fork}@no-such-ref", "--upstream", upstream],
        "empty repository": ["diff", "--fork", str(empty), "--upstream", upstream],
        "unreadable file": ["diff", "--fork", f"sdist:{garbage}", "--upstream", upstream],
        "corrupt object": ["diff", "--fork", str(corrupt), "--upstream", upstream],
        "unknown rules key": [*diff_fork, "--rules", str(rules)],
        "negative files_per_topic": [*diff_fork, "--rules", str(negative)],
        "mistyped scope": [*diff_fork, "--scope", "nonexist/", "--fail-on-surprise"],
        "mistyped scope in find-base": [
            *find_base,
            "--candidates",
            "v0.1.1..v0.2.0",
            "--scope",
            "zz/",
        ],
        "reversed range": [*find_base, "--candidates", "v0.2.0..v0.1.1"],
        "missing option": ["diff", "--fork", str(repos.fork)],
        "unwritable output": [*diff_fork, "--json", str(plain / "no" / "x.json")],
        "output is a folder": [*find_base, "--candidates", "v0.1.1..v0.2.0", "--json", str(plain)],
        "bad candidates": [*find_base, "--candidates", "v9..v10"],
    }


EXPECTED_MESSAGES = {
    "missing path": "does not exist",
    "not a git repository": "is not a git repository",
    "unknown ref": "unknown ref 'no-such-ref'",
    "empty repository": "is empty",
    "unreadable file": "garbage.tar.gz' is not a readable tar archive (.tar.gz, .tar.bz2 or ",
    "corrupt object": "git ls-tree failed",
    "unknown rules key": "unknown key `typo`",
    "negative files_per_topic": "`files_per_topic` must be a positive integer, got -3",
    "mistyped scope": "scope 'nonexist/' matches no file of the fork or the upstream",
    "mistyped scope in find-base": "scope 'zz/' matches no file of the fork or of any candidate",
    "reversed range": "'v0.2.0..v0.1.1' is empty: 'v0.1.1' is an ancestor of 'v0.2.0'",
    "missing option": "the following arguments are required: --upstream",
    "unwritable output": "x.json: the directory",
    "output is a folder": "is a directory; expected a file path",
    "bad candidates": "unknown ref 'v9'",
}


@pytest.mark.parametrize("case", sorted(EXPECTED_MESSAGES))
def test_bad_input_is_one_line_and_exit_2(
    case: str, bad_inputs: dict[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, stderr = _run(capsys, *bad_inputs[case])
    assert code == 2
    assert stderr.count("\n") == 1, stderr
    assert stderr.startswith("forkaudit: error: ")
    assert EXPECTED_MESSAGES[case] in stderr
    assert "Traceback" not in stderr


def test_bad_input_leaves_earlier_outputs_alone(
    repos: Repos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "audit.json"
    report.write_text('{"kept": true}\n')
    code, stdout, stderr = _run(
        capsys,
        "diff",
        "--fork",
        str(repos.fork),
        "--upstream",
        f"git:{repos.upstream}@v0.1.1",
        "--scope",
        "vlm/",
        "--json",
        str(report),
    )
    assert (code, stdout) == (2, "")
    assert "scope 'vlm/'" in stderr
    assert report.read_text() == '{"kept": true}\n'


@pytest.mark.parametrize("through_a_link", [False, True])
def test_an_output_in_a_missing_folder_is_refused_before_any_output_is_written(
    repos: Repos, tmp_path: Path, capsys: pytest.CaptureFixture[str], through_a_link: bool
) -> None:
    report = tmp_path / "audit.json"
    report.write_text('{"kept": true}\n')
    missing = tmp_path / "no-such-folder" / "audit.patch"
    patch = tmp_path / "audit.patch" if through_a_link else missing
    if through_a_link:
        patch.symlink_to(missing)
    code, stdout, stderr = _run(
        capsys,
        *["diff", "--fork", str(repos.fork), "--upstream", f"git:{repos.upstream}@v0.1.1"],
        *["--json", str(report), "--patch", str(patch)],
    )
    assert (code, stdout) == (2, "")
    assert stderr == (
        f"forkaudit: error: --patch {patch}: the directory {missing.parent.resolve()} does not "
        "exist\n"
    )
    assert report.read_text() == '{"kept": true}\n'
