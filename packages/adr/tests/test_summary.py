"""The decision summaries: each row's figure is the record's, rows nothing measured say so, the
milestone check fails on a missing, failed or stale row, and each language stays itself."""

from __future__ import annotations

import dataclasses
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from adrkit import (
    Evidence,
    Shown,
    load_decisions,
    load_hardware,
    milestone_problems,
    render_block,
    write_record,
)
from adrkit.schema import Gate, Record, Scalar, Table

from conftest import make_record, run_update

REPO_ADR_DIR = Path(__file__).resolve().parents[3] / "docs" / "adr"
H200 = {"accelerator": "NVIDIA H200", "accelerator_arch": "sm_90"}
DECODE = "Decode speed, INT8 against our 16-bit and upstream vLLM's bf16 and INT8 (timed on a GPU)"
PREFILL = (
    "Prefill speed, INT8 against our 16-bit, upstream vLLM's bf16 and INT8, and SDPA flash "
    "(timed on a GPU)"
)


def _on(record: Record, hardware: dict[str, str] | None, ended_at: str) -> Record:
    provenance = dataclasses.replace(
        record.provenance, hardware=dict(hardware or {}), ended_at=ended_at
    )
    return dataclasses.replace(record, provenance=provenance)


def throughput(ended_at: str = "2026-12-01T10:00:00Z") -> Record:
    record = make_record("throughput", run_id="gpu-1")
    record = dataclasses.replace(
        record,
        metrics={
            "int8_bytes_per_token_vs_16bit": 0.5156,
            "decode_speedup_vs_16bit_min": 1.71,
            "decode_speedup_vs_16bit_max": 1.91,
            "prefill_speedup_vs_16bit_min": 0.74,
            "prefill_speedup_vs_16bit_max": 0.77,
        },
        tables={},
        gates=[],
    )
    return _on(record, H200, ended_at)


def accuracy(
    ended_at: str = "2026-12-01T11:00:00Z",
    controls_failed: int = 0,
    decode_metrics: dict[str, Scalar] | None = None,
    gates: tuple[Gate, ...] = (),
) -> Record:
    decode_metrics = decode_metrics or {}
    record = make_record("accuracy", run_id="gpu-1")
    record = dataclasses.replace(
        record,
        metrics={
            "rows": 4,
            "rows_passed": 3,
            "rows_inconclusive": 1,
            "rows_failed": 0,
            "divergence_positions": 16384,
            "divergence_mean_kld": 0.00123,
            "divergence_mean_kld_stderr": 0.00004,
            "divergence_same_top1": 0.9871,
            "divergence_ppl_ratio": 1.0012,
            "divergence_controls_failed": controls_failed,
            "divergence_corpus": "lambada-passages",
            "divergence_kernel": "prefill",
            "divergence_context": "≤512",
            "model": "SmolLM2-135M-Instruct.Q4_1",
            "model_weights": "Q4_1 GGUF",
            "model_dtype": "bfloat16",
            **decode_metrics,
        },
        tables={},
        gates=[Gate.judge("divergence int8 (kernels) mean KLD", 0.00123, "<=", 0.01), *gates],
    )
    return _on(record, H200, ended_at)


DECODE_METRICS: dict[str, Scalar] = {
    "decode_corpus": "qasper-papers",
    "decode_documents": "whole documents",
    "decode_texts": 16,
    "decode_contexts": "≤512, 513-2048, 2049-4096, 4097-8192",
    "decode_context_max": 8191,
    "decode_positions": 130032,
    "decode_worst_context": "4097-8192",
    "decode_worst_mean_kld": 0.0021,
    "decode_worst_mean_kld_stderr": 0.0001,
    "decode_min_same_top1": 0.968,
    "decode_max_ppl_ratio": 1.0009,
    "decode_degraded_min_mean_kld": 0.24,
    "decode_degraded_gate": "failed",
    "decode_near_gate": "int6",
    "decode_near_gate_min_mean_kld": 0.011,
    "decode_near_gate_mean_kld": 0.014,
    "decode_near_gate_verdict": "failed",
    "decode_trap_verdict": "exactly-0",
}
DIVERGENCE_DECODE = "Accuracy cost through the decode kernel, by context length"


ROCM_SELECTOR = "vllm.platforms.rocm:RocmPlatform.get_attn_backend_cls"


def audit(ended_at: str = "2026-12-01T02:00:00Z", hooks_changed: int = 1) -> Record:
    record = make_record("audit", run_id="cpu-1")
    metrics = {
        "surprise": True,
        "files_total": 1,
        "vendor_risk_files": 1,
        "vendor_risk_stream_a": 0,
        "vendor_risk_stream_b": 0,
        "vendor_risk_stream_c": 1,
        "upstream": "pypi:vllm==0.18.1",
        "plugin_hooks_release": "0.18.1",
        "plugin_hooks_checked": 36,
        "plugin_hooks_changed": hooks_changed,
        "plugin_hooks_missing": 0,
    }
    findings = Table(["stream", "path"], [["C", "vllm/platforms/__init__.py"]])
    questions = Table(["question", "answer"], [["fp8_kv_cache", "no"], ["int8_kv_cache", "no"]])
    status = "changed" if hooks_changed else "unchanged"
    hooks = Table(
        ["symbol", "status"],
        [["vllm.config.cache:CacheDType", "unchanged"], [ROCM_SELECTOR, status]],
    )
    gates = [
        Gate.judge("plugin_hooks_changed", hooks_changed, "<=", 0),
        Gate.judge("plugin_hooks_missing", 0, "<=", 0),
    ]
    tables = {"findings": findings, "questions": questions, "hooks": hooks}
    record = dataclasses.replace(record, metrics=metrics, tables=tables, gates=gates)
    return _on(record, None, ended_at)


def _shown(*records: Record) -> Shown:
    return Shown(Evidence.of(records), load_hardware(REPO_ADR_DIR), load_decisions(REPO_ADR_DIR))


def _rows(body: str) -> dict[str, list[str]]:
    rows = {}
    for line in body.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        rows[cells[0]] = cells[1:]
    return rows


def test_the_summarys_figures_are_the_records_own() -> None:
    body = render_block("decision-0009", _shown(throughput(), accuracy()), "en")
    rows = _rows(body)
    memory = rows["KV-cache memory per token, INT8 against 16-bit"]
    commit = "`0123456789ab`"
    assert memory[1:] == ["0.516×", "NVIDIA H200", "2026-12-01", commit, "passed"]
    decode = rows[DECODE]
    assert decode[1:] == ["≥ 1.71× our 16-bit", "NVIDIA H200", "2026-12-01", commit, "passed"]
    assert decode[0].startswith("INT8 is faster by (the baseline's time over INT8's")
    assert "1.71× – 1.91× our 16-bit; upstream bf16 not measured: no such pair" in decode[0]
    prefill = rows[PREFILL]
    assert prefill[1] == "≥ 0.74× our 16-bit" and prefill[-1] == "failed"
    divergence = rows["Accuracy cost: token-level divergence from the 16-bit cache"]
    assert "mean KLD 0.00123 ± 4e-05" in divergence[0] and "16384 positions" in divergence[0]
    assert divergence[0].endswith(
        "positions, of the corpus `lambada-passages`; prefill kernel, context ≤512 tokens; model "
        "`SmolLM2-135M-Instruct.Q4_1` (`Q4_1 GGUF` weights, run in `bfloat16`)"
    )
    assert divergence[-1] == "passed"
    tasks = rows["Accuracy cost: paired task scores"]
    assert tasks[1] == "3/4" and tasks[-1] == "inconclusive"


def test_the_decode_row_names_its_buckets_controls_kernel_and_model() -> None:
    passed = Gate.judge(
        "decode divergence int8 (kernels, context 4097-8192) mean KLD", 0.0021, "<=", 0.005
    )
    record = accuracy(decode_metrics=DECODE_METRICS, gates=(passed,))
    rows = _rows(render_block("decision-0009", _shown(record), "en"))
    decode = rows[DIVERGENCE_DECODE]
    assert decode[1] == "0.0021 ± 0.0001" and decode[-1] == "passed"
    assert decode[0].startswith(
        "every position one decode step, 130032 positions in buckets of context ≤512, "
        "513-2048, 2049-4096, 4097-8192 tokens (up to 8191): worst bucket 4097-8192"
    )
    assert "the 4-bit control failed (mean KLD ≥ 0.24)" in decode[0]
    assert (
        "near-gate control int6 at mean KLD 0.011 to 0.014, failed the gate (not gated)"
        in (decode[0])
    )
    assert decode[0].endswith(
        "16 texts (whole documents), of the corpus `qasper-papers`; decode kernel; model "
        "`SmolLM2-135M-Instruct.Q4_1` (`Q4_1 GGUF` weights, run in `bfloat16`)"
    )
    failed = Gate.judge(
        "decode divergence int8 (kernels, context ≤512) same top-1", 0.9, ">=", 0.95
    )
    record = accuracy(decode_metrics=DECODE_METRICS, gates=(passed, failed))
    assert _rows(render_block("decision-0009", _shown(record), "en"))[DIVERGENCE_DECODE][-1] == (
        "failed"
    )
    # The prefill row is judged by its own gates only.
    assert (
        _rows(render_block("decision-0009", _shown(record), "en"))[
            "Accuracy cost: token-level divergence from the 16-bit cache"
        ][-1]
        == "passed"
    )
    zh = render_block("decision-0009", _shown(record), "zh")
    assert "每个位置都是一次解码步，共 130032 个位置" in zh and "解码内核" in zh
    assert "陷阱恰为 0" in zh.replace(" 恰", "恰") and "（完整文档）" in zh
    assert "trap exactly 0; 16 texts (whole documents)" in decode[0]


def test_a_record_without_a_decode_run_leaves_the_decode_row_not_measured() -> None:
    decode = _rows(render_block("decision-0009", _shown(accuracy()), "en"))[DIVERGENCE_DECODE]
    assert decode[0] == "the record has no `decode_worst_mean_kld`"
    assert decode[1] == "not measured"


def test_a_misbehaving_control_fails_the_divergence_row() -> None:
    body = render_block("decision-0009", _shown(accuracy(controls_failed=1)), "en")
    assert _rows(body)["Accuracy cost: token-level divergence from the 16-bit cache"][-1] == (
        "failed"
    )


def test_rows_nothing_measured_say_so_and_why() -> None:
    rows = _rows(render_block("decision-0009", _shown(audit()), "en"))
    decode = rows[DECODE]
    assert decode[0] == "stage `throughput` has no record"
    assert decode[1] == "not measured" and decode[-1] == "not measured"
    runs = rows["Runs on gfx90a"]
    assert runs[0] == "gfx90a node (CDNA2): not yet run"


@pytest.mark.parametrize(
    ("status", "note"), [("passed", "compiled, not yet run"), ("failed", "not yet run")]
)
def test_the_summary_and_the_blocks_say_alike_whether_gfx90a_was_compiled(
    status: str, note: str
) -> None:
    # Every gfx90a cell compiled; a build that failed elsewhere verified none of them.
    columns = ["target", "kernel", "cache", "cells", "failed", "spill_bytes", "waves_per_simd"]
    resources = Table(columns, [["gfx90a", "decode_attention", "int8", 2, 0, 0, 4]])
    kernels = dataclasses.replace(
        make_record(
            "kernels", status=status, reason=None if status == "passed" else "sm90: a cell failed"
        ),
        tables={"resources": resources},
        gates=[],
    )
    shown = _shown(kernels)
    runs = _rows(render_block("decision-0009", shown, "en"))["Runs on gfx90a"]
    assert runs[0] == f"gfx90a node (CDNA2): {note}"
    assert f"_gfx90a node (CDNA2): {note}_" in render_block("kvquant-correctness", shown, "en")


def test_a_build_record_without_a_column_the_gfx90a_row_reads_is_not_measured() -> None:
    columns = ["target", "kernel", "cache", "cells", "failed", "waves_per_simd"]
    resources = Table(columns, [["gfx90a", "decode_attention", "int8", 2, 0, 4]])
    kernels = dataclasses.replace(make_record("kernels"), tables={"resources": resources}, gates=[])
    build = _rows(render_block("decision-0009", _shown(kernels), "en"))[
        "Builds on gfx90a, and at what occupancy"
    ]
    assert build[0] == "the record has no `resources.spill_bytes`"
    assert build[1] == "not measured" and build[-1] == "not measured"


def test_the_fork_summary_names_the_files_of_each_stream() -> None:
    rows = _rows(render_block("decision-0012", _shown(audit()), "en"))
    assert rows["Is the fork the upstream release it claims?"][0].startswith("no: 1 of 1")
    stream_c = rows["Vendor changes touching stream C (compilation, attention backends)"]
    assert stream_c[0] == "1 vendor change(s) in stream C: `vllm/platforms/__init__.py`"
    assert stream_c[-1] == "failed"
    assert rows["Vendor changes touching stream B (KV quantization)"][-1] == "passed"


def test_the_fork_summary_names_the_plugin_hooks_the_fork_changed() -> None:
    question = "Does the fork still offer every upstream hook kvquant's vLLM plugin relies on?"
    row = _rows(render_block("decision-0012", _shown(audit()), "en"))[question]
    assert row[0] == (f"no: of 36 hooks of vLLM 0.18.1, 1 changed, 0 missing: `{ROCM_SELECTOR}`")
    assert (row[1], row[-1]) == ("35/36", "failed")
    kept = _rows(render_block("decision-0012", _shown(audit(hooks_changed=0)), "en"))[question]
    assert (kept[0], kept[1], kept[-1]) == (
        "yes: all 36 hooks of vLLM 0.18.1 unchanged",
        "36/36",
        "passed",
    )
    zh = _rows(render_block("decision-0012", _shown(audit()), "zh"))
    zh_question = "厂商分支是否仍提供 kvquant 的 vLLM 插件依赖的全部上游挂钩？"
    assert zh[zh_question][0] == (
        f"否：vLLM 0.18.1 的 36 个挂钩中 1 个已改变，0 个缺失: `{ROCM_SELECTOR}`"
    )


def _milestone_dir(tmp_path: Path) -> Path:
    adr_dir = tmp_path / "adr"
    adr_dir.mkdir()
    for name in ("decisions.toml", "hardware.toml"):
        shutil.copy(REPO_ADR_DIR / name, adr_dir / name)
    return adr_dir


def test_the_milestone_fails_on_missing_failed_and_stale_rows(tmp_path: Path) -> None:
    adr_dir, results = _milestone_dir(tmp_path), tmp_path / "results"
    write_record(results, throughput(ended_at="2026-11-01T00:00:00Z"))
    write_record(results, accuracy(ended_at="2026-12-01T00:00:00Z"))
    now = datetime(2026, 12, 2, tzinfo=UTC)
    problems = milestone_problems(adr_dir, results, now=now)
    assert any("`kv-memory`: its evidence is 31 days old, over the 14" in p for p in problems)
    assert any(
        "`correctness`: not measured (stage `correctness` has no record)" in p for p in problems
    )
    assert any("`fork-base`: not measured" in p for p in problems)
    assert not any("`divergence`" in p for p in problems)  # fresh and passing
    assert not any("`prefill-speed`" in p for p in problems)  # failing, but no milestone row


def test_the_milestone_passes_a_row_that_is_measured_fresh_and_passing(tmp_path: Path) -> None:
    adr_dir, results = _milestone_dir(tmp_path), tmp_path / "results"
    write_record(results, accuracy(ended_at="2026-12-01T00:00:00Z", controls_failed=1))
    now = datetime(2026, 12, 2, tzinfo=UTC)
    problems = milestone_problems(adr_dir, results, now=now)
    assert any(p.startswith("decision-0009 row `divergence`: failed") for p in problems)


# A run of three or more Latin words outside code spans: an English sentence in a zh ADR.
_ENGLISH = re.compile(r"[A-Za-z]{2,}(?:[ ,;:()-]+[A-Za-z]{2,}){2,}")
_CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")


def _prose(body: str) -> str:
    body = re.sub(r"`[^`]*`", "", body)
    return re.sub(r"<code>.*?</code>", "", body)


@pytest.mark.parametrize(
    "key", ["decision-0009", "decision-0010", "decision-0012", "pipeline-status"]
)
def test_each_language_stays_itself(key: str) -> None:
    shown = _shown(throughput(), accuracy(), audit())
    zh, en = render_block(key, shown, "zh"), render_block(key, shown, "en")
    assert not _CJK.search(en), en
    # Hardware and accelerator names are names, not sentences.
    found = [m for m in _ENGLISH.findall(_prose(zh)) if "NVIDIA" not in m and "gfx90a" not in m]
    assert not found, (found, zh)


def test_a_decisions_file_naming_an_unknown_answer_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    adr_dir = tmp_path / "adr"
    adr_dir.mkdir()
    (adr_dir / "0009-int8.md").write_text(
        "# 0009\n<!-- generated:decision-0009 begin -->\n<!-- generated:decision-0009 end -->\n"
    )
    (adr_dir / "decisions.toml").write_text(
        '[[decision-0009]]\nanswer = "speed"\nquestion = { en = "Fast?" }\n'
    )
    results = tmp_path / "results"
    write_record(results, throughput())
    code, err = run_update(capsys, adr_dir, results)
    assert code == 2 and err.count("\n") == 1
    assert "answer 'speed' is not one of" in err


def test_the_status_table_names_each_stage_as_the_pipeline_does() -> None:
    # "kernels" is also a cell word the divergence table translates; a stage keeps its name.
    shown = _shown(make_record("kernels"), audit())
    zh = render_block("pipeline-status", shown, "zh")
    assert re.search(r"^\| kernels \| [^|]+ \| 通过 \|", zh, re.MULTILINE), zh
    assert re.search(r"^\| audit \| [^|]+ \| ", zh, re.MULTILINE), zh


def test_the_status_table_has_a_row_for_each_expected_class_that_has_not_run() -> None:
    # The kernel build compiled every gfx90a cell; no gfx90a node has run a stage yet.
    columns = ["target", "kernel", "cache", "cells", "failed", "spill_bytes", "waves_per_simd"]
    resources = Table(columns, [["gfx90a", "decode_attention", "int8", 2, 0, 0, 4]])
    kernels = dataclasses.replace(make_record("kernels"), tables={"resources": resources})
    en = render_block("pipeline-status", _shown(kernels, throughput()), "en")
    for stage in ("correctness", "accuracy", "throughput"):
        assert f"| {stage} | gfx90a node (CDNA2) | compiled, not yet run | — |" in en, en
    assert "| throughput | NVIDIA H200 | passed |" in en
    assert "| correctness | NVIDIA H200 | not yet run |" in en
    assert "| kernels | CPU (nightly; interpreter and torch references) | passed |" in en


def _two_releases() -> Record:
    """A kernel build at the target's Triton (one wave for the INT8 prefill) and the newest."""
    columns = ["triton", "triton_role", "target", "kernel", "cache", "cells", "failed"]
    columns += ["vgprs", "agprs", "lds_bytes", "spill_bytes", "waves_per_simd"]
    rows: list[list[Scalar]] = [
        ["3.6.0", "target", "gfx90a", "decode_attention", "int8", 2, 0, 147, 8, 16384, 0, 3],
        ["3.6.0", "target", "gfx90a", "prefill_attention", "int8", 2, 0, 216, 64, 16384, 0, 1],
        ["3.9.0", "newest", "gfx90a", "decode_attention", "int8", 2, 0, 140, 0, 16384, 0, 3],
        ["3.9.0", "newest", "gfx90a", "prefill_attention", "int8", 2, 0, 255, 0, 16384, 0, 2],
    ]
    metrics: dict[str, Scalar] = {"triton_target": "3.6.0", "triton_gated": "3.6.0"}
    metrics |= {"triton_newest": "3.9.0", "triton_target_not_built": None}
    metrics["triton_target_source"] = "vLLM 0.18.1 requirements/rocm-build.txt: triton==3.6.0"
    return dataclasses.replace(
        make_record("kernels"),
        metrics=metrics,
        tables={"resources": Table(columns, rows)},
        gates=[Gate.judge("min_waves_per_simd", 1, ">=", 1)],
    )


def test_the_gfx90a_row_judges_the_targets_triton_and_names_the_weakest_cell() -> None:
    build = _rows(render_block("decision-0009", _shown(_two_releases()), "en"))[
        "Builds on gfx90a, and at what occupancy"
    ]
    assert build[0] == (
        "at Triton 3.6.0 (the target's): 4 cells, 0 failed; at least 1 waves per SIMD; 0 spills "
        "(fewest: prefill\\_attention int8); at Triton 3.9.0: at least 2 (prefill\\_attention int8)"
    ).replace("\\_", "_")
    assert build[1] == "≥ 1" and build[-1] == "failed"  # the row asks for two waves


def test_the_resource_block_shows_each_triton_release_as_its_own_columns() -> None:
    zh = render_block("kvquant-resources", {"kernels": _two_releases()}, "zh")
    assert zh.startswith("_gfx90a 目标运行 Triton 3.6.0： `vLLM 0.18.1 requirements")
    assert "VGPR，NVIDIA 为寄存器（最大） · Triton 3.6.0（目标）" in zh
    assert "每 SIMD 波数（最小） · Triton 3.9.0（最新）" in zh
    assert (
        "| gfx90a | prefill_attention | int8 | 2 | 0 | 216 | 64 | 16384 | 0 | 1 | 0 | 255 |" in zh
    )


def test_the_capacity_row_compares_int8_with_a_16_bit_cache_not_the_engines_fp32() -> None:
    columns = ["kv_cache_dtype", "cache_dtype", "block_size", "max_tokens", "source_kind"]
    rows: list[list[Scalar]] = [
        ["auto", "float32", 32, 23296, "computed"],
        ["int8_per_token_head", "int8", 32, 87712, "computed"],
        ["bfloat16", "bfloat16", 32, 46592, "computed"],
        ["auto", "float32", 32, 23296, "engine"],
        ["int8_per_token_head", "int8", 32, 87712, "engine"],
    ]
    record = dataclasses.replace(
        make_record("throughput"), tables={"capacity": Table(columns, rows)}, metrics={}
    )
    row = _rows(render_block("decision-0010", _shown(record), "en"))[
        "KV capacity at a fixed budget, INT8 against a 16-bit cache"
    ]
    assert row[0] == (
        "INT8 holds 1.88× the tokens of a 16-bit (bfloat16) cache in the same budget (computed: "
        "87,712 / 46,592); the engine's own auto cache (float32 here): 3.77×"
    )
    assert row[1] == "1.88×"
    # A record computing no 16-bit cache (written before the row existed) answers nothing.
    older = dataclasses.replace(record, tables={"capacity": Table(columns, rows[:2])})
    old_row = _rows(render_block("decision-0010", _shown(older), "en"))[
        "KV capacity at a fixed budget, INT8 against a 16-bit cache"
    ]
    assert old_row[1] == "not measured"


def test_int8_end_to_end_is_paired_with_auto_of_its_own_vllm_release_and_model_dtype() -> None:
    columns = ["bench", "vllm_version", "model_dtype", "kv_cache_dtype", "block_size"]
    columns += ["input_len", "output_len", "batch", "compilation", "graphs"]
    columns += ["measurement", "value", "verdict"]
    shape: list[Scalar] = [32, 128, 32, 16, 0, False]
    rows: list[list[Scalar]] = [
        ["throughput", "0.18.1", "bfloat16", "auto", *shape, "timed", 200.0, "passed"],
        [
            "throughput",
            "0.18.1",
            "bfloat16",
            "int8_per_token_head",
            *shape,
            "timed",
            150.0,
            "passed",
        ],
        ["throughput", "0.32.0", "float32", "auto", *shape, "timed", 100.0, "passed"],
    ]
    question = "INT8 end-to-end throughput against 16-bit (stream B, timed)"

    def answer(table_rows: list[list[Scalar]]) -> list[str]:
        record = dataclasses.replace(
            make_record("throughput"), tables={"e2e": Table(columns, table_rows)}, metrics={}
        )
        return _rows(render_block("decision-0010", _shown(record), "en"))[question]

    # 150 over its own release's 200, never over 0.32's fp32 100 (which would read 1.5×).
    assert answer(rows)[1] == "0.75× – 0.75×"
    # Without a 16-bit row of its release and dtype, INT8 has nothing to be compared with.
    assert answer(rows[1:])[1] == "not measured"
