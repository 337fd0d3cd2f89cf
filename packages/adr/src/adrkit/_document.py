"""An ADR file as text: MADR front matter, human prose, and generated blocks between markers.

A generated block is everything between a pair of lines of exactly this form::

    <!-- generated:KEY begin -->
    ...
    <!-- generated:KEY end -->

Only the text strictly between the two markers is ever replaced, so every byte outside them,
the markers included, is the human author's and stays as it was. A file's line ends are its own:
one whose first line ends in CRLF gets its generated bodies with CRLF too, and every other byte,
CR included, is kept as read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from adrkit._errors import MarkerError

# Loose on purpose: anything that looks like a marker is checked, so a typo is an error rather
# than human text that silently stops being regenerated.
_MARKER = re.compile(r"<!--\s*generated:(?P<key>\S*?)\s+(?P<end>\S+)\s*-->")
# And anything that begins like one but is not even that (`<!-- generated: KEY begin -->`, a
# capital, no colon) is an error too, never prose.
_NEAR_MARKER = re.compile(r"<!--\s*generated\b[^\n]*?(?:-->|$)", re.IGNORECASE | re.MULTILINE)
# A BOM before the front matter is no character of it (an editor may write one).
_BOM = "\ufeff"
# Front matter is a few keys (status, date, lang); a larger block is no ADR's.
MAX_FRONT_MATTER_BYTES = 16 * 2**10
# MADR front matter is flat; lists of deciders nest once. Deeper is refused, not recursed into.
MAX_FRONT_MATTER_DEPTH = 8
_KEY = re.compile(r"[a-z0-9][a-z0-9-]*")
LANGS = ("en", "zh")


@dataclass(frozen=True)
class Block:
    """One generated block: its key and the span of its body in the file's text."""

    key: str
    body_start: int
    body_end: int


def newline_of(text: str) -> str:
    """The line end of ``text``: that of its first line, LF for a text of one line."""
    first = text.find("\n")
    return "\r\n" if first > 0 and text[first - 1] == "\r" else "\n"


@dataclass(frozen=True)
class Document:
    path: Path
    text: str
    front_matter: dict[str, str]
    title: str
    blocks: tuple[Block, ...]

    @property
    def lang(self) -> str:
        return self.front_matter.get("lang", "en")

    @property
    def newline(self) -> str:
        return newline_of(self.text)

    def with_bodies(self, bodies: dict[str, str]) -> str:
        """Return the text with each block's body (rendered with LF line ends) replaced, in the
        file's own line ends; text outside the bodies is kept."""
        pieces: list[str] = []
        cursor = 0
        for block in self.blocks:
            body = bodies[block.key].strip("\n").replace("\n", self.newline)
            pieces.append(self.text[cursor : block.body_start])
            pieces.append(f"{self.newline}{body}{self.newline}")
            cursor = block.body_end
        pieces.append(self.text[cursor:])
        return "".join(pieces)


def parse(path: Path, text: str) -> Document:
    """Parse an ADR's text; malformed markers raise a one-line `MarkerError`."""
    front_matter = _front_matter(path, text)
    title_match = re.search(r"^# (.+)$", text, flags=re.MULTILINE)
    title = title_match.group(1).strip() if title_match else path.stem
    return Document(path, text, front_matter, title, _blocks(path, text))


class _FrontMatterLoader(yaml.BaseLoader):
    """PyYAML's loader of plain strings (no tag resolved, so no value can construct anything),
    which refuses aliases (an alias bomb expands a few hundred bytes into gigabytes) and nesting
    deeper than `MAX_FRONT_MATTER_DEPTH` (the composer recurses)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            msg = "aliases (*name) are not allowed in front matter"
            raise yaml.composer.ComposerError(None, None, msg, self.get_mark())
        self.depth += 1
        if self.depth > MAX_FRONT_MATTER_DEPTH:
            msg = f"front matter nests deeper than {MAX_FRONT_MATTER_DEPTH} levels"
            raise yaml.composer.ComposerError(None, None, msg, self.get_mark())
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _front_matter(path: Path, text: str) -> dict[str, str]:
    newline = newline_of(text)
    fence = f"---{newline}"
    start = len(_BOM) if text.startswith(_BOM) else 0
    if not text.startswith(fence, start):
        return {}
    end = text.find(f"{newline}{fence}", start + len(fence))
    if end < 0:
        msg = f"{path}: front matter opened with '---' is never closed"
        raise MarkerError(msg)
    block = text[start + len(fence) : end]
    if len(block.encode("utf-8", "surrogatepass")) > MAX_FRONT_MATTER_BYTES:
        msg = f"{path}: front matter is over {MAX_FRONT_MATTER_BYTES} bytes; an ADR's is a few keys"
        raise MarkerError(msg)
    try:
        data = yaml.load(block, Loader=_FrontMatterLoader) or {}  # noqa: S506 (a safe loader)
    except yaml.YAMLError as exc:
        msg = f"{path}: front matter is not valid YAML ({' '.join(str(exc).split())})"
        raise MarkerError(msg) from None
    if not isinstance(data, dict):
        msg = f"{path}: front matter must be a mapping of keys to values"
        raise MarkerError(msg)
    matter = {str(k): str(v) for k, v in data.items()}
    if matter.get("lang", "en") not in LANGS:
        msg = f"{path}: front matter `lang` is {matter['lang']!r}; expected one of {LANGS}"
        raise MarkerError(msg)
    return matter


def _blocks(path: Path, text: str) -> tuple[Block, ...]:
    blocks: list[Block] = []
    seen: set[str] = set()
    open_key: str | None = None
    open_body_start = 0
    markers = {match.start() for match in _MARKER.finditer(text)}
    for near in _NEAR_MARKER.finditer(text):
        if near.start() not in markers:
            line = text.count("\n", 0, near.start()) + 1
            msg = (
                f"{path}:{line}: {near.group(0)!r} looks like a marker but is not one; "
                "expected '<!-- generated:KEY begin -->' or '<!-- generated:KEY end -->'"
            )
            raise MarkerError(msg)
    for match in _MARKER.finditer(text):
        key, kind = match.group("key"), match.group("end")
        line = text.count("\n", 0, match.start()) + 1
        where = f"{path}:{line}"
        if not _KEY.fullmatch(key) or kind not in {"begin", "end"}:
            msg = (
                f"{where}: malformed marker {match.group(0)!r}; "
                "expected '<!-- generated:KEY begin -->' or '<!-- generated:KEY end -->'"
            )
            raise MarkerError(msg)
        if kind == "begin":
            if open_key is not None:
                msg = f"{where}: block {key!r} begins inside block {open_key!r}; blocks cannot nest"
                raise MarkerError(msg)
            if key in seen:
                msg = f"{where}: block {key!r} appears twice in the file"
                raise MarkerError(msg)
            seen.add(key)
            open_key, open_body_start = key, match.end()
        else:
            if open_key != key:
                expected = f"the end of {open_key!r}" if open_key else "no end marker"
                msg = f"{where}: end of block {key!r} found where {expected} was expected"
                raise MarkerError(msg)
            blocks.append(Block(key, open_body_start, match.start()))
            open_key = None
    if open_key is not None:
        msg = f"{path}: block {open_key!r} begins but never ends"
        raise MarkerError(msg)
    return tuple(blocks)
