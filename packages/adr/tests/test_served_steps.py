"""ADR 0010's served steps: each engine step's INT8 time beside our 16-bit step and upstream's on
the same batch, and the two decision rows whose gates judge the step where each ratio is
highest (one passes, one fails here)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from adrkit import Evidence, Shown, load_decisions, load_hardware, render_block
from adrkit.schema import Record, Scalar, Table

from conftest import make_record

REPO_ADR_DIR = Path(__file__).resolve().parents[3] / "docs" / "adr"
UPSTREAM = "vLLM 0.32.0 (its kernel files from a wheel, behind kvquant's stand-ins)"
COLUMNS = ["impl", "step", "heads", "cache_dtype", "layers", "measurement", "eager_ms", "graph_ms"]
COLUMNS += ["eager_over_graph", "plan_ms", "issue_ms", "time_vs_16bit", "time_vs_upstream_bf16"]
COLUMNS += ["time_vs_upstream_int8", "baseline", "judgement", "history_runs", "verdict"]
MIXED = "128x1024 + 1x(0+512)"


def _row(impl: str, step: str, cache: str, eager: float, graph: float, *ratios: float | None
         ) -> list[Scalar]:  # fmt: skip
    vs16, vs_bf16, vs_int8 = (*ratios, None, None, None)[:3]
    return [
        impl, step, "32/8x128", cache, 32, "timed", eager, graph, eager / graph, 0.06, 1.8,
        vs16, vs_bf16, vs_int8, UPSTREAM if impl == "vllm" else None, "history-too-short",
        "0/3", "passed",
    ]  # fmt: skip


def _record() -> Record:
    rows = [
        _row("kvquant", "64x4096", "int8", 4.93, 4.80, 0.565, 0.531, 0.190),
        _row("kvquant", "64x4096", "bfloat16", 8.73, 8.53, None, 0.940),
        _row("vllm", "64x4096", "bfloat16", 9.29, 9.09),
        _row("vllm", "64x4096", "int8", 26.01, 25.74),
        _row("kvquant", MIXED, "int8", 4.05, 3.64, 0.689, 0.584, 0.229),
        _row("kvquant", MIXED, "bfloat16", 5.88, 5.29, None, 0.847),
        _row("vllm", MIXED, "bfloat16", 6.94, 6.60),
        _row("vllm", MIXED, "int8", 17.71, 17.22),
    ]
    metrics: dict[str, Scalar] = {
        "served_int8_time_vs_upstream_bf16_max": 0.584,
        "served_int8_time_vs_upstream_bf16_min": 0.531,
        "served_int8_time_vs_upstream_bf16_worst": MIXED,
        "served_int8_time_vs_16bit_max": 0.689,
        "served_int8_time_vs_16bit_min": 0.565,
        "served_int8_time_vs_16bit_worst": MIXED,
        "served_int8_eager_over_graph_max": 4.05 / 3.64,
        "served_int8_eager_over_graph_min": 4.93 / 4.80,
        "served_int8_eager_over_graph_worst": MIXED,
        "served_baseline_vllm": UPSTREAM,
    }
    record = make_record("throughput")
    hardware = {"accelerator": "NVIDIA H200", "accelerator_arch": "sm_90"}
    return dataclasses.replace(
        record,
        metrics=metrics,
        tables={"served_steps": Table(COLUMNS, rows)},
        provenance=dataclasses.replace(record.provenance, hardware=hardware),
    )


def test_each_step_shows_our_int8_step_beside_its_baselines() -> None:
    en = render_block("kvbench-served-step", {"throughput": _record()}, "en")
    header = en.splitlines()[0]
    for column in ("Step", "INT8 step ms (eager)", "INT8 ms (graph)", "Eager / graph",
                   "Host: plan ms", "Our 16-bit ms", "Upstream bf16 ms", "Upstream INT8 ms",
                   "INT8 / upstream bf16"):  # fmt: skip
        assert f"| {column} |" in header, header
    assert f"| {MIXED} | 32/8x128 | 32 | timed | 4.05 | 3.64 | 1.113 | 0.06 | 1.8 | 5.88 | " in en
    assert "| 6.94 | 17.71 | 0.689 | 0.584 | 0.229 |" in en
    zh = render_block("kvbench-served-step", {"throughput": _record()}, "zh")
    assert "| 引擎步 |" in zh.splitlines()[0] and "| INT8 / 上游 bf16 |" in zh


def test_a_record_without_served_steps_says_where_they_are_timed() -> None:
    record = dataclasses.replace(_record(), tables={"served_steps": Table(COLUMNS, [])})
    en = render_block("kvbench-served-step", {"throughput": record}, "en")
    assert "has no served-step cells; they are timed on a GPU" in en


def test_the_decision_rows_judge_the_highest_ratio_and_can_fail() -> None:
    shown = Shown(
        Evidence.of([_record()]), load_hardware(REPO_ADR_DIR), load_decisions(REPO_ADR_DIR)
    )
    lines = render_block("decision-0010", shown, "en").splitlines()
    step = next(line for line in lines if "| A served engine step" in line)
    assert (
        f"INT8's step takes 0.531× – 0.584× of upstream vLLM's bf16 step's time (highest: "
        f"{MIXED}) and 0.689× of our 16-bit step's (highest: {MIXED}); upstream: vLLM 0.32.0"
    ) in step
    assert step.endswith("| passed |"), step
    # 1.11 is over the host row's 1.1: the row fails, naming the step.
    host = next(line for line in lines if "| Host work of a served step" in line)
    assert (
        f"1.03× – 1.11× the time of the same launches replayed in a graph (highest: {MIXED})"
        in host
    )
    assert host.endswith("| failed |"), host
