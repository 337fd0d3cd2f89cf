from __future__ import annotations

from pathlib import Path

import pytest

from adrkit import MarkerError
from adrkit._document import parse

B = "<!-- generated:{} begin -->"
E = "<!-- generated:{} end -->"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"{B.format('a')}\nbody\n", "'a' begins but never ends"),
        (f"body\n{E.format('a')}\n", "no end marker was expected"),
        (f"{B.format('a')}\n{E.format('a')}\n{B.format('a')}\n{E.format('a')}\n", "appears twice"),
        (f"{B.format('a')}\n{B.format('b')}\n{E.format('b')}\n{E.format('a')}\n", "cannot nest"),
        (f"{B.format('a')}\n{E.format('b')}\n", "end of block 'b'"),
        ("<!-- generated:a start -->\n", "malformed marker"),
        ("<!-- generated:Bad_Key begin -->\n", "malformed marker"),
        ("---\nlang: fr\n---\n", "`lang` is 'fr'"),
        ("---\nstatus: [x\n---\n", "not valid YAML"),
    ],
)
def test_malformed_markers_are_refused_with_the_line(text: str, message: str) -> None:
    with pytest.raises(MarkerError, match=message) as info:
        parse(Path("x.md"), text)
    assert "\n" not in str(info.value)


def test_only_block_bodies_change() -> None:
    text = f"---\nlang: zh\n---\n# T\nkeep\n{B.format('k')}\nold\n{E.format('k')}\ntail"
    doc = parse(Path("0001-t.md"), text)
    assert doc.lang == "zh"
    assert doc.title == "T"
    assert [b.key for b in doc.blocks] == ["k"]
    new = doc.with_bodies({"k": "new"})
    assert new == f"---\nlang: zh\n---\n# T\nkeep\n{B.format('k')}\nnew\n{E.format('k')}\ntail"


def test_a_crlf_file_keeps_crlf_and_its_front_matter_is_read() -> None:
    text = f"---\r\nlang: zh\r\n---\r\n# T\r\n{B.format('k')}\r\nold\r\n{E.format('k')}\r\ntail\r"
    doc = parse(Path("0001-t.md"), text)
    assert (doc.lang, doc.title) == ("zh", "T")
    new = doc.with_bodies({"k": "one\ntwo"})
    assert new == text.replace("old", "one\r\ntwo")
