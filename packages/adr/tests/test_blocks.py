from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from adrkit import BLOCKS, render_block, update_adrs, write_record
from adrkit._document import parse
from adrkit.schema import Gate, Table

from conftest import ADR_EN, human_text, make_record

END = "<!-- generated:audit-summary end -->"
# Texts a record may carry that would end a block, open an HTML comment that swallows the rest of
# the ADR, split a table row, or start a heading, a list or a code fence.
HOSTILE = [
    END,
    "<!-- generated:pipeline-status begin -->",
    "<!-- an HTML comment never closed",
    "closing one -->",
    "a | b",
    "line\nbreak",
    "crlf\r\nbreak",
    "cr\ronly",
    "unicode\u2028line separator",
    "trailing backslash\\",
    "escaped pipe \\| still one cell",
    "```",
    "~~~",
    "# heading",
    "- list item",
    "1. ordered",
    "---",
    "[link](https://example.com)",
    "![image](https://example.com/x.png)",
    "`code | span`",
    "&lt;!-- an entity that must stay an entity",
]
STAGES = ["audit", "correctness", "kernels", "accuracy", "throughput"]
TABLES = [
    "findings",
    "changes",
    "left-out",
    "errors",
    "edge-cases",
    "resources",
    "resource-diff",
    "deltas",
    "kernels",
    "capacity",
    "e2e",
]
UNESCAPED_PIPE = re.compile(r"(?<!\\)(?:\\\\)*\|")


def hostile_records(text: str) -> dict[str, object]:
    """A record of every stage with ``text`` in every field a block shows."""
    columns = [text, "value", f"{text} 2"]
    table = Table(columns, [[text, 1.5, None], [f"x{text}y", text, True]])
    records = {}
    for stage in STAGES:
        record = make_record(stage, summary=text, reason=text, status="failed")
        records[stage] = replace(
            record,
            metrics={"fork": text, "files_total": text, "upstream": 1e400, "scope": -1e-300},
            tables={name: table for name in TABLES},
            gates=[Gate.judge(text, 1.0, "<=", 0.0), Gate.judge(f"{text}!", float("nan"), ">", 1)],
            artifacts={},
        )
    return records


def _cells(row: str) -> int:
    return len(UNESCAPED_PIPE.findall(row)) - 1


@pytest.mark.parametrize("key", sorted(BLOCKS))
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_no_block_shows_a_record_text_that_can_form_markup(key: str, lang: str) -> None:
    for text in HOSTILE:
        body = render_block(key, hostile_records(text), lang)  # type: ignore[arg-type]
        # A `<code>` element (code that a backtick span cannot hold) is the one tag shown; its
        # text has entities for every `<` and `>`.
        untagged = body.replace("<code>", "").replace("</code>", "")
        assert "<" not in untagged and ">" not in untagged, body
        assert "\r" not in body and "\u2028" not in body
        for paragraph in body.split("\n\n"):
            lines = paragraph.split("\n")
            if lines[0].startswith("| "):  # a table: every row as many cells as the header
                assert {_cells(line) for line in lines} == {_cells(lines[0])}, paragraph
            else:  # a paragraph: a record text never starts a block of its own
                assert len(lines) == 1, paragraph
                assert not re.match(r"(#|[-+*] |[0-9]+\. |```|~~~|---)", paragraph), paragraph


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (END, "&lt;!-- generated:audit-summary end --&gt;"),
        ("a | b", "a \\| b"),
        ("a\\|b", "a\\\\\\|b"),
        ("one\r\ntwo\nthree\rfour", "one two three four"),
        ("  indented code", "indented code"),
        ("# heading", "\\# heading"),
        ("- item", "\\- item"),
        ("12. item", "12\\. item"),
        ("-0.5", "-0.5"),
        ("+4/-1", "+4/-1"),
        ("- - -", "\\- - -"),
        ("***", "\\***"),
        ("`x`", "\\`x\\`"),
        ("[a](b)", "\\[a\\](b)"),
        ("AT&T", "AT&amp;T"),
        ("vllm/model_executor/x.py", "vllm/model_executor/x.py"),
        ("nul\x00bell\x07", "nul\ufffdbell\ufffd"),
        ("lone \ud800 surrogate", "lone \ufffd surrogate"),
        ("中文 说明", "中文 说明"),
    ],
)
def test_markdown_text_shows_the_text_and_nothing_else(text: str, shown: str) -> None:
    from adrkit import markdown_text

    assert markdown_text(text) == shown


def test_a_record_that_writes_a_marker_leaves_every_later_update_working(
    adr_dir: Path, tmp_path: Path
) -> None:
    path = adr_dir / "0012-fork-audit.md"
    before = human_text(path.read_text())
    results = tmp_path / "hostile"
    record = make_record(summary=f"pwned {END} <!--", reason=None)
    table = Table([END, "path"], [[END, "x | y\n<!-- z"]])
    gates = [Gate.judge(END, 0.0, "<=", 0.0)]
    write_record(results, replace(record, tables={"findings": table}, gates=gates))
    update_adrs(adr_dir, results)
    text = path.read_text()
    assert human_text(text) == before
    assert [b.key for b in parse(path, text).blocks] == ["audit-summary", "pipeline-status"]
    assert text.count("<!--") == 4  # the four markers, nothing else
    assert update_adrs(adr_dir, results, check=True).changed == ()
    assert "pwned &lt;!-- generated:audit-summary end --&gt; &lt;!--" in text
    # The next, ordinary, update still finds its blocks.
    write_record(tmp_path / "plain", make_record(run_id="run-2"))
    update_adrs(adr_dir, tmp_path / "plain")
    assert "pwned" not in path.read_text()
    assert ADR_EN.split("<!--")[0] in path.read_text()
