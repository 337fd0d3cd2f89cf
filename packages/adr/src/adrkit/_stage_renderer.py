"""A block of one stage's record: `StageRenderer`, which the writer calls once per hardware class
where the stage runs on several, and `render_record_table`, the renderer of a block that shows the
one table of its stage's record that `BLOCK_SOURCES` declares for it, with the declared figures
the record has and the record's source; a block whose stage has not run says so instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from adrkit._block_sources import BLOCK_SOURCES
from adrkit._figures import asset_name
from adrkit._labels import TRANSLATED_CELLS, label
from adrkit._markdown import code_cell, markdown_table, markdown_text, source_line, stage_message
from adrkit.schema import Record, Scalar, Table

Records = Mapping[str, Record]
Renderer = Callable[[Records, str], str]
Presenter = Callable[[Table, str], tuple[list[str], list[list[Scalar]]]]


def require_record(records: Records, stage: str, lang: str) -> Record | str:
    """The stage's record, or the localized note that it has not run yet."""
    record = records.get(stage)
    if record is not None:
        return record
    return "_" + label(lang, "no-results", stage=stage) + "_"  # a stage of `BLOCKS`


def _quoted(table: Table, verbatim: frozenset[str]) -> list[list[Scalar]]:
    """The table's rows with the text of its ``verbatim`` columns quoted as code; the record's
    schema words (passed, failed) stay words."""
    quoted = {i for i, column in enumerate(table.columns) if column in verbatim}
    return [
        [
            code_cell(v) if i in quoted and isinstance(v, str) and v not in TRANSLATED_CELLS else v
            for i, v in enumerate(row)
        ]
        for row in table.rows
    ]


@dataclass(frozen=True)
class StageRenderer:
    """A renderer of one stage's record; the writer calls it once per hardware class where the
    stage runs on several (`adrkit._render`)."""

    stage: str
    render: Renderer

    def __call__(self, records: Records, lang: str) -> str:
        return self.render(records, lang)


def render_record_table(
    key: str,
    empty_key: str,
    no_baseline_key: str | None = None,
    present: tuple[Presenter, frozenset[str]] | None = None,
    verbatim: frozenset[str] = frozenset(),
) -> StageRenderer:
    """A renderer for block ``key`` that shows the one table of one stage's record that
    `BLOCK_SOURCES` declares for it, then the declared figures the record has (PNG artifacts,
    which the writer copies beside the ADRs).

    `present` is a function that turns the table into the columns and rows shown, in the ADR's
    language, and the columns it needs; a table without them (from an older record) is shown
    as recorded. `verbatim` columns hold a check's own words (an error, a detail in English):
    they are quoted as code, since no record sentence is in the ADR's language.

    A table without rows shows the label `empty_key`, or `no_baseline_key` when the table says
    there was no earlier result to compare against (`Table.baseline_found` is False). A record
    without the table (its stage crashed first) shows its reason instead.
    """
    source = BLOCK_SOURCES[key]
    stage, table, figures = source.stage, source.table, source.figures

    def render(records: Records, lang: str) -> str:
        record = require_record(records, stage, lang)
        if isinstance(record, str):
            return record
        if record.status == "skipped":
            reason = stage_message(record.reason or record.summary, lang)
            return "\n\n".join([reason, source_line(record, lang)])
        found: Table | None = record.tables.get(table)
        if found is None and record.reason:  # the stage ended (crashed) before the table
            body = stage_message(record.reason, lang)
        elif found is not None and found.rows:
            if present is not None and present[1] <= set(found.columns):
                body = markdown_table(lang, *present[0](found, lang))
            else:
                body = markdown_table(lang, found.columns, _quoted(found, verbatim))
        elif found is not None and found.baseline_found is False and no_baseline_key:
            body = markdown_text(label(lang, no_baseline_key))
        else:
            body = markdown_text(label(lang, empty_key))
        shown = [
            f"![{markdown_text(label(lang, 'figure'))}: {markdown_text(name)}]"
            f"({asset_name(record, name)})"
            for name in figures
            if name in record.artifacts
        ]
        return "\n\n".join([body, *shown, source_line(record, lang)])

    return StageRenderer(stage, render)
