"""output_problem: every way an output path can be unwritable, on real folders and files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvquant import output_problem


@pytest.fixture
def taken(tmp_path: Path) -> Path:
    path = tmp_path / "taken"
    path.write_text("keep me\n")
    return path


def test_paths_that_can_be_written_have_no_problem(tmp_path: Path, taken: Path) -> None:
    assert output_problem(tmp_path, "out", folder=True) is None
    assert output_problem(tmp_path / "new" / "deeper", "out", folder=True) is None
    assert output_problem(taken, "--json", folder=False) is None
    assert output_problem(tmp_path / "new" / "r.json", "--json", folder=False) is None
    assert not (tmp_path / "new").exists()


def test_a_relative_path_is_resolved_against_the_working_folder(
    tmp_path: Path, taken: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert output_problem(Path("new/r.json"), "--json", folder=False) is None
    assert output_problem(Path("taken/sub"), "out", folder=True) == (
        f"out taken/sub cannot be created: {taken.resolve()} is a file, not a folder"
    )


def test_a_file_where_a_folder_is_wanted_and_the_reverse(tmp_path: Path, taken: Path) -> None:
    assert output_problem(taken, "output folder", folder=True) == (
        f"output folder {taken} is a file; expected a folder"
    )
    assert output_problem(tmp_path, "`--json`", folder=False) == (
        f"`--json` {tmp_path} is a folder; expected a file path"
    )


@pytest.mark.parametrize("folder", [True, False])
def test_a_path_under_a_file_cannot_be_created(taken: Path, folder: bool) -> None:
    path = taken / "sub" / "r.json"
    assert output_problem(path, "out", folder=folder) == (
        f"out {path} cannot be created: {taken.resolve()} is a file, not a folder"
    )
    assert taken.read_text() == "keep me\n"


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes through any mode bits"
)
def test_paths_in_a_read_only_folder_are_not_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "r.json").write_text("{}")
    locked.chmod(0o500)
    (locked / "r.json").chmod(0o400)
    try:
        assert output_problem(locked / "new", "out", folder=True) == (
            f"out {locked / 'new'} cannot be created: {locked} is not writable"
        )
        assert output_problem(locked / "r.json", "--json", folder=False) == (
            f"--json {locked / 'r.json'} is not writable"
        )
    finally:
        locked.chmod(0o700)
