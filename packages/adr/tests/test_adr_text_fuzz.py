"""Random ADR texts through `adrkit update`: front matter of any shape (aliases, anchors, tags,
deep nesting, huge numbers, a BOM, CRLF, no closing fence), markers exact, mistyped, unknown,
nested, doubled or unclosed, and prose that looks like either. Whatever the text, `--check` and
the update end in exit 0, 1 or 2, with one line on stderr for 2 and every file as it was; after a
successful update `--check` finds nothing stale. Nothing raises.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from adrkit import write_record
from adrkit.__main__ import main

from conftest import make_record, tree_hashes

YAML = [
    "lang: en",
    "lang: zh",
    "lang: fr",
    "status: accepted",
    "date: 2026-11-29",
    "a: &a [x, x, x]",
    "b: [*a, *a, *a]",
    "c: *a",
    "d: " + "[" * 40 + "]" * 40,
    "e: " + "{a: " * 30 + "1" + "}" * 30,
    "f: !!python/object/apply:os.system [x]",
    "g: !!int 12",
    "h: " + "9" * 5000,
    "? [k]\n: v",
    "- item",
    "i: |\n  text",
    "\t",
    "j: \x00",
    "k: 'unterminated",
]
MARKERS = [
    "<!-- generated:pipeline-status begin -->",
    "<!-- generated:pipeline-status end -->",
    "<!-- generated:audit-summary begin -->",
    "<!-- generated:audit-summary end -->",
    "<!-- generated: pipeline-status begin -->",
    "<!-- Generated:pipeline-status begin -->",
    "<!-- generated pipeline-status end -->",
    "<!-- generated:no-such-block begin -->",
    "<!-- generated:Bad begin -->",
    "<!--generated:pipeline-status begin-->",
    "<!-- a comment -->",
    "`generated:KEY begin`",
    "<!--",
    "-->",
]
PROSE = ["# 0001 Title", "Prose.", "中文", "| a | b |", "---", "", "\r", "\ufeff"]


@st.composite
def adr_texts(draw: st.DrawFn) -> str:
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    parts = []
    if draw(st.booleans()):
        parts.append("\ufeff")
    if draw(st.integers(0, 3)):  # usually front matter
        matter = draw(st.lists(st.sampled_from(YAML) | st.text(max_size=8), max_size=4))
        closing = draw(st.sampled_from(["---", "---", "", "--- x"]))
        parts.append(newline.join(["---", *matter, closing]) + newline)
    body = draw(
        st.lists(
            st.sampled_from(MARKERS) | st.sampled_from(PROSE) | st.text(max_size=10),
            max_size=8,
        )
    )
    parts.append(newline.join(body))
    return "".join(parts)


@settings(
    max_examples=150,
    deadline=None,  # a slow CI machine is no failure
    database=None,  # no example store in the repository
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(texts=st.lists(adr_texts(), min_size=1, max_size=2))
def test_any_adr_text_exits_0_1_or_2_with_one_line_and_never_raises(texts: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        adr_dir, results = root / "adr", root / "results"
        adr_dir.mkdir()
        for index, text in enumerate(texts):
            (adr_dir / f"000{index + 1}-fuzz.md").write_bytes(text.encode("utf-8", "surrogatepass"))
        write_record(results, make_record())
        before = tree_hashes(adr_dir)

        def update(*extra: str) -> tuple[int, str]:
            stderr = io.StringIO()
            argv = ["update", "--adr-dir", str(adr_dir), "--results", str(results), *extra]
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
                code = main(argv)
            return code, stderr.getvalue()

        checked, err = update("--check")
        event(f"--check exit {checked}")
        assert checked in (0, 1, 2)
        assert tree_hashes(adr_dir) == before
        if checked == 2:
            assert err.startswith("adrkit: error: ") and err.count("\n") == 1, err
        code, err = update()
        assert code in (0, 2)
        if code == 2:
            assert err.startswith("adrkit: error: ") and err.count("\n") == 1, err
            assert tree_hashes(adr_dir) == before
            return
        assert update("--check") == (0, "")
