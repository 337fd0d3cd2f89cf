"""``kvquant check`` input handling: a bad ``--json OUT`` is refused before the (slow) run.

Every way a path can be unwritable is tested on ``output_problem`` (test_output.py); here, that
the command asks it before it runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvquant.__main__ import main


def test_check_refuses_json_that_is_a_directory_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--device", "cpu", "--json", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: --json {tmp_path} is a folder; expected a file path\n"
    assert captured.out == ""


def test_check_refuses_json_below_a_file_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a_file").write_text("keep me\n")
    out = tmp_path / "a_file" / "out.json"
    assert main(["check", "--device", "cpu", "--json", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"error: --json {out} cannot be created: {out.parent} is a file, not a folder\n"
    )
    assert (tmp_path / "a_file").read_text() == "keep me\n"
