"""Our INT8 decode and chunked prefill against upstream vLLM's INT8 Triton attention on the same
cache: `benchmarks/benchmark_upstream.py --device cpu`, which runs both kernels in Triton's
interpreter over one small shape (a partial last page; the prefill after a cached prefix) and
prints their relative L2 difference. Skipped without a vLLM that has the INT8 cache."""

from __future__ import annotations

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


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")
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
