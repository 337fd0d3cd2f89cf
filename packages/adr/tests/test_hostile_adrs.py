"""ADR texts built to break the writer, or typed carelessly: a front matter of YAML aliases (a few
hundred bytes that expand into gigabytes), one nested thousands deep, one over the size an ADR's
needs, a marker that almost matches, a BOM before the front matter. Each is one line and exit 2
with every file as it was, or (the BOM) rendered as the ADR's language says.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from adrkit import MarkerError, write_record
from adrkit._document import parse

from conftest import assert_one_line_error, make_record, run_update, tree_hashes

BLOCK = "<!-- generated:pipeline-status begin -->\n<!-- generated:pipeline-status end -->\n"


def _alias_bomb(levels: int) -> str:
    """Front matter whose last key expands to 9**LEVELS strings through aliases."""
    lines = ['l0: &l0 ["x","x","x","x","x","x","x","x","x"]']
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [" + ",".join([f"*l{level - 1}"] * 9) + "]")
    return "\n".join(lines)


FRONT_MATTERS = {
    "aliases": (_alias_bomb(7), "aliases (*name) are not allowed in front matter"),
    "deep nesting": ("status: " + "[" * 3000 + "]" * 3000, "nests deeper than 8 levels"),
    "deep mappings": (
        "status:" + "".join(f"\n{' ' * i}k{i}:" for i in range(1, 40)) + " x",
        "nests",
    ),
    "oversized": ("status: " + "x" * 20_000, "front matter is over 16384 bytes"),
}


@pytest.mark.parametrize("case", sorted(FRONT_MATTERS))
def test_a_hostile_front_matter_is_one_line(case: str) -> None:
    matter, message = FRONT_MATTERS[case]
    with pytest.raises(MarkerError) as raised:
        parse(Path("0001-x.md"), f"---\n{matter}\n---\n# x\n")
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_tag_constructs_nothing_and_reads_as_text() -> None:
    text = "---\nstatus: !!python/object/apply:os.system [x]\nlang: !!str zh\n---\n# x\n"
    document = parse(Path("0001-x.md"), text)
    assert document.lang == "zh"
    assert document.front_matter["status"] == "['x']"


def test_the_alias_bomb_fails_the_update_in_one_line_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    adr_dir, results = tmp_path / "adr", tmp_path / "results"
    adr_dir.mkdir()
    (adr_dir / "0001-bomb.md").write_text(f"---\n{_alias_bomb(9)}\n---\n# bomb\n{BLOCK}")
    (adr_dir / "0002-fine.md").write_text(f"---\nlang: en\n---\n# fine\n{BLOCK}")
    write_record(results, make_record())
    before = tree_hashes(adr_dir)
    for check in ((), ("--check",)):
        code, err = run_update(capsys, adr_dir, results, *check)
        assert code == 2
        assert_one_line_error(err, "0001-bomb.md", "aliases (*name) are not allowed")
    assert tree_hashes(adr_dir) == before


@pytest.mark.parametrize(
    "marker",
    [
        "<!-- generated: pipeline-status begin -->",  # a space after the colon
        "<!-- Generated:pipeline-status begin -->",
        "<!-- generated pipeline-status begin -->",
        "<!--generated:pipeline-status-->",
    ],
)
def test_a_marker_that_almost_matches_is_an_error_not_prose(
    marker: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    adr_dir, results = tmp_path / "adr", tmp_path / "results"
    adr_dir.mkdir()
    end = marker.replace("begin", "end")
    (adr_dir / "0001-typo.md").write_text(f"---\nlang: en\n---\n# typo\n{marker}\nold\n{end}\n")
    write_record(results, make_record())
    before = tree_hashes(adr_dir)
    code, err = run_update(capsys, adr_dir, results, "--check")
    assert code == 2  # never "up to date": the block would never be regenerated
    assert_one_line_error(err, "0001-typo.md:5", "looks like a marker but is not one")
    assert tree_hashes(adr_dir) == before


def test_a_bom_before_the_front_matter_keeps_the_adrs_language(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    adr_dir, results = tmp_path / "adr", tmp_path / "results"
    adr_dir.mkdir()
    text = f"\ufeff---\nstatus: accepted\nlang: zh\n---\n# 0001 中文\n{BLOCK}"
    (adr_dir / "0001-zh.md").write_text(text, encoding="utf-8")
    write_record(results, make_record())
    assert run_update(capsys, adr_dir, results) == (0, "")
    written = (adr_dir / "0001-zh.md").read_text(encoding="utf-8")
    assert written.startswith("\ufeff---\nstatus: accepted\nlang: zh\n---\n")
    assert "| 阶段 | 硬件 | 状态 |" in written
    assert "| Stage |" not in written
    index = (adr_dir / "README.md").read_text()
    assert "| 0001 中文 | accepted |" in index
