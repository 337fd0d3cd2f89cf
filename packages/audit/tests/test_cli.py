"""The command line: outputs, exit codes, and a one-line error (never a traceback) for bad input."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import git
import pytest

import forkaudit
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
    one_group = '[[group]]\ntitle = "a"\narea = "a"\n'
    negative = tmp_path / "negative.toml"
    negative.write_text(one_group + "[history]\nfiles_per_topic = -3\n")
    unpinned = tmp_path / "unpinned.toml"
    unpinned.write_text(one_group)
    gone = tmp_path / "gone.toml"
    gone.write_text(f'{one_group}[fork]\nsource = "git:{tmp_path / "gone"}@v1"\n')
    blank = tmp_path / "blank.toml"
    blank.write_text(f'{one_group}[upstream]\nsource = ""\n')
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
        "missing option": [*find_base],
        "side neither given nor pinned": [
            "diff",
            "--fork",
            str(repos.fork),
            "--rules",
            str(unpinned),
        ],
        "pinned side missing": ["diff", "--upstream", upstream, "--rules", str(gone)],
        "blank pin": [*diff_fork, "--rules", str(blank)],
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
    "missing option": "the following arguments are required: --candidates",
    "side neither given nor pinned": "no upstream given, and the rules",
    "pinned side missing": "gone@v1`: path",
    "blank pin": "[upstream]: `source` must name a SPEC such as 'pypi:vllm==0.18.1', got ''",
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


def _hashes(root: Path) -> dict[str, str]:
    """Every file under ROOT (links not followed) and the sha256 of its bytes."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


def _outputs(tmp_path: Path) -> Path:
    """A folder of earlier outputs that a refused run must leave byte for byte."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("audit.json", "audit.md", "audit.patch"):
        (out / name).write_text(f"earlier {name}\n")
    return out


def _deep_rules(tmp_path: Path) -> Path:
    rules = tmp_path / "deep.toml"
    depth = 50_000
    rules.write_text("x = " + "[" * depth + "]" * depth + "\n")
    return rules


def _deep_groups(tmp_path: Path) -> Path:
    rules = tmp_path / "groups.toml"
    header = "group" + ".sub" * 40
    rules.write_text(
        "".join(f'[[{header[: 5 + 4 * level]}]]\ntitle = "g{level}"\narea = "a"\n'
                for level in range(41))
    )  # fmt: skip
    return rules


def _huge_rules(tmp_path: Path) -> Path:
    rules = tmp_path / "huge.toml"
    rules.write_text('[[group]]\ntitle = "a"\narea = "a"\n' + "# padding\n" * 200_000)
    return rules


@pytest.mark.parametrize(
    ("make_rules", "message"),
    [
        (_deep_rules, "deep.toml: values nest too deeply to parse"),
        (_deep_groups, "groups nest more than 16 levels deep"),
        (_huge_rules, "is larger than 1048576 bytes; expected a small TOML file"),
    ],
)
def test_a_hostile_rules_file_is_one_line_exit_2_and_no_file_changes(
    repos: Repos,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make_rules: object,
    message: str,
) -> None:
    assert callable(make_rules)
    rules = make_rules(tmp_path)
    out = _outputs(tmp_path)
    before = _hashes(tmp_path)
    code, stdout, stderr = _run(
        capsys,
        *["diff", "--fork", str(repos.fork), "--upstream", f"git:{repos.upstream}@v0.1.1"],
        *["--rules", str(rules), "--fail-on-surprise", "--json", str(out / "audit.json")],
    )
    assert (code, stdout) == (2, "")
    assert stderr.startswith("forkaudit: error: invalid rules file: ")
    assert stderr.count("\n") == 1 and message in stderr
    assert _hashes(tmp_path) == before


def test_an_output_that_is_a_device_is_refused_before_the_audit(
    repos: Repos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _outputs(tmp_path)
    before = _hashes(tmp_path)
    code, stdout, stderr = _run(
        capsys,
        *["diff", "--fork", str(repos.fork), "--upstream", f"git:{repos.upstream}@v0.1.1"],
        *["--json", str(out / "audit.json"), "--markdown", "/dev/full"],
    )
    assert (code, stdout) == (2, "")
    assert stderr == (
        "forkaudit: error: --markdown /dev/full is not a regular file (a device or a pipe)\n"
    )
    assert _hashes(tmp_path) == before


def test_an_output_in_a_folder_that_takes_no_files_changes_no_output(
    repos: Repos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # As root, /sys passes every permission check, and then refuses to create the file.
    out = _outputs(tmp_path)
    before = _hashes(tmp_path)
    code, stdout, stderr = _run(
        capsys,
        *["diff", "--fork", str(repos.fork), "--upstream", f"git:{repos.upstream}@v0.1.1"],
        *["--json", str(out / "audit.json"), "--markdown", "/sys/x.md"],
    )
    assert (code, stdout) == (2, "")
    assert stderr.startswith("forkaudit: error: --markdown /sys/x.md")
    assert stderr.count("\n") == 1
    assert _hashes(tmp_path) == before
    assert not Path("/sys/x.md").exists()


# Runs the CLI with a limit on the size of any file it writes; past it, a write fails with
# EFBIG (SIGXFSZ ignored), as a full disk would fail it.
_LIMITED_RUN = """\
import resource, signal, sys
from forkaudit.__main__ import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.exit(main(sys.argv[2:]))
"""


def test_a_write_that_fails_midway_changes_no_output(repos: Repos, tmp_path: Path) -> None:
    # A fork whose patch is far larger than its JSON and Markdown: those fit under the limit,
    # the patch does not. Its repeated lines pack small, so git's own writes fit too.
    fork = tmp_path / "fork"
    shutil.copytree(repos.fork, fork)
    repo = git.Repo(fork)
    (fork / "docs" / "big.md").write_text("the same line, again and again\n" * 8_000)
    repo.git.add("--all")
    repo.git.commit("--quiet", "-m", "big")
    out = _outputs(tmp_path)
    before = _hashes(out)
    argv = ["diff", "--fork", str(fork), "--upstream", f"git:{repos.upstream}@v0.1.1"]
    argv += ["--json", str(out / "audit.json"), "--markdown", str(out / "audit.md")]
    argv += ["--patch", str(out / "audit.patch")]
    run = subprocess.run(
        [sys.executable, "-c", _LIMITED_RUN, str(100_000), *argv],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr == (
        f"forkaudit: error: --patch {out / 'audit.patch'}: cannot be written: File too large;"
        " of the output files, none changed\n"
    )
    assert _hashes(out) == before
    assert sorted(p.name for p in out.iterdir()) == ["audit.json", "audit.md", "audit.patch"]
    # Without the limit the same run writes all three, the patch over the limit.
    assert main(argv) == 0
    assert (out / "audit.patch").stat().st_size > 100_000
    assert (out / "audit.json").stat().st_size < 100_000


def test_two_outputs_naming_one_file_are_refused(
    repos: Repos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _outputs(tmp_path)
    before = _hashes(tmp_path)
    code, _, stderr = _run(
        capsys,
        *["diff", "--fork", str(repos.fork), "--upstream", f"git:{repos.upstream}@v0.1.1"],
        *["--json", str(out / "audit.json"), "--patch", str(out / "audit.json")],
    )
    assert code == 2
    assert stderr == f"forkaudit: error: --json and --patch both name {out / 'audit.json'}\n"
    assert _hashes(tmp_path) == before


# Deeper than Python's recursion limit, so deeper than any recursive walk can go.
NESTED_DEPTH = 1_500


@pytest.fixture
def nested_tree(tmp_path: Path) -> Iterator[Path]:
    """A tree with one file NESTED_DEPTH directories deep, made one level at a time (pathlib's
    makedirs recurses) and removed the same way: `shutil.rmtree`, and so pytest's cleanup of
    old temporary folders, would fail on it."""
    root = tmp_path / "nested"
    directory = root
    for _ in range(NESTED_DEPTH + 1):
        directory.mkdir()
        directory /= "d"
    deepest = directory.parent
    (deepest / "f.py").write_text("x = 1\n")
    yield root
    (deepest / "f.py").unlink()
    while deepest != root:
        deepest.rmdir()
        deepest = deepest.parent


@pytest.fixture
def hostile_sources(tmp_path: Path) -> dict[str, list[str]]:
    """Sources a careless or hostile fork could ship, that once crashed or hung the audit."""
    upstream = tmp_path / "upstream"
    (upstream / "vllm").mkdir(parents=True)
    (upstream / "vllm" / "envs.py").write_text("x = 1\n")
    pipe = tmp_path / "pipe"
    (pipe / "vllm").mkdir(parents=True)
    os.mkfifo(pipe / "vllm" / "fifo")
    bad_csv = tmp_path / "bad-csv.whl"
    with zipfile.ZipFile(bad_csv, "w") as wheel:
        wheel.writestr("vllm/envs.py", "x = 1\n")
        wheel.writestr("vllm-0.1.dist-info/RECORD", '"' + "x" * 200_000 + "\n")
    link = tmp_path / "link.tar.gz"
    with tarfile.open(link, "w:gz") as sdist:
        member = tarfile.TarInfo("vllm-0.1/vllm/envs.py")
        member.type, member.linkname = tarfile.LNKTYPE, "vllm-0.1/vllm/missing.py"
        sdist.addfile(member)
    against = ["--upstream", f"dir:{upstream}"]
    return {
        "a pipe in the tree": ["diff", "--fork", f"dir:{pipe}", *against],
        "a RECORD that is not CSV": ["diff", "--fork", f"wheel:{bad_csv}", *against],
        "a hard link to nothing": ["diff", "--fork", f"sdist:{link}", *against],
    }


HOSTILE_MESSAGES = {
    "a pipe in the tree": "fifo' is neither a file nor a symlink (a socket, pipe or device)",
    "a RECORD that is not CSV": "RECORD is not a valid RECORD (CSV): field larger than field",
    "a hard link to nothing": "'vllm-0.1/vllm/envs.py' is a hard link to 'vllm-0.1/vllm/missing",
}


@pytest.mark.parametrize("case", sorted(HOSTILE_MESSAGES))
def test_a_hostile_source_is_one_line_exit_2(
    case: str,
    hostile_sources: dict[str, list[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _outputs(tmp_path)
    before = _hashes(out)
    code, stdout, stderr = _run(capsys, *hostile_sources[case], "--json", str(out / "audit.json"))
    assert (code, stdout) == (2, "")
    assert stderr.startswith("forkaudit: error: ") and stderr.count("\n") == 1
    assert HOSTILE_MESSAGES[case] in stderr
    assert _hashes(out) == before


def test_hostile_content_that_is_still_a_tree_is_audited(tmp_path: Path, nested_tree: Path) -> None:
    # A tree nested deeper than Python's recursion limit; an envs.py the parser cannot hold; a
    # RECORD that names a hash of no fixed length.
    upstream = tmp_path / "upstream"
    (upstream / "vllm").mkdir(parents=True)
    (upstream / "vllm" / "envs.py").write_text("x = 1\n")
    (nested_tree / "vllm").mkdir()
    (nested_tree / "vllm" / "envs.py").write_text("x = " + "-" * 100_000 + "1\n")
    report = forkaudit.diff(f"dir:{nested_tree}", f"dir:{upstream}")
    assert {f.path.count("/") for f in report.files} == {1, NESTED_DEPTH}
    assert report.semantic["parse_errors"] == ["vllm/envs.py"]
    assert {a.question: a.answer for a in report.questions}["env_vars"] == "unknown"
    wheel = tmp_path / "shake.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/envs.py", "x = 1\n")
        archive.writestr("vllm-0.1.dist-info/RECORD", "vllm/envs.py,shake_128=abc,6\n")
    mismatches = forkaudit.diff(f"wheel:{wheel}", f"dir:{upstream}").record_mismatches["fork"]
    assert [(m["path"], m["code"]) for m in mismatches] == [("vllm/envs.py", "unknown-algorithm")]
