"""The committed ADRs' human text states no measured figure it cannot date.

Every figure a decision rests on comes from a generated block, which names its run, commit and
date. A measured figure in the human text (outside the generated blocks and the front matter) is
a number followed by a unit of speed or size (×, x, 倍, ms, µs, GB/s, TB/s, TFLOP/s, %); it must
carry, in the same paragraph or list item, the date it was measured (YYYY-MM-DD), the version of
what measured it (a name and a version, e.g. "vLLM 0.18.1") and the commit (a hex hash). Design
constants are written without such a unit (byte counts, 1e-6, 0.95 as a level), so they are no
figures. The check runs on every committed ADR, Chinese and English alike, and is shown failing
on a planted, undated figure.

An ADR is also `accepted` only while no row of its decision summary fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ADR_DIR = Path(__file__).resolve().parents[3] / "docs" / "adr"
ADRS = sorted(ADR_DIR.glob("[0-9][0-9][0-9][0-9]-*.md"))

# A number, then (after at most a space) a unit of a measured figure. `x` only after a digit and
# not before a letter or digit, so "0x1f", "4x128" or "x86" are no figures.
FIGURE = re.compile(
    r"(?<![\w.])(?P<number>[0-9]+(?:[.,][0-9]+)*)\s?"
    r"(?P<unit>×|x(?![0-9A-Za-z])|倍|ms\b|µs\b|us\b|GB/s|TB/s|TFLOP/s|%)"
)
DATE = re.compile(r"\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b")
# A name and its version: "vLLM 0.18.1", "Triton 3.6", "torch 2.11".
VERSION = re.compile(r"[A-Za-z][\w.+-]*[ -]v?[0-9]+\.[0-9]+(?:\.[0-9]+)?\b")
# A commit: 7 to 40 hex digits with at least one letter and one digit.
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
_BLOCK = re.compile(r"<!-- generated:(\S+) begin -->.*?<!-- generated:\1 end -->", re.DOTALL)
_FRONT_MATTER = re.compile(r"\A---\n.*?\n---\n", re.DOTALL)
# Code spans and fenced code quote names and paths, not figures.
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


@dataclass(frozen=True)
class Undated:
    """A figure of the human text, and what its paragraph lacks."""

    path: str
    figure: str
    lacks: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.path}: {self.figure!r} has no {', no '.join(self.lacks)}"


def paragraphs(text: str) -> list[str]:
    """The human text's paragraphs and list items, generated blocks and front matter removed."""
    text = _CODE.sub(" ", _BLOCK.sub("\n\n", _FRONT_MATTER.sub("", text)))
    parts = []
    for paragraph in re.split(r"\n\s*\n", text):
        parts += [p for p in re.split(r"\n(?=\s*(?:[-*]|[0-9]+\.)\s)", paragraph) if p.strip()]
    return parts


def undated_figures(path: Path) -> list[Undated]:
    found = []
    for paragraph in paragraphs(path.read_text(encoding="utf-8")):
        lacks = tuple(
            word
            for word, pattern in (("date", DATE), ("version", VERSION), ("commit", COMMIT))
            if not pattern.search(paragraph)
        )
        if not lacks:
            continue
        for match in FIGURE.finditer(paragraph):
            found.append(Undated(path.name, match.group(0), lacks))
    return found


def test_the_committed_adrs_human_text_dates_every_figure() -> None:
    assert ADRS, f"no ADRs under {ADR_DIR}"
    found = [str(u) for path in ADRS for u in undated_figures(path)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("paragraph", "flagged"),
    [
        ("上游的解码比 bf16 慢 1.9–2.9 倍。", ["2.9 倍"]),
        ("The decode is 1.5x faster and reads 4,230 GB/s.", ["1.5x", "4,230 GB/s"]),
        ("解码 0.140 ms，占 99.2% 带宽。", ["0.140 ms", "99.2%"]),
        # Dated, versioned and committed: a figure the paragraph can be traced by.
        ("On 2026-12-03 (vLLM 0.32.0, commit 501c763) upstream's decode was 3.8x slower.", []),
        # Design constants and names: no unit of a measured figure.
        ("scale = max(absmax / 127, 1e-6); 132 bytes per record; heads 32/8x128; 0x1f.", []),
    ],
)
def test_a_planted_undated_figure_is_found(
    tmp_path: Path, paragraph: str, flagged: list[str]
) -> None:
    adr = tmp_path / "0099-planted.md"
    generated = "<!-- generated:x begin -->\n| 9.9x | 12 ms |\n<!-- generated:x end -->"
    adr.write_text(f"---\nstatus: proposed\n---\n# 0099\n\n{paragraph}\n\n{generated}\n")
    assert [u.figure for u in undated_figures(adr)] == flagged


def _decision_verdicts(text: str) -> list[str]:
    """The last cell of each row of the ADR's decision summary block."""
    block = re.search(r"<!-- generated:decision-\d+ begin -->\n(.*?)<!-- generated", text, re.S)
    if block is None:
        return []
    rows = [line for line in block.group(1).splitlines() if line.startswith("|")][2:]
    return [row.rstrip(" |").rsplit("|", 1)[-1].strip() for row in rows]


@pytest.mark.parametrize("path", ADRS, ids=lambda p: p.name)
def test_an_accepted_adr_has_no_failing_decision_row(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    status = re.search(r"^status: (\S+)$", text, re.MULTILINE)
    failing = [v for v in _decision_verdicts(text) if v in ("failed", "失败")]
    if status is not None and status.group(1) == "accepted":
        assert not failing, f"{path.name} is accepted while {len(failing)} decision row(s) fail"
