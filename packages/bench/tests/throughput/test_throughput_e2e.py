"""What served an end-to-end cell's INT8 cache, read from the engine log: kvquant's plugin says so
in one line, and a reference path makes the cell a functional check."""

from __future__ import annotations

import pytest

from kvbench.throughput._e2e import served_measurement
from kvquant.vllm_plugin._platforms import activation_line, platform_hooks

# How vLLM prefixes a line its worker logs.
_PREFIX = "(EngineCore_DP0 pid=4242) INFO 12-01 16:05:01 [_platforms.py:201] "


def _engine_log(platform: str) -> str:
    """A log as a cell's engine writes it, with the plugin's own activation line."""
    line = activation_line(platform_hooks("kvquant.vllm_plugin._backend_v0_32")[platform], "0.32.0")
    return f"INFO starting\n{_PREFIX}{line}\nKV cache size: 87,712 tokens\n"


def test_the_fp32_reference_on_the_cpu_is_a_functional_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KVQUANT_VLLM_KERNELS", raising=False)
    assert served_measurement(_engine_log("cpu")) == "functional-check-reference"


def test_the_kernels_in_the_interpreter_are_a_functional_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVQUANT_VLLM_KERNELS", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert served_measurement(_engine_log("cpu")) == "functional-check-interpreter"


def test_the_kernels_on_a_gpu_and_vllms_own_path_are_timed() -> None:
    assert served_measurement(_engine_log("cuda")) == "timed"
    assert served_measurement(_engine_log("rocm")) == "timed"
    # No plugin line: vLLM served the cache itself (auto, or a dtype of its own).
    assert served_measurement("INFO starting\nKV cache size: 23,296 tokens\n") == "timed"
