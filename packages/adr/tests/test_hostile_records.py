"""Records the schema accepts but no stage writes: every block renders them, and a decision row
that cannot read its figure says "not measured" and why, never a traceback (which under
`--check` would read as "stale").

Each stage's record is built whole (every metric and column the blocks read), then broken one
way at a time: one metric a 400-digit integer, one column of one table gone. The decision
summaries are the ones `docs/adr/decisions.toml` declares (read on purpose: they are the rows
the ADRs show).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from adrkit import (
    BLOCKS,
    Evidence,
    Shown,
    load_decisions,
    load_hardware,
    render_block,
    write_record,
)
from adrkit._render import EVIDENCE_BLOCKS
from adrkit.schema import Record, Table

from conftest import assert_one_line_error, make_record, run_update

REPO_ADR_DIR = Path(__file__).resolve().parents[3] / "docs" / "adr"
HUGE = 10**400

E2E = ["bench", "measurement", "verdict", "value", "kv_cache_dtype", "block_size"]
E2E += ["input_len", "output_len", "batch", "compilation", "graphs"]


FINDING_COLUMNS = ["stream", "path", "old_path", "area", "change", "old_mode", "new_mode"]
FINDING_COLUMNS += ["content", "lines_added", "lines_removed", "keywords", "excerpt"]
FINDING = ["A", "vllm/core/a.py", None, "kv_cache", "modified", "100644", "100644"]
FINDING += ["text", 1, 1, "int8", "+x = 1"]
QUESTION_COLUMNS = ["question", "answer", "kind", "subject", "change", "name", "old", "new"]
QUESTION_COLUMNS += ["path"]
QUESTION = ["int8_kv_cache", "yes", "fact", "cache_dtype", "added", "int8", None, None]
QUESTION += ["vllm/config/cache.py"]


def _e2e_rows() -> list[list[object]]:
    rows = []
    for bench, value in (("throughput", 100.0), ("latency", 0.5)):
        for dtype in ("auto", "int8_per_token_head"):
            for block, compilation, graphs in ((16, 0, False), (32, 3, True)):
                shape = [block, 128, 64, 8, compilation, graphs]
                rows.append([bench, "timed", "passed", value, dtype, *shape])
    return rows


def whole_records() -> dict[str, Record]:
    """One record per stage with every metric and column a block or a decision row reads."""

    def record(stage: str, metrics: dict[str, object], tables: dict[str, Table]) -> Record:
        base = make_record(stage, run_id=f"{stage}-1")
        return dataclasses.replace(base, metrics=metrics, tables=tables, gates=[])  # type: ignore[arg-type]

    return {
        "kernels": record(
            "kernels",
            {},
            {
                "resources": Table(
                    ["target", "cells", "failed", "spill_bytes", "waves_per_simd"],
                    [["gfx90a", 24, 0, 0, 2], ["sm_90", 24, 0, 0, 4]],
                )
            },
        ),
        "correctness": record(
            "correctness",
            {"worst_error_to_tolerance": 0.4, "edge_cases_failed": 0},
            {"errors": Table(["kernel", "verdict"], [["decode", "passed"]])},
        ),
        "accuracy": record(
            "accuracy",
            {
                "rows": 4,
                "rows_passed": 4,
                "rows_inconclusive": 0,
                "rows_failed": 0,
                "divergence_positions": 128,
                "divergence_mean_kld": 0.001,
                "divergence_mean_kld_stderr": 0.0001,
                "divergence_same_top1": 0.99,
                "divergence_ppl_ratio": 1.001,
                "divergence_controls_failed": 0,
            },
            {"deltas": Table(["task", "delta"], [["arc", 0.01]])},
        ),
        "throughput": record(
            "throughput",
            {
                "int8_bytes_per_token_vs_16bit": 0.52,
                "decode_speedup_vs_16bit_min": 1.4,
                "decode_speedup_vs_16bit_max": 1.7,
                "prefill_speedup_vs_16bit_min": 0.8,
                "prefill_speedup_vs_16bit_max": 0.9,
            },
            {
                "e2e": Table(E2E, _e2e_rows()),
                "capacity": Table(
                    ["source_kind", "kv_cache_dtype", "cache_dtype", "block_size", "max_tokens"],
                    [
                        ["computed", "auto", "bfloat16", 16, 1000],
                        ["computed", "int8_per_token_head", "int8", 16, 1940],
                        ["engine", "auto", "float32", 16, 500],
                        ["engine", "int8_per_token_head", "int8", 16, 1900],
                    ],
                ),
                "kernels": Table(["op", "speedup_vs_16bit"], [["decode", 1.5]]),
            },
        ),
        "audit": record(
            "audit",
            {
                "surprise": True,
                "files_total": 3,
                "vendor_risk_files": 1,
                "record_mismatch_files": 1,
                "integrity_problem_files": 1,
                "vendor_risk_stream_a": 1,
                "vendor_risk_stream_b": 0,
                "vendor_risk_stream_c": 0,
                "vendor_risk_no_stream": 1,
                "base_given": False,
            },
            {
                "findings": Table(FINDING_COLUMNS, [FINDING]),
                "questions": Table(QUESTION_COLUMNS, [QUESTION]),
                "changes": Table(["status", "path"], [["M", "vllm/core/a.py"]]),
                "left-out": Table(["path", "side", "code"], [["PKG-INFO", "fork", "sdist-x"]]),
            },
        ),
    }


def _variants() -> list[tuple[str, dict[str, Record]]]:
    """(what is broken, the records) for each metric made huge and each column dropped."""
    whole = whole_records()
    variants = [("nothing", whole)]
    for stage, record in whole.items():
        for metric in record.metrics:
            metrics = {**record.metrics, metric: HUGE}
            changed = dataclasses.replace(record, metrics=metrics)
            variants.append((f"{stage}.{metric} = 10**400", {**whole, stage: changed}))
        for name, table in record.tables.items():
            for index, column in enumerate(table.columns):
                columns = [c for i, c in enumerate(table.columns) if i != index]
                rows = [[v for i, v in enumerate(row) if i != index] for row in table.rows]
                tables = {**record.tables, name: Table(columns, rows)}
                changed = dataclasses.replace(record, tables=tables)
                variants.append((f"{stage}.{name} without {column}", {**whole, stage: changed}))
    return variants


VARIANTS = _variants()


@pytest.mark.parametrize(("broken", "records"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_every_block_renders_any_record_the_schema_accepts(
    broken: str, records: dict[str, Record]
) -> None:
    shown = Shown(
        Evidence.of(records.values()), load_hardware(REPO_ADR_DIR), load_decisions(REPO_ADR_DIR)
    )
    for key in sorted({*BLOCKS, *EVIDENCE_BLOCKS}):
        for lang in ("en", "zh"):
            body = render_block(key, shown, lang)
            assert "<!--" not in body, (key, lang)


SUMMARY_ROWS = {
    "throughput.int8_bytes_per_token_vs_16bit = 10**400": (
        "decision-0009",
        "the record's `int8_bytes_per_token_vs_16bit` is not a finite number",
    ),
    "throughput.capacity without max_tokens": (
        "decision-0010",
        "the record's table `capacity` has no column `max_tokens`",
    ),
    "throughput.e2e without block_size": (
        "decision-0010",
        "the record's table `e2e` has no column `block_size`",
    ),
    "audit.questions without answer": (
        "decision-0012",
        "the record's table `questions` has no column `answer`",
    ),
}


@pytest.mark.parametrize("broken", sorted(SUMMARY_ROWS))
def test_a_row_that_cannot_read_its_figure_says_not_measured_and_why(broken: str) -> None:
    records = dict(VARIANTS)[broken]
    shown = Shown(
        Evidence.of(records.values()), load_hardware(REPO_ADR_DIR), load_decisions(REPO_ADR_DIR)
    )
    block, why = SUMMARY_ROWS[broken]
    body = render_block(block, shown, "en")
    row = next(line for line in body.splitlines() if why in line)
    assert row.endswith("| not measured |")


def test_the_command_renders_a_huge_metric_and_check_reads_it_as_up_to_date(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    adr_dir = tmp_path / "adr"
    adr_dir.mkdir()
    (adr_dir / "decisions.toml").write_bytes((REPO_ADR_DIR / "decisions.toml").read_bytes())
    (adr_dir / "0010-x.md").write_text(
        "---\nlang: zh\n---\n# 0010\n"
        "<!-- generated:decision-0009 begin -->\n<!-- generated:decision-0009 end -->\n"
        "<!-- generated:decision-0010 begin -->\n<!-- generated:decision-0010 end -->\n"
    )
    records = dict(VARIANTS)["throughput.int8_bytes_per_token_vs_16bit = 10**400"]
    results = tmp_path / "results"
    write_record(results, records["throughput"])
    assert run_update(capsys, adr_dir, results) == (0, "")
    assert (
        "记录中的 `int8_bytes_per_token_vs_16bit` 不是有限数值"
        in (adr_dir / "0010-x.md").read_text()
    )
    assert run_update(capsys, adr_dir, results, "--check") == (0, "")
    # A record too broken for the schema is still exit 2 under --check, never 1.
    (results / "throughput-1" / "throughput.json").write_text("{")
    code, err = run_update(capsys, adr_dir, results, "--check")
    assert code == 2
    assert_one_line_error(err, "cannot read results record")
