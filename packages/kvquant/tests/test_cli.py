"""``kvquant check`` input handling: a bad ``--json OUT`` is refused before the (slow) run."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvquant.__main__ import main


def test_check_refuses_json_in_a_missing_directory_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "nodir" / "out.json"
    assert main(["check", "--device", "cpu", "--json", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: --json {out}: the directory {out.parent} does not exist\n"
    assert captured.out == ""  # no results table: the check did not run
    assert not out.parent.exists()


def test_check_refuses_json_that_is_a_directory_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--device", "cpu", "--json", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: --json {tmp_path} is a directory; expected a file path\n"
    assert captured.out == ""


def test_check_refuses_json_below_a_file_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a_file").write_text("keep me\n")
    out = tmp_path / "a_file" / "out.json"
    assert main(["check", "--device", "cpu", "--json", str(out)]) == 2
    assert capsys.readouterr().err == f"error: --json {out}: {out.parent} is not a directory\n"
    assert (tmp_path / "a_file").read_text() == "keep me\n"
