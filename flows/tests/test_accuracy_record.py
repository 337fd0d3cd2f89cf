"""The accuracy record of real `kvbench divergence` runs on SmolLM2: the divergence table, the
gates on INT8 and on the controls (gates.toml), and ADR 0009's divergence block.

Each run is a subprocess, as the stage's own process would run it; no Prefect engine is needed to
build a record (`stage_record` is plain code).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from adrkit import render_block, utc_now
from adrkit.schema import Record
from flows._stage import RunContext, stage_record
from flows.accuracy import STAGE
from kvbench.accuracy import AccuracyResult

# INT8, the 4-bit control and the prefill trap on two chunks of 64 tokens (the controls on one).
_CONFIG = """
[gate]
max_mean_kld = {max_mean_kld}
min_same_top1 = {min_same_top1}
max_ppl_ratio = {max_ppl_ratio}
path_agreement = 0.1

[[runs]]
mode = "divergence"
corpus = "coqa-stories"
tokens = 128
chunk_length = 64
control_tokens = 64
"""


def _divergence(tmp_path: Path, **gate: float) -> AccuracyResult:
    config = tmp_path / "divergence.toml"
    config.write_text(_CONFIG.format(**gate), encoding="utf-8")
    result = tmp_path / "result.json"
    argv = [sys.executable, "-m", "kvbench", "divergence", "--config", str(config)]
    argv += ["--out", str(tmp_path / "out"), "--json", str(result), "--quiet"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return AccuracyResult.from_dict(json.loads(result.read_text(encoding="utf-8")))


def _record(tmp_path: Path, result: AccuracyResult) -> Record:
    return stage_record(RunContext("run-1", tmp_path), STAGE, utc_now(), result.record_parts())


def test_the_shipped_thresholds_pass_int8_and_the_controls_behave(tmp_path: Path) -> None:
    record = _record(
        tmp_path, _divergence(tmp_path, max_mean_kld=0.005, min_same_top1=0.95, max_ppl_ratio=1.01)
    )
    assert record.status == "passed", record.reason
    assert [(g.name, g.passed) for g in record.gates] == [
        ("divergence int8 (reference) mean KLD", True),
        ("divergence int8 (reference) same top-1", True),
        ("divergence int8 (reference) PPL ratio", True),
        ("divergence_controls_failed", True),
    ]
    metrics = record.metrics
    assert metrics["divergence_controls_run"] == 2 and metrics["divergence_controls_failed"] == 0
    assert 0 < float(metrics["divergence_mean_kld"]) < 0.005  # type: ignore[arg-type]
    assert (metrics["divergence_gate"], metrics["degraded_gate"]) == ("passed", "failed")
    assert (metrics["trap_max_kld"], metrics["trap_verdict"]) == (0.0, "exactly-0")
    table = record.tables["divergence"]
    arms = [(row[0], row[1], row[2], row[-2], row[-1]) for row in table.rows]
    assert arms == [
        ("candidate", "int8", "reads-cache", "passed", "passed"),
        ("degraded", "int4", "reads-cache", "failed", "failed"),
        ("trap", "int8", "skips-cache", "exactly-0", "exactly-0"),
    ]
    block = render_block("kvbench-divergence", {"accuracy": record}, "zh")
    assert "| 行 | 缓存 | 预填充 | 注意力路径 | 位置数 | 平均 KLD ± 标准误 |" in block
    assert "| 预填充陷阱 | int8 | 不读缓存 | torch 参考实现 | 63 | 0 ± 0 |" in block
    assert block.count("| 恰为 0 | 恰为 0 |") == 1
    assert "(assets/accuracy-cpu-divergence_kld.png)" in block


def test_a_control_that_does_not_fail_fails_the_stage(tmp_path: Path) -> None:
    # A gate so loose that the 4-bit cache passes it: the control shows the gate cannot bite.
    record = _record(
        tmp_path, _divergence(tmp_path, max_mean_kld=10.0, min_same_top1=0.0, max_ppl_ratio=10.0)
    )
    assert record.metrics["degraded_gate"] == "passed"
    assert record.metrics["divergence_controls_failed"] == 1
    assert record.status == "failed"
    assert record.reason == "gate divergence_controls_failed: 1 not <= 0"
