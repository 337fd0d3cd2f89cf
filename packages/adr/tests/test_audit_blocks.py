"""The audit blocks' rendering of hostile record text, and their labels in both languages."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from adrkit import markdown_table, render_block
from adrkit._labels import LABELS
from adrkit._markdown import code_cell
from adrkit.schema import Record, Table

from conftest import make_record

# What a fork's file names and changed lines may hold: Markdown and HTML syntax, table pipes,
# line breaks and other control characters, undecodable path bytes (lone surrogates), CJK.
HOSTILE = st.lists(
    st.sampled_from(
        [*"|`<>!-&*_[]()#\\~ \t\n\r\x00\x1b", "<!--", "-->", "\udce9", "数", *"abcXYZ019./="]
    ),
    max_size=30,
).map("".join)


class _Cells(HTMLParser):
    """The text of each table data cell of rendered HTML, and every tag seen."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.cells: list[str] = []
        self.tags: set[str] = set()
        self.comments: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        if tag == "td":
            self.cells.append("")
            self._in_cell = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._in_cell = False

    def handle_data(self, data: str) -> None:
        if self._in_cell:
            self.cells[-1] += data

    def handle_comment(self, data: str) -> None:
        self.comments.append(data)


def _visible(text: str) -> str:
    """What a reader must see: the text, each unprintable character as \\uXXXX."""
    return re.sub(r"[\x00-\x1f\x7f\ud800-\udfff]", lambda m: f"\\u{ord(m.group()):04x}", text)


# No deadline: a slow CI machine is no failure.
@settings(deadline=None)
@given(HOSTILE)
def test_code_cell_shows_any_text_exactly_and_never_forms_a_comment(text: str) -> None:
    table = markdown_table("en", ["path", "stream"], [[code_cell(text), "B"]])
    # adrkit's markers are HTML comments: the ADR's source must never hold one from a record.
    assert "<!--" not in table and "-->" not in table
    assert len(table.splitlines()) == 3  # header, rule, one row: no line break got through
    rendered = MarkdownIt("commonmark").enable("table").render(table)
    cells = _Cells()
    cells.feed(rendered)
    assert not cells.comments
    assert cells.tags <= {"table", "thead", "tbody", "tr", "th", "td", "code"}
    assert cells.cells == [_visible(text), "B"], rendered


def test_every_audit_label_has_both_languages_and_the_same_fields() -> None:
    fields = re.compile(r"\{(\w+)\}")
    assert set(LABELS["en"]) == set(LABELS["zh"])
    for key, english in LABELS["en"].items():
        assert set(fields.findall(english)) == set(fields.findall(LABELS["zh"][key])), key


# The audit tables' columns, as flows/audit.py writes them.
AUDIT_TABLES = {
    "questions": ["question", "answer", "kind", "subject", "change", "name", "old", "new", "path"],
    "findings": [
        "stream", "path", "old_path", "area", "change", "old_mode", "new_mode", "content",
        "lines_added", "lines_removed", "keywords", "excerpt",
    ],
    "changes": [
        "status", "path", "old_path", "category", "change", "old_mode", "new_mode", "content",
        "lines_added", "lines_removed", "streams", "origin",
    ],
    "left-out": ["path", "side", "code"],
    "hooks": [
        "symbol", "kind", "status", "action", "problem", "detail", "upstream_path",
        "upstream_line", "fork_path", "fork_line", "excerpt",
    ],
}  # fmt: skip
AUDIT_BLOCKS = ["audit-summary", "audit-questions", "audit-findings", "audit-changes",
                "audit-left-out", "audit-hooks"]  # fmt: skip
CELLS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    HOSTILE,
    st.sampled_from(
        [
            "text",
            "binary",
            "large",
            "fact",
            "file",
            "A",
            "renamed",
            "yes",
            "changed",
            "adapt",
            "member-missing",
        ]
    ),
)
COUNTS = st.one_of(st.none(), st.booleans(), st.integers(), HOSTILE)


@settings(deadline=None)
@given(st.data())
def test_audit_blocks_render_any_record_cells_without_a_comment_or_a_crash(
    data: st.DataObject,
) -> None:
    tables = {
        name: Table(columns, data.draw(st.lists(st.lists(CELLS, min_size=len(columns),
                                                         max_size=len(columns)), max_size=3)))
        for name, columns in AUDIT_TABLES.items()
    }  # fmt: skip
    metrics = {
        key: data.draw(COUNTS)
        for key in ("files_total", "vendor_risk_files", "vendor_risk_stream_a",
                    "record_mismatch_files", "vendor_risk_no_stream")
    }  # fmt: skip
    record = make_record()
    record = Record(
        stage="audit",
        status="passed",
        provenance=record.provenance,
        metrics={**metrics, "surprise": data.draw(st.booleans()), "base_given": False},
        tables=tables,
    )
    for block in AUDIT_BLOCKS:
        for lang in ("en", "zh"):
            rendered = render_block(block, {"audit": record}, lang)
            # Of the summary, the verdict sentence is composed here; its table of metrics shows
            # each value through `markdown_table`'s own escaping.
            shown = rendered.split("\n\n")[0] if block == "audit-summary" else rendered
            assert "<!--" not in shown and "-->" not in shown, (block, shown)
