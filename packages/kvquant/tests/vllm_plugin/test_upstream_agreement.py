"""Our INT8 decode and chunked prefill against upstream vLLM's INT8 Triton attention on the same
cache: `benchmarks/benchmark_upstream.py --device cpu`, which runs both kernels in Triton's
interpreter over one small shape (a partial last page; the prefill after a cached prefix) and
prints their relative L2 difference. Skipped without a vLLM that has the INT8 cache: none
installed, or 0.18.1, which predates upstream's INT8 cache (it came with 0.32)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Both kernels attend over the same dequantized values; upstream rounds P to the model dtype,
# ours splits it (decode) or rounds it to fp16 (prefill): they agree far inside this.
AGREEMENT = 2e-3


def _upstream_int8_cache() -> bool:
    """Whether the installed vLLM has upstream's INT8 KV cache (its KVQuantMode)."""
    if importlib.util.find_spec("vllm") is None:
        return False
    return hasattr(importlib.import_module("vllm.v1.kv_cache_interface"), "KVQuantMode")


@pytest.mark.skipif(
    not _upstream_int8_cache(), reason="needs a vLLM with upstream's INT8 KV cache (0.32 or newer)"
)
@pytest.mark.parametrize("mode", [[], ["--prefill"]], ids=["decode", "prefill"])
def test_our_int8_kernels_agree_with_upstream_vllms(mode: list[str]) -> None:
    env = os.environ | {"TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "benchmark_upstream.py"), "--device", "cpu", *mode],
        cwd=BENCHMARKS,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    found = re.search(r"rel diff (\S+)", run.stdout)
    assert found, run.stdout
    assert float(found.group(1)) < AGREEMENT, run.stdout
