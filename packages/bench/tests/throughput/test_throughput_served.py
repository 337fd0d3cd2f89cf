"""Served-step cells: their matrix tables, one step of each of our caches through the plugin's
kernel path in Triton's interpreter, and the ratios and summary a decision reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvbench.throughput import run_throughput
from kvbench.throughput._errors import MatrixError
from kvbench.throughput._matrix import ServedStepCell, parse_matrix
from kvbench.throughput._served import CPU_UPSTREAM, add_served_ratios, summarize_served

SERVED_MATRIX = """
name = "served-test"
[kernel_shape]
num_q_heads = 4
num_kv_heads = 2
head_size = 64
block_size = 16
model_dtype = "float16"
[[served_step]]
step = "2x100+1x( 63 + 37 )"
cache_dtype = ["int8", "float16"]
impl = ["kvquant", "vllm"]
layers = 2
"""


def test_a_step_is_read_by_kvquants_spec_and_named_by_it() -> None:
    matrix = parse_matrix(SERVED_MATRIX, "m.toml")
    cells = [c for c in matrix.cells if isinstance(c, ServedStepCell)]
    assert [c.name for c in cells] == [
        f"{impl}served_step {cache} 2x100 + 1x(63+37) layers=2 heads=4/2x64 block=16"
        for cache in ("int8", "float16")
        for impl in ("", "vllm ")
    ]
    assert cells[0].params() == {
        "impl": "kvquant", "step": "2x100 + 1x(63+37)", "heads": "4/2x64",
        "cache_dtype": "int8", "layers": 2,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ("step = '64 x'\ncache_dtype = 'int8'", "`served_step[0].step` step '64 x': expected"),
        ("step = '1x(8+0)'\ncache_dtype = 'int8'", "a prefill with no new token"),
        ("step = '8x64'\ncache_dtype = 'int4'", "`served_step[0].cache_dtype` is 'int4'"),
        ("step = '8x64'\ncache_dtype = 'int8'\nimpl = 'sdpa'", "`served_step[0].impl` is 'sdpa'"),
        (
            "step = '8x64'\ncache_dtype = 'float16'\nimpl = 'vllm'",
            "its 16-bit cache is the model's ('bfloat16')",
        ),
        ("step = '8x64'\ncache_dtype = 'int8'\nlayers = 0", "expected a number > 0"),
        ("cache_dtype = 'int8'", "`served_step[0].step` is missing"),
    ],
)
def test_a_served_step_table_it_cannot_run_is_one_line(table: str, problem: str) -> None:
    with pytest.raises(MatrixError) as error:
        parse_matrix(f"[[served_step]]\n{table}\n", "m.toml")
    assert problem in str(error.value) and "\n" not in str(error.value)


def test_interpreted_steps_run_ours_and_leave_upstream_to_a_gpu(tmp_path: Path) -> None:
    matrix = tmp_path / "served.toml"
    matrix.write_text(SERVED_MATRIX)
    result = run_throughput(matrix, out_dir=tmp_path / "run", progress=False)
    cells = {(c["impl"], c["cache_dtype"]): c for c in result.cells}
    for cache in ("int8", "float16"):
        ours = cells[("kvquant", cache)]
        assert ours["status"] == "ok" and ours["value"] > 0 and ours["plan_ms"] > 0
        assert ours["measurement"] == "functional-check-interpreter" and ours["functional_check"]
        # One step, no graph; a functional check is no speed, so no ratio and no judgement.
        assert ours["graph_ms"] is None and ours["eager_over_graph"] is None
        assert ours["time_vs_upstream_bf16"] is None and ours["judgement"] == "not-judged"
        upstream = cells[("vllm", cache)]
        assert (upstream["status"], upstream["error"]) == ("not-measured", CPU_UPSTREAM)
    assert cells[("kvquant", "int8")]["time_vs_16bit"] is None
    assert result.passed
    assert result.summary["served_int8_time_vs_upstream_bf16_max"] is None
    assert result.summary["served_baseline_vllm_not_measured"] == CPU_UPSTREAM
    table = result.record_parts().tables["served_steps"]
    rows = [dict(zip(table.columns, row, strict=True)) for row in table.rows]
    assert [(r["impl"], r["cache_dtype"], r["verdict"]) for r in rows] == [
        ("kvquant", "int8", "passed"),
        ("vllm", "int8", f"not measured: {CPU_UPSTREAM}"),
        ("kvquant", "float16", "passed"),
        ("vllm", "float16", f"not measured: {CPU_UPSTREAM}"),
    ]
    # The kernel and end-to-end tables hold none of them.
    assert not result.record_parts().tables["kernels"].rows
    assert not result.record_parts().tables["e2e"].rows


def _timed(impl: str, cache: str, step: str, value: float, graph: float) -> dict[str, Any]:
    return {
        "kind": "served_step", "status": "ok", "functional_check": False, "impl": impl,
        "cache_dtype": cache, "step": step, "heads": "32/8x128", "layers": 32, "value": value,
        "eager_over_graph": value / graph, "baseline": "vLLM 0.32.0" if impl == "vllm" else None,
    }  # fmt: skip


def test_ratios_pair_each_step_with_its_own_baselines_and_the_summary_names_the_worst() -> None:
    cells = [
        _timed("kvquant", "int8", "64x4096", 5.0, 4.8),
        _timed("kvquant", "bfloat16", "64x4096", 9.0, 8.9),
        _timed("vllm", "bfloat16", "64x4096", 10.0, 9.9),
        _timed("vllm", "int8", "64x4096", 25.0, 24.0),
        _timed("kvquant", "int8", "4x(0+2048)", 18.0, 15.0),
        _timed("kvquant", "bfloat16", "4x(0+2048)", 20.0, 19.0),
        _timed("vllm", "bfloat16", "4x(0+2048)", 24.0, 23.0),
    ]
    add_served_ratios(cells)
    int8, sixteen = cells[0], cells[1]
    assert int8["time_vs_16bit"] == 5.0 / 9.0
    assert int8["time_vs_upstream_bf16"] == 0.5 and int8["time_vs_upstream_int8"] == 0.2
    # A 16-bit step is compared with upstream's 16-bit step only.
    assert sixteen["time_vs_upstream_bf16"] == 0.9
    assert sixteen["time_vs_16bit"] is None and sixteen["time_vs_upstream_int8"] is None
    assert cells[4]["time_vs_upstream_int8"] is None  # no such baseline timed for this step
    summary = summarize_served(cells)
    assert summary["served_int8_time_vs_upstream_bf16_max"] == 0.75
    assert summary["served_int8_time_vs_upstream_bf16_worst"] == "4x(0+2048)"
    assert summary["served_int8_time_vs_upstream_bf16_min"] == 0.5
    assert summary["served_int8_eager_over_graph_max"] == 18.0 / 15.0
    assert summary["served_int8_eager_over_graph_worst"] == "4x(0+2048)"
    assert summary["served_baseline_vllm"] == "vLLM 0.32.0"
    assert summary["served_baseline_vllm_not_measured"] is None
