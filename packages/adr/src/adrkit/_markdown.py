"""The Markdown every block is written in, such that no record can break it: the escaping of
record text (`markdown_text`, and `code_cell` for text shown as code), tables whose header is
labelled in the ADR's language, and the two lines blocks share, the source of a block's record
(its run, flow run and commit) and a stage's own message. Every text a renderer shows, whether it
comes from a record or from the labels, goes through here, so no record can write a marker, an
HTML comment or a table cell of its own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from adrkit._labels import TRANSLATED_CELLS, label
from adrkit.schema import Record, Scalar


class Markdown(str):
    """A table cell a renderer has already written as Markdown, every piece of record text in it
    escaped (see `code_cell`); `markdown_table` keeps it as it is."""

    __slots__ = ()


# Line breaks of every kind `str.splitlines` knows: one would end a table row or start a block.
_LINE_BREAKS = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
# Control characters and lone surrogates (JSON can carry "\ud800", UTF-8 cannot): shown as U+FFFD.
_UNSHOWABLE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff]")
# `<` and `>` become entities, so no text can open or close an HTML comment (a generated-block
# marker is one) or a tag; `&` too, so an entity in the text shows as written.
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# Backslash-escaped wherever they stand: `|` would split a table cell; `\` could escape the
# backslash of an escaped `|`; a backtick or `~` run could open a code span or fence; brackets
# would make a link or an image. Emphasis (`*`, `_`) is left as is: it changes how a word looks,
# never the structure, and escaping it would clutter every path and id.
_BACKSLASHED = re.compile(r"([\\`|~\[\]])")
# At the start of a line Markdown reads these as a heading, a list item or a thematic break.
_BLOCK_START = re.compile(r"#{1,6}(?=[ \t]|$)|[-+*](?=[ \t]|$)|[0-9]{1,9}[.)](?=[ \t]|$)")
_THEMATIC_BREAK = re.compile(r"([-*_])(?:[ \t]*\1){2,}[ \t]*")


def markdown_text(text: str) -> str:
    """``text`` as Markdown that shows it as written, on one line, in a paragraph or a table cell.

    The one escaping function of every renderer: line breaks become spaces, `<`, `>` and `&`
    entities (so no HTML comment, hence no block marker, can form), and the characters that
    would split a table cell, open a code span, a fence or a link are backslash-escaped, as is a
    heading, list or rule marker at the start. Code spans cannot be escaped (Markdown shows
    their content literally); the record fields shown in them are held to formats instead.
    """
    text = _LINE_BREAKS.sub(" ", text).replace("\t", " ")
    text = _UNSHOWABLE.sub("\ufffd", text).strip(" ")
    text = "".join(_ENTITIES.get(char, char) for char in text)
    text = _BACKSLASHED.sub(r"\\\1", text)
    if _THEMATIC_BREAK.fullmatch(text):
        return "\\" + text
    start = _BLOCK_START.match(text)
    if start:
        marker = start.group(0)
        return marker[:-1] + "\\" + marker[-1] + text[len(marker) :]
    return text


# Text from a record that can be shown as a backtick code span in a table cell: no `<` or `>`
# (a span could carry `<!--` into the ADR's source), no line break, control character or lone
# surrogate (an undecodable path byte).
# Line breaks beyond ASCII's (NEL, the line and paragraph separators) count as unprintable too.
_SPAN_SAFE = re.compile(r"[^<>\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]*")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_ESCAPED_IN_CODE = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "\\|"}
_MARKDOWN_INLINE = frozenset("\\`*_[]~")


def code_cell(text: str) -> Markdown:
    """TEXT (a path, a name, a line of a patch: hostile input) as code in a table cell, exactly
    as written: a backtick span where that is safe, else a `<code>` element whose special
    characters are entities or escaped, so that no record can form an HTML comment or a marker
    and unprintable characters show as `\\uXXXX`."""
    if text.strip(" ") and _SPAN_SAFE.fullmatch(text):
        longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
        fence = "`" * (longest + 1)
        # A span drops one space at each end when both ends have one: pad to keep the text's own.
        padded = f" {text} " if text.startswith(("`", " ")) or text.endswith(("`", " ")) else text
        return Markdown(fence + padded.replace("|", "\\|") + fence)
    visible = _UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    escaped = "".join(
        _ESCAPED_IN_CODE.get(c, "\\" + c if c in _MARKDOWN_INLINE else c) for c in visible
    )
    return Markdown(f"<code>{escaped}</code>")


def _cell(lang: str, value: Scalar) -> str:
    """A table cell as Markdown: a `Markdown` value as its renderer wrote it, anything else
    shown in the ADR's words and escaped."""
    if isinstance(value, Markdown):
        return value
    if isinstance(value, str) and value in TRANSLATED_CELLS:
        text = label(lang, value)
    elif value is None:
        text = "—"
    elif isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = str(value)
    return markdown_text(text)


def markdown_table(lang: str, columns: Sequence[str], rows: Sequence[Sequence[Scalar]]) -> str:
    """A Markdown table: ``columns`` are ids shown by their labels, each cell escaped."""
    header = "| " + " | ".join(markdown_text(label(lang, c)) for c in columns) + " |"
    rule = "|" + "---|" * len(columns)
    body = ["| " + " | ".join(_cell(lang, v) for v in row) + " |" for row in rows]
    return "\n".join([header, rule, *body])


def source_line(record: Record, lang: str) -> str:
    """The run, flow run and commit a block's record came from. They are shown in code spans,
    where an escape would show literally, so they are not escaped: `Provenance` holds them to
    formats that Markdown cannot misread, and `Record` the stage's name."""
    p = record.provenance
    flow = label(lang, "flow-run", id=p.flow_run_id) if p.flow_run_id else ""
    commit = (p.repo_commit or "unknown")[:12]
    fields = {"stage": record.stage, "run": p.run_id, "flow": flow, "commit": commit}
    return "_" + label(lang, "source", ended=markdown_text(p.ended_at), **fields) + "_"


def stage_message(message: str, lang: str) -> str:
    """A stage's own message (why it was skipped, what it crashed on), quoted as written: it is
    the stage's English, whatever the ADR's language."""
    return f"{markdown_text(label(lang, 'stage-message'))} {code_cell(message)}"
