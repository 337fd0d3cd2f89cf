"""`kvbench throughput` and `kvbench history` refuse bad output paths and arguments up front, in
one line, before any cell runs or any database is made."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.__main__ import main
from kvbench.throughput import History

# One kernel cell: had the command got as far as running it, the output folder would exist.
_MATRIX = """
[kernel_shape]
num_q_heads = 4
num_kv_heads = 2
head_size = 64
cpu_runs = 1
[[kernel]]
op = "cache_write"
cache_dtype = "int8"
batch = 1
context = 32
"""


@pytest.fixture
def matrix(tmp_path: Path) -> Path:
    path = tmp_path / "kernel.toml"
    path.write_text(_MATRIX)
    return path


def test_outputs_are_checked_before_the_run_and_left_alone(
    tmp_path: Path, matrix: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every way a path can be unwritable is tested on kvquant's `output_problem` (its
    # tests/test_output.py);
    # here, that the command asks it for both outputs before it measures or opens the history.
    taken = tmp_path / "taken"
    taken.write_text("keep me\n")
    history = tmp_path / "h.sqlite3"
    argv = ["throughput", "--matrix", str(matrix), "--history", f"sqlite:///{history}"]
    assert main([*argv, "--out", str(taken)]) == 2
    assert capsys.readouterr().err == f"error: output folder {taken} is a file; expected a folder\n"
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out), "--json", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err == f"error: `--json` {tmp_path} is a folder; expected a file path\n"
    )
    assert taken.read_text() == "keep me\n"
    assert not out.exists() and not history.exists()


def test_history_without_a_database_says_so_and_creates_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "typo.db"
    assert main(["history", "--history", f"sqlite:///{path}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"error: no history at {path}: the file does not exist "
        "(`kvbench throughput` creates it on its first run)\n"
    )
    assert not path.exists()


def test_history_of_an_existing_empty_database_lists_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'h.sqlite3'}"
    History(url).close()
    assert main(["history", "--history", url]) == 0
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_history_limit_must_be_positive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], limit: str
) -> None:
    url = f"sqlite:///{tmp_path / 'h.sqlite3'}"
    History(url).close()
    assert main(["history", "--history", url, "--limit", limit]) == 2
    assert capsys.readouterr().err == f"error: `--limit` is {limit}; expected >= 1\n"
