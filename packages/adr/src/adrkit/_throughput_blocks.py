"""The kernel throughput block (ADR 0009) and the served-step block (ADR 0010).

The kernel block: kvquant's INT8 and 16-bit kernels and the baselines
timed beside them, one row per op and shape. The record holds one row per cell (kvquant's, upstream
vLLM's, SDPA flash's); the block sets each shape's cells side by side, with the INT8 cell's speed-up
over each baseline, and under the table names the upstream the baselines ran, or why each baseline
was not measured. A record from before the baselines (no `impl` column) is shown as recorded.

The served-step block: one row per engine step, our INT8 step's eager and graph times with its
host's part, beside our 16-bit step and upstream's bf16 and INT8 steps on the same batch, and the
INT8 step's time over each (below 1: ours is faster).
"""

from __future__ import annotations

from adrkit._block_sources import BLOCK_SOURCES
from adrkit._labels import label
from adrkit._markdown import code_cell, markdown_text
from adrkit._stage_renderer import Records, StageRenderer, render_record_table
from adrkit.schema import Record, Scalar, Table

_SOURCE = BLOCK_SOURCES["kvbench-kernel-throughput"]
_SHAPE = ("op", "heads", "batch", "context", "prefix")
# The cells of one shape, by (impl, whether the cache is INT8).
_INT8, _SIXTEEN = ("kvquant", True), ("kvquant", False)
_TIMES = {
    "upstream_int8_ms": ("vllm", True),
    "upstream_bf16_ms": ("vllm", False),
    "sdpa_ms": ("sdpa", False),
}
_SPEEDUPS = (
    "speedup_vs_16bit",
    "speedup_vs_upstream_bf16",
    "speedup_vs_upstream_int8",
    "speedup_vs_sdpa",
)
_NEEDED = frozenset({"impl", *_SHAPE, "cache_dtype", "median_ms", "verdict", *_SPEEDUPS})
# The baselines a record names in its metrics: (metric of the version, of why not, label).
_BASELINES = (
    ("baseline_vllm", "baseline_vllm_not_measured", "baseline-vllm"),
    ("baseline_sdpa", "baseline_sdpa_not_measured", "baseline-sdpa"),
)


def _time(row: dict[str, Scalar] | None) -> Scalar:
    """A cell's median, or the word for a baseline that was not measured here."""
    if row is None:
        return None
    if str(row.get("verdict", "")).startswith("not measured"):
        return "not-measured"
    return row.get("median_ms")


def _pivot(table: Table, lang: str) -> tuple[list[str], list[list[Scalar]]]:
    shapes: dict[tuple[Scalar, ...], dict[tuple[str, bool], dict[str, Scalar]]] = {}
    for row in table.keyed_rows():
        cell = (str(row["impl"]), row["cache_dtype"] == "int8")
        shapes.setdefault(tuple(row[k] for k in _SHAPE), {})[cell] = row
    columns = [*_SHAPE, "measurement", "int8_ms", "gbs", "copy_fraction", "sixteen_bit_ms"]
    columns += [*_TIMES, *_SPEEDUPS, "judgement", "verdict"]
    rows: list[list[Scalar]] = []
    for shape, cells in shapes.items():
        ours = cells.get(_INT8) or cells.get(_SIXTEEN) or {}
        failed = [
            c for c in cells.values() if c.get("impl") == "kvquant" and c["verdict"] != "passed"
        ]
        verdict = failed[0]["verdict"] if failed else ours.get("verdict")
        int8 = cells.get(_INT8, {})
        rows.append(
            [
                *shape,
                ours.get("measurement"),
                _time(cells.get(_INT8)),
                int8.get("gbs"),
                int8.get("copy_fraction"),
                _time(cells.get(_SIXTEEN)),
                *(_time(cells.get(key)) for key in _TIMES.values()),
                *(int8.get(field) for field in _SPEEDUPS),
                ours.get("judgement"),
                verdict if verdict in (None, "passed") else code_cell(str(verdict)),
            ]
        )
    return columns, rows


def _baselines_line(record: Record, lang: str) -> str | None:
    """Which baselines ran, and each one that was not measured here and why."""
    parts = []
    for version, missing, name in _BASELINES:
        ran, why = record.metrics.get(version), record.metrics.get(missing)
        if isinstance(ran, str):
            parts.append(markdown_text(label(lang, name)) + " " + code_cell(ran))
        elif isinstance(why, str):
            words = label(lang, "baseline-not-measured", baseline=label(lang, name))
            parts.append(markdown_text(words) + " " + code_cell(why))
    return "_" + label(lang, "list-separator").join(parts) + "_" if parts else None


def _render(records: Records, lang: str) -> str:
    body = _TABLE(records, lang)
    record = records.get(_SOURCE.stage)
    line = _baselines_line(record, lang) if record is not None else None
    if line is None:
        return body
    # Under the table, above its figures and source line.
    table_end = body.find("\n\n")
    if table_end < 0:
        return f"{body}\n\n{line}"
    return f"{body[:table_end]}\n\n{line}{body[table_end:]}"


_TABLE = render_record_table(
    "kvbench-kernel-throughput",
    "no-rows",
    present=(_pivot, _NEEDED),
    verbatim=frozenset({"verdict"}),
)

_STEP = ("step", "heads", "layers")
_STEP_TIMES = {
    "sixteen_bit_ms": ("kvquant", False),
    "upstream_bf16_ms": ("vllm", False),
    "upstream_int8_ms": ("vllm", True),
}
_STEP_RATIOS = ("time_vs_16bit", "time_vs_upstream_bf16", "time_vs_upstream_int8")
_STEP_NEEDED = frozenset(
    {"impl", *_STEP, "cache_dtype", "eager_ms", "graph_ms", "eager_over_graph", "plan_ms",
     "issue_ms", "verdict", *_STEP_RATIOS}
)  # fmt: skip


def _time_of(row: dict[str, Scalar] | None) -> Scalar:
    """A step's eager ms, or the word for a baseline that was not measured here."""
    if row is None:
        return None
    if str(row.get("verdict", "")).startswith("not measured"):
        return "not-measured"
    return row.get("eager_ms")


def _pivot_steps(table: Table, lang: str) -> tuple[list[str], list[list[Scalar]]]:
    steps: dict[tuple[Scalar, ...], dict[tuple[str, bool], dict[str, Scalar]]] = {}
    for row in table.keyed_rows():
        cell = (str(row["impl"]), row["cache_dtype"] == "int8")
        steps.setdefault(tuple(row[k] for k in _STEP), {})[cell] = row
    columns = [*_STEP, "measurement", "int8_eager_ms", "int8_graph_ms", "eager_over_graph"]
    columns += ["plan_ms", "issue_ms", *_STEP_TIMES, *_STEP_RATIOS, "judgement", "verdict"]
    rows: list[list[Scalar]] = []
    for step, cells in steps.items():
        int8 = cells.get(_INT8, {})
        ours = int8 or cells.get(_SIXTEEN) or {}
        failed = [
            c for c in cells.values() if c.get("impl") == "kvquant" and c["verdict"] != "passed"
        ]
        verdict = failed[0]["verdict"] if failed else ours.get("verdict")
        rows.append(
            [
                *step,
                ours.get("measurement"),
                _time_of(cells.get(_INT8)),
                int8.get("graph_ms"),
                int8.get("eager_over_graph"),
                int8.get("plan_ms"),
                int8.get("issue_ms"),
                *(_time_of(cells.get(key)) for key in _STEP_TIMES.values()),
                *(int8.get(field) for field in _STEP_RATIOS),
                ours.get("judgement"),
                verdict if verdict in (None, "passed") else code_cell(str(verdict)),
            ]
        )
    return columns, rows


THROUGHPUT_BLOCKS = {
    "kvbench-kernel-throughput": StageRenderer(_SOURCE.stage, _render),
    "kvbench-served-step": render_record_table(
        "kvbench-served-step",
        "no-served-steps",
        present=(_pivot_steps, _STEP_NEEDED),
        verbatim=frozenset({"verdict"}),
    ),
}
