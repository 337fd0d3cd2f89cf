"""Freshness: a record carries the hashes of the sources it measured, and the ADRs say when the
work tree's sources differ, naming the files and the commit, without any git history."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from adrkit import load_sources, milestone_problems, source_hashes, write_record
from adrkit.schema import Provenance, RecordError

from conftest import assert_one_line_error, make_record, run_update

REPO_ADR_DIR = Path(__file__).resolve().parents[3] / "docs" / "adr"
H200 = {"accelerator": "NVIDIA H200", "accelerator_arch": "sm_90"}
SOURCES = """\
root = ".."

[throughput]
what = { en = "the kernels", zh = "内核" }
files = ["pkg/ops/**/*.py"]
"""
ADR = """\
---
lang: en
---
# 0009 INT8

<!-- generated:decision-0009 begin -->
<!-- generated:decision-0009 end -->

<!-- generated:kvbench-kernel-throughput begin -->
<!-- generated:kvbench-kernel-throughput end -->
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A repository root that is no git checkout: two kernel files and an ADR directory that
    declares them as the throughput stage's sources."""
    for name, text in {"pkg/ops/decode.py": "x = 1\n", "pkg/ops/sub/write.py": "y = 2\n"}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "pkg/ops/notes.txt").write_text("not a source\n")
    adr_dir = tmp_path / "adr"
    adr_dir.mkdir()
    (adr_dir / "sources.toml").write_text(SOURCES)
    (adr_dir / "0009-int8.md").write_text(ADR)
    shutil.copy(REPO_ADR_DIR / "decisions.toml", adr_dir)
    return tmp_path


def _throughput(root: Path, *, hashed: bool = True) -> Path:
    """A results root holding one H200 throughput record of ``root``'s sources as they are."""
    record = make_record("throughput", run_id="gpu-1", ended_at="2026-12-01T10:00:00Z")
    sources = load_sources(root / "adr").hashes("throughput") if hashed else {}
    provenance = dataclasses.replace(record.provenance, hardware=H200, sources=sources or {})
    record = dataclasses.replace(
        record,
        provenance=provenance,
        metrics={"int8_bytes_per_token_vs_16bit": 0.5156},
        tables={"kernels": record.tables["findings"]},
    )
    results = root / "results"
    write_record(results, record)
    return results


def _adr(root: Path) -> str:
    return (root / "adr" / "0009-int8.md").read_text()


def test_the_hashes_are_of_the_globbed_files_bytes(tree: Path) -> None:
    hashes = source_hashes(tree, ["pkg/ops/**/*.py"])
    assert list(hashes) == ["pkg/ops/decode.py", "pkg/ops/sub/write.py"]
    assert hashes["pkg/ops/decode.py"] == hashlib.sha256(b"x = 1\n").hexdigest()


def test_unchanged_sources_leave_the_blocks_unmarked(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = _throughput(tree)
    code, err = run_update(capsys, tree / "adr", results)
    assert code == 0, err
    assert "stale" not in _adr(tree)
    assert "| `0123456789ab` |" in _adr(tree)  # the decision row names its evidence's commit


def test_a_changed_added_or_removed_source_marks_the_record_stale(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = _throughput(tree)
    (tree / "pkg/ops/decode.py").write_text("x = 2\n")
    (tree / "pkg/ops/prefill.py").write_text("z = 3\n")
    (tree / "pkg/ops/sub/write.py").unlink()
    (tree / "pkg/ops/notes.txt").write_text("changed, but matched by no glob\n")
    code, err = run_update(capsys, tree / "adr", results)
    assert code == 0, err
    note = (
        "stale: `pkg/ops/decode.py`, `pkg/ops/prefill.py`, `pkg/ops/sub/write.py` changed since "
        "`0123456789ab`"
    )
    text = _adr(tree)
    assert f"_{note}_" in text  # under the block's source line
    assert f"| `0123456789ab` ({note}) |" in text  # in the decision row
    problems = milestone_problems(tree / "adr", results, now=datetime(2026, 12, 2, tzinfo=UTC))
    assert (
        "decision-0009 row `kv-memory`: stale: pkg/ops/decode.py, pkg/ops/prefill.py, "
        "pkg/ops/sub/write.py changed since 0123456789ab"
    ) in problems


def test_more_than_three_changed_files_are_counted(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = _throughput(tree)
    for index in range(4):
        (tree / f"pkg/ops/new{index}.py").write_text("\n")
    run_update(capsys, tree / "adr", results)
    assert "`pkg/ops/new2.py` and 1 more changed since" in _adr(tree)


def test_a_record_without_hashes_cannot_be_judged_fresh(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = _throughput(tree, hashed=False)
    code, err = run_update(capsys, tree / "adr", results)
    assert code == 0, err
    assert (
        "stale: the record carries no hash of the kernels, so nothing shows them unchanged "
        "since `0123456789ab`"
    ) in _adr(tree)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('[throughput]\nwhat = { en = "k" }\nfiles = ["a/*.py"]\n', "`root` must be"),
        ('root = ".."\n[throughput]\nwhat = { en = "k" }\nfiles = ["../x/*.py"]\n', "no '..'"),
        ('root = ".."\n[throughput]\nfiles = ["a/*.py"]\n', "exactly `what` and `files`"),
        ('root = ".."\n["Through put"]\nwhat = { en = "k" }\nfiles = ["a"]\n', "not a stage name"),
    ],
)
def test_a_bad_sources_file_is_one_line_and_exit_2(
    tree: Path, capsys: pytest.CaptureFixture[str], text: str, fragment: str
) -> None:
    results = _throughput(tree)
    (tree / "adr" / "sources.toml").write_text(text)
    code, err = run_update(capsys, tree / "adr", results)
    assert code == 2
    assert_one_line_error(err, "sources.toml", fragment)


@pytest.mark.parametrize(
    "sources",
    [{"/etc/passwd": "0" * 64}, {"a/../b.py": "0" * 64}, {"a.py": "xyz"}, {"a b.py": "0" * 64}],
)
def test_provenance_refuses_a_source_that_is_no_relative_path_and_digest(
    sources: dict[str, str],
) -> None:
    with pytest.raises(RecordError, match=r"provenance\.sources"):
        Provenance(
            run_id="r", started_at="2026-12-01T00:00:00Z", ended_at="2026-12-01T00:00:00Z",
            sources=sources,
        )  # fmt: skip


def test_the_repositorys_sources_file_matches_files_for_every_stage() -> None:
    sources = load_sources(REPO_ADR_DIR)
    assert set(sources.sets) == {"audit", "kernels", "correctness", "accuracy", "throughput"}
    for stage in sources.sets:
        assert sources.hashes(stage), stage
