"""What an end-to-end cell's engine log says: what served its INT8 cache (kvquant's plugin says so
in one line, and a reference path makes the cell a functional check), the vLLM release that ran
and the KV capacity it logged, in 0.32's one line or 0.18.1's two."""

from __future__ import annotations

import pytest

from kvbench.throughput._e2e import engine_capacity, engine_version, served_measurement
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


# vLLM 0.18.1's lines as a cell's engine logged them: its release, then its capacity in two lines.
_V0_18_LOG = """\
(EngineCore pid=28698) INFO 12-07 02:17:41 [core.py:103] Initializing a V1 LLM engine (v0.18.1) \
with config: model='SmolLM2-135M-Instruct', speculative_config=None
(EngineCore pid=28698) INFO 12-07 02:17:47 [kv_cache_utils.py:1316] GPU KV cache size: 46,592 tokens
(EngineCore pid=28698) INFO 12-07 02:17:47 [kv_cache_utils.py:1321] Maximum concurrency for 512 \
tokens per request: 91.00x
"""


def test_the_release_and_capacity_come_from_either_releases_log() -> None:
    assert engine_version(_V0_18_LOG) == "0.18.1"
    assert engine_capacity(_V0_18_LOG) == {"max_tokens": 46592, "max_seqs": 91, "seq_len": 512}
    one_line = (
        "INFO Initializing a V1 LLM engine (v0.32.0) with config: model='m'\n"
        "INFO CPU KV cache size: 23,296 tokens, Maximum concurrency for 512 tokens per request: "
        "45.50x\n"
    )
    assert engine_version(one_line) == "0.32.0"
    assert engine_capacity(one_line) == {"max_tokens": 23296, "max_seqs": 45, "seq_len": 512}
    # An engine that never started names neither.
    assert engine_version("ValueError: no model") is None
    assert engine_capacity("GPU KV cache size: 46,592 tokens\n") is None
