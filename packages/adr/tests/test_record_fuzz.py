"""Random records through `adrkit update`: strings, numbers (NaN, infinities, huge integers),
nesting and unicode in every field of the schema, and artifacts that lie in, outside or around
the run directory. Whatever the record, the update ends in exit 0 with ADRs that parse, whose
human text is unchanged and whose markers are their own, or in exit 2 with one line on stderr and
no file changed; it never raises, and never touches a file outside the ADR directory.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from adrkit.__main__ import main
from adrkit._document import parse
from adrkit._render import block_keys
from adrkit.schema import Gate, RecordError

from conftest import PNG, human_text, tree_hashes

# The decision summaries' rows as the ADRs declare them (read on purpose).
DECISIONS = (Path(__file__).resolve().parents[3] / "docs" / "adr" / "decisions.toml").read_bytes()
KEYS = block_keys()  # every block: the stages', the pipeline status, the decision summaries
BODY = "\n".join(
    f"<!-- generated:{key} begin -->\nold\n<!-- generated:{key} end -->" for key in KEYS
)
ADRS = {
    "0001-en.md": f"---\nstatus: accepted\nlang: en\n---\n# 0001 En\n\nProse  \t\n{BODY}\ntail",
    # CRLF, Chinese labels, and human text that looks like Markdown a record might write.
    "0002-zh.md": (
        "---\r\nlang: zh\r\n---\r\n# 0002 中文\r\n| a | b |\r\n\r\n"
        + BODY.replace("\n", "\r\n")
        + "\r\n尾\r\n"
    ),
}
MARKERS = {name: text.count("<!--") for name, text in ADRS.items()}

PIECES = [
    "<!-- generated:pipeline-status end -->",
    "<!-- generated:audit-summary begin -->",
    "<!--",
    "-->",
    "|",
    "\\",
    "\n",
    "\r\n",
    "\r",
    "\u2028",
    "\x00",
    "\ud800",
    "`",
    "```",
    "# ",
    "- ",
    "1. ",
    "---",
    "[x](y)",
    "&lt;",
    "../",
    "中文",
    "😀",
    "\u202e",
]
texts = st.one_of(
    st.text(max_size=12),
    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=4)), max_size=4).map("".join),
)
numbers = st.one_of(
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 10**400]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
# Anything JSON can hold, where the schema wants something else.
anything = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3)
)
DEEP = "__nested__"  # replaced by thousands of brackets once the record is JSON text

STAGES = ["audit", "correctness", "kernels", "accuracy", "throughput"]
FIGURES = [
    "accuracy_deltas.png",
    "throughput-kernel-vs-context.png",
    "throughput-e2e-vs-batch.png",
    "throughput-trend.png",
]
TABLES = ["findings", "changes", "deltas", "errors", "resources", "resource-diff", "kernels", "e2e"]
TABLES += ["capacity", "questions", "left-out"]
# Metric and column names the blocks and the decision rows read.
METRICS = ["fork", "files_total", "surprise", "vendor_risk_files", "vendor_risk_stream_a"]
METRICS += ["int8_bytes_per_token_vs_16bit", "decode_speedup_vs_16bit_min", "rows", "rows_failed"]
METRICS += ["worst_error_to_tolerance", "divergence_mean_kld", "divergence_controls_failed"]
COLUMNS = ["stream", "path", "question", "answer", "target", "cells", "failed", "waves_per_simd"]
COLUMNS += ["bench", "measurement", "verdict", "value", "kv_cache_dtype", "block_size"]
COLUMNS += ["source_kind", "max_tokens", "compilation", "graphs", "change", "content"]
# Where a record's artifact may point; the run directory holds `fig/plot.png` (a PNG) and
# `fig/fake.png` (text); `outside.png`, a PNG, lies beside the results.
SOURCES = [
    "fig/plot.png",
    "fig/fake.png",
    "fig/missing.png",
    "fig",
    "../../outside.png",
    "{root}/outside.png",
    "{root}/results/run-1/fig/plot.png",
    "/etc/passwd",
]


def mostly(
    usual: st.SearchStrategy[Any], rare: st.SearchStrategy[Any], one_in: int = 30
) -> st.SearchStrategy[Any]:
    """``rare`` once in ``one_in`` draws, ``usual`` otherwise, so that enough records get past
    the reader to exercise the ADRs. (Hypothesis favours small numbers: the rare draw is the
    largest.)"""
    return st.integers(1, one_in).flatmap(lambda n: rare if n == one_in else usual)


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    """A record as JSON data: of the schema's shape, with each field now and then anything."""

    def field(proper: st.SearchStrategy[Any]) -> Any:
        return draw(mostly(proper, anything | st.just(DEEP), one_in=40))

    columns = draw(st.lists(texts | st.sampled_from(COLUMNS), min_size=1, max_size=5, unique=True))
    rows = st.lists(st.lists(scalars, min_size=len(columns), max_size=len(columns)), max_size=3)
    table = st.fixed_dictionaries(
        {"columns": st.just(columns), "rows": rows, "baseline_found": st.none() | st.booleans()}
    )
    timestamps = mostly(
        st.sampled_from(["2026-11-29T02:00:00.000000Z", "2026-11-30T00:00:00Z"]), texts
    )
    status = field(mostly(st.sampled_from(["passed", "failed", "skipped"]), texts))
    provenance = {
        "run_id": field(mostly(st.just("run-1"), texts)),
        "started_at": field(timestamps),
        "ended_at": field(timestamps),
        "repo_commit": field(mostly(st.sampled_from([None, "0123456789abcdef"]), texts)),
        "flow_run_id": field(mostly(st.sampled_from([None, "flow-1"]), texts)),
        "packages": field(st.dictionaries(texts, texts, max_size=2)),
        "hardware": field(st.dictionaries(texts, scalars, max_size=2)),
    }
    return {
        "schema_version": field(st.just(1)),
        "stage": field(mostly(st.sampled_from(STAGES), texts)),
        "status": status,
        "summary": field(texts),
        "reason": field(texts.filter(bool) if status != "passed" else st.none() | texts),
        "metrics": field(st.dictionaries(texts | st.sampled_from(METRICS), scalars)),
        "tables": field(st.dictionaries(st.sampled_from(TABLES) | texts, table, max_size=3)),
        "gates": field(st.lists(gates(), max_size=3)),
        "artifacts": field(
            st.dictionaries(
                mostly(st.sampled_from(FIGURES), texts, one_in=10),
                mostly(st.sampled_from(SOURCES[:3]), st.sampled_from(SOURCES) | texts, one_in=10),
                max_size=3,
            )
        ),
        "provenance": field(st.just(provenance)),
    }


@st.composite
def gates(draw: st.DrawFn) -> dict[str, Any]:
    name, value = draw(texts), draw(numbers)
    op, threshold = (
        draw(mostly(st.sampled_from(["<=", ">=", "==", "<", ">"]), texts)),
        draw(numbers),
    )
    try:  # mostly the right verdict, so that records get past the gates and into the ADRs
        right = Gate.judge(name, float(value), op, float(threshold)).passed
    except (RecordError, OverflowError):
        right = False
    passed = draw(mostly(st.just(right), st.just(not right)))
    return {"name": name, "value": value, "op": op, "threshold": threshold, "passed": passed}


def _json(record: dict[str, Any], depth: int, root: Path) -> str:
    text = json.dumps(record).replace("{root}", str(root))
    return text.replace(json.dumps(DEEP), "[" * depth + "]" * depth)


def _set_up(root: Path) -> tuple[Path, Path]:
    adr_dir, run_dir = root / "adr", root / "results" / "run-1"
    adr_dir.mkdir()
    for name, text in ADRS.items():
        (adr_dir / name).write_bytes(text.encode())
    (adr_dir / "decisions.toml").write_bytes(DECISIONS)
    (run_dir / "fig").mkdir(parents=True)
    (run_dir / "fig" / "plot.png").write_bytes(PNG + b"plot")
    (run_dir / "fig" / "fake.png").write_text("not a PNG")
    (root / "outside.png").write_bytes(PNG + b"not the run's")
    return adr_dir, root / "results"


def _update(adr_dir: Path, results: Path, *extra: str) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        code = main(["update", "--adr-dir", str(adr_dir), "--results", str(results), *extra])
    return code, stderr.getvalue()


@settings(
    max_examples=120,
    deadline=None,  # a slow CI machine is no failure
    database=None,  # no example store in the repository
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    stage_records=st.lists(records(), min_size=1, max_size=3),
    depth=st.sampled_from([1, 50, 3000]),
)
def test_any_record_gives_valid_adrs_or_one_line_and_no_change(
    stage_records: list[dict[str, Any]], depth: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        adr_dir, results = _set_up(root)
        for index, record in enumerate(stage_records):
            # Named for its stage, as a results root lays records out (any other name is an
            # error of its own); a stage drawn twice keeps the name of the first.
            stage = record.get("stage")
            name = f"{stage}.json" if stage in STAGES else f"record-{index}.json"
            if (results / "run-1" / name).exists():
                name = f"record-{index}.json"
            (results / "run-1" / name).write_text(_json(record, depth, root))
        before = tree_hashes(root)
        outside_before = {p: h for p, h in before.items() if not p.startswith(str(adr_dir))}

        code, err = _update(adr_dir, results)

        after = tree_hashes(root)
        event(f"exit {code}")  # --hypothesis-show-statistics shows how often each came
        if code == 2:
            assert err.startswith("adrkit: error: ") and err.count("\n") == 1, err
            assert after == before
            return
        assert (code, err) == (0, "")
        assert {p: h for p, h in after.items() if not p.startswith(str(adr_dir))} == outside_before
        written = sorted(str(p.relative_to(adr_dir)) for p in adr_dir.rglob("*") if p.is_file())
        own = [*ADRS, "README.md", "decisions.toml"]
        assert all(name in own or name.startswith("assets/") for name in written)
        for name, original in ADRS.items():
            text = (adr_dir / name).read_bytes().decode("utf-8")
            assert human_text(text) == human_text(original)
            assert [b.key for b in parse(adr_dir / name, text).blocks] == KEYS
            assert text.count("<!--") == MARKERS[name]
        assert _update(adr_dir, results, "--check") == (0, "")
