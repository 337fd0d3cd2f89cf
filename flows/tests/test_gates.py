"""gates.toml: each stage's gates, judged on the metrics its record holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from adrkit import load_sources, render_block, stale, utc_now
from flows._stage import (
    ADR_DIR,
    GatesFileError,
    RunContext,
    load_gates,
    stage_gates,
    stage_record,
)
from flows.pipeline import STAGES
from flows.throughput import STAGE
from kvbench.throughput import ThroughputResult

# Two real kernel cells through Triton's interpreter: enough for a throughput record.
_KERNEL_MATRIX = """
name = "gates-test"
[kernel_shape]
num_q_heads = 4
num_kv_heads = 2
head_size = 64
block_size = 16
cpu_runs = 1
[[kernel]]
op = "cache_write"
cache_dtype = ["int8", "bfloat16"]
batch = 1
context = 32
"""


# Runs `kvbench` with modules hidden from the import system, as on a machine that never installed
# them: the H200 has no vLLM and none of lm-eval's stack, and SQLAlchemy without greenlet.
_KVBENCH_WITHOUT = """
import sys

class Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {hidden!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, Uninstalled())
from kvbench.__main__ import main
sys.exit(main({argv!r}))
"""


def test_the_shipped_gates_judge_a_real_kernel_only_throughput_record(tmp_path: Path) -> None:
    # The server tests judge audit, kernels and correctness through the pipeline; throughput has
    # no vLLM there, so its gates are checked on a kernel-only run here. In a process of its own:
    # on a CPU it switches Triton to the interpreter, which the kernel build tests must not get.
    matrix = tmp_path / "kernel.toml"
    matrix.write_text(_KERNEL_MATRIX)
    started_at = utc_now()
    result_file = tmp_path / "throughput.json"
    argv = ["throughput", "--matrix", str(matrix), "--out", str(tmp_path / "out")]
    argv += ["--history", f"sqlite:///{tmp_path / 'h.sqlite3'}", "--json", str(result_file)]
    code = _KVBENCH_WITHOUT.format(
        hidden={"vllm", "lm_eval", "datasets", "greenlet"}, argv=[*argv, "--no-progress"]
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = ThroughputResult.from_dict(json.loads(result_file.read_text()))
    record = stage_record(RunContext("run-1", tmp_path), STAGE, started_at, result.record_parts())
    assert [(g.name, g.value, g.op, g.threshold) for g in record.gates] == [
        ("cells_measured", 2.0, ">=", 1.0),
        ("regressions", 0.0, "<=", 0.0),
    ]
    assert record.status == "passed"
    # The record carries the hashes of the sources it measured, which the work tree still has.
    assert any(p.startswith("packages/kvquant/src/kvquant/ops/") for p in record.provenance.sources)
    assert stale(record, load_sources(ADR_DIR)) is None
    # Interpreted kernels: functional checks, in the table and the figures a decision reads.
    kernels = record.tables["kernels"]
    rows = [dict(zip(kernels.columns, row, strict=True)) for row in kernels.rows]
    assert [row["measurement"] for row in rows] == ["functional-check-interpreter"] * 2
    assert [row["judgement"] for row in rows] == ["not-judged"] * 2
    assert rows[0]["cache_dtype"] == "int8" and rows[0]["speedup_vs_16bit"] is None
    # A write reads 32 bf16 tokens of K and V (16 KiB) and stores two pages: 8.5 KiB in INT8,
    # 16 KiB in bf16.
    assert rows[0]["bytes_vs_16bit"] == (16384 + 8704) / (16384 + 16384)
    metrics = record.metrics
    assert (metrics["cells_timed"], metrics["cells_functional_check"]) == (0, 2)
    assert metrics["decode_speedup_vs_16bit_min"] is None
    assert "(0 timed, 2 functional check(s)); no timed cell to judge" in record.summary
    # And ADR 0009's block says so, in the ADR's language.
    block = render_block("kvbench-kernel-throughput", {"throughput": record}, "zh")
    # One row per shape, its INT8 and 16-bit cells side by side.
    assert block.count("功能检查（Triton CPU 解释器），不代表速度") == 1


def _gates_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gates.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_each_gate_is_judged_on_its_metric_and_other_stages_are_untouched(
    tmp_path: Path,
) -> None:
    gates_file = _gates_file(
        tmp_path,
        '[audit]\nrisky = { op = "<=", threshold = 0 }\nfiles = { op = "<", threshold = 10 }\n',
    )
    gates = stage_gates("audit", {"risky": 2, "files": 3, "note": "x"}, gates_file)
    assert [(g.name, g.value, g.passed) for g in gates] == [
        ("risky", 2.0, False),
        ("files", 3.0, True),
    ]
    assert stage_gates("kernels", {"risky": 2}, gates_file) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[audit]\nriksy = { op = "<=", threshold = 0 }\n',
            "[audit] riksy: the stage records no numeric metric 'riksy'",
        ),
        (
            '[audit]\nnote = { op = "==", threshold = 0 }\n',
            "[audit] note: the stage records no numeric metric 'note'",
        ),
        ("[audit]\nrisky = 0\n", "[audit] risky: must be a table { op = ..., threshold = ... }"),
        (
            '[audit]\nrisky = { op = "<=", threshold = 0, warn = 1 }\n',
            "[audit] risky: must be a table { op = ..., threshold = ... }",
        ),
        (
            '[audit]\nrisky = { op = "<=", threshold = "0" }\n',
            "[audit] risky: threshold '0' is not a number",
        ),
        ('[audit]\nrisky = { op = "=<", threshold = 0 }\n', "[audit] risky: op '=<'"),
        ('[audit]\nrisky = { op = "<=", threshold = nan }\n', "threshold nan is not finite"),
        ("audit = 3\n", "audit must be a table [audit] of gates"),
        ("[audit\n", "Expected ']'"),
    ],
)
def test_a_bad_gates_file_is_one_line_naming_the_file(
    tmp_path: Path, text: str, message: str
) -> None:
    gates_file = _gates_file(tmp_path, text)
    with pytest.raises(GatesFileError) as raised:
        stage_gates("audit", {"risky": 1, "note": "x"}, gates_file)
    assert str(raised.value).startswith(f"{gates_file}: ")
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_shipped_gates_file_names_only_the_pipeline_stages(tmp_path: Path) -> None:
    assert set(load_gates(known_stages=list(STAGES))) <= set(STAGES)
    misspelt = _gates_file(tmp_path, '[audti]\nrisky = { op = "<=", threshold = 0 }\n')
    with pytest.raises(GatesFileError) as raised:
        load_gates(misspelt, known_stages=list(STAGES))
    assert str(raised.value) == (
        f"{misspelt}: [audti] is not a stage; expected one of {', '.join(STAGES)}"
    )
