"""ADR 0009's kernel throughput: each shape's INT8 cell beside our 16-bit one and the baselines of
the same run (upstream vLLM's bf16 and INT8 kernels, SDPA flash), the speed rows naming each
baseline's weakest cell, and a baseline that was not measured saying why."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from adrkit import Evidence, Shown, load_decisions, load_hardware, render_block
from adrkit.schema import Record, Scalar, Table

from conftest import make_record

REPO_ADR_DIR = Path(__file__).resolve().parents[3] / "docs" / "adr"
UPSTREAM = "vLLM 0.32.0 (its kernel files from a wheel, behind kvquant's stand-ins)"
SDPA_WHY = "PyTorch's SDPA flash backend runs on a CUDA device only"
COLUMNS = ["impl", "op", "heads", "cache_dtype", "batch", "context", "prefix", "measurement"]
COLUMNS += ["median_ms", "gbs", "copy_fraction", "speedup_vs_16bit", "speedup_vs_upstream_bf16"]
COLUMNS += ["speedup_vs_upstream_int8", "speedup_vs_sdpa", "judgement", "verdict"]


def _row(impl: str, op: str, cache: str, ms: float | None, **ratios: float) -> list[Scalar]:
    shape: list[Scalar] = [op, "32/8x128", cache, 1, 8192, 0] if op == "decode" else []
    if op == "prefill":
        shape = [op, "32/8x128", cache, 8, 2048, 0]
    verdict = "passed" if ms is not None else f"not measured: {SDPA_WHY}"
    return [
        impl, *shape, "timed", ms, 680.1, 0.1595,
        ratios.get("speedup_vs_16bit"), ratios.get("speedup_vs_upstream_bf16"),
        ratios.get("speedup_vs_upstream_int8"), ratios.get("speedup_vs_sdpa"),
        "history-too-short", verdict,
    ]  # fmt: skip


def _record() -> Record:
    rows = [
        _row("kvquant", "decode", "int8", 0.0254, speedup_vs_16bit=1.05,
             speedup_vs_upstream_bf16=2.3, speedup_vs_upstream_int8=3.8),
        _row("kvquant", "decode", "bfloat16", 0.0267),
        _row("vllm", "decode", "int8", 0.0966),
        _row("vllm", "decode", "bfloat16", 0.0584),
        _row("kvquant", "prefill", "int8", 1.003, speedup_vs_16bit=1.155),
        _row("kvquant", "prefill", "bfloat16", 1.159),
        _row("sdpa", "prefill", "bfloat16", None),
    ]  # fmt: skip
    metrics: dict[str, Scalar] = {
        "decode_speedup_vs_16bit_min": 1.05,
        "decode_speedup_vs_16bit_max": 1.94,
        "decode_speedup_vs_16bit_weakest": "32/8x128 1 x 8192",
        "decode_speedup_vs_upstream_bf16_min": 2.3,
        "decode_speedup_vs_upstream_bf16_max": 5.1,
        "decode_speedup_vs_upstream_bf16_weakest": "32/1x128 32 x 8192",
        "decode_speedup_vs_upstream_int8_min": 3.8,
        "decode_speedup_vs_upstream_int8_max": 9.3,
        "decode_speedup_vs_upstream_int8_weakest": "32/1x128 8 x 32768",
        "prefill_speedup_vs_16bit_min": 1.155,
        "prefill_speedup_vs_16bit_max": 1.155,
        "prefill_speedup_vs_16bit_weakest": "32/8x128 8 x (0 + 2048)",
        "baseline_vllm": UPSTREAM,
        "baseline_sdpa_not_measured": SDPA_WHY,
    }
    record = make_record("throughput")
    hardware = {"accelerator": "NVIDIA H200", "accelerator_arch": "sm_90"}
    return dataclasses.replace(
        record,
        metrics=metrics,
        tables={"kernels": Table(COLUMNS, rows)},
        provenance=dataclasses.replace(record.provenance, hardware=hardware),
    )


def test_each_shape_shows_its_cells_and_the_baselines_side_by_side() -> None:
    en = render_block("kvbench-kernel-throughput", {"throughput": _record()}, "en")
    header = en.splitlines()[0]
    for column in ("INT8 ms", "Our 16-bit ms", "Upstream INT8 ms", "Upstream bf16 ms"):
        assert f"| {column} |" in header, header
    assert "| × our 16-bit | × upstream bf16 | × upstream INT8 | × SDPA flash |" in header
    assert "Of copy bandwidth (read + write; a decode only reads)" in header
    assert "| Decode | 32/8x128 | 1 | 8192 | 0 | timed | 0.0254 | 680.1 | 0.1595 | 0.0267 | " in en
    assert "| 0.0966 | 0.0584 | — | 1.05 | 2.3 | 3.8 | — |" in en
    # The prefill's SDPA cell was not measured: the cell says so, the line under the table why.
    assert "| Prefill | 32/8x128 | 8 | 2048 | 0 | timed | 1.003 |" in en
    assert "| 1.159 | — | — | not measured | 1.155 |" in en
    assert f"_Upstream: `{UPSTREAM}`, SDPA: not measured, `{SDPA_WHY}`_" in en
    zh = render_block("kvbench-kernel-throughput", {"throughput": _record()}, "zh")
    assert "| 未测量 |" in zh and "SDPA：未测量，原因 `" in zh


def test_the_speed_rows_give_each_baseline_and_its_weakest_cell() -> None:
    shown = Shown(
        Evidence.of([_record()]), load_hardware(REPO_ADR_DIR), load_decisions(REPO_ADR_DIR)
    )
    body = render_block("decision-0009", shown, "en")
    decode = next(line for line in body.splitlines() if "| Decode speed" in line)
    assert (
        "1.05× – 1.94× our 16-bit (lowest: 32/8x128 1 x 8192); "
        "2.3× – 5.1× upstream bf16 (lowest: 32/1x128 32 x 8192); "
        "3.8× – 9.3× upstream INT8 (lowest: 32/1x128 8 x 32768); upstream: vLLM 0.32.0"
    ) in decode
    assert "| ≥ 1.05× our 16-bit, ≥ 2.3× upstream bf16, ≥ 3.8× upstream INT8 |" in decode
    prefill = next(line for line in body.splitlines() if "| Prefill speed" in line)
    assert f"SDPA flash not measured: {SDPA_WHY}" in prefill
    assert "upstream bf16 not measured: no such pair was timed" in prefill
