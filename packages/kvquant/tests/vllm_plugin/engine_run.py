"""Start one real vLLM engine on the CPU, generate greedily, and write what the tests compare.

Run as a script by ``test_vllm_engine.py``, one engine per process: each engine then starts from
a clean process (vLLM keeps process-wide state), and its log is captured whole, so the test can
count the plugin's activation line.

Usage: python engine_run.py MODEL_DIR KV_CACHE_DTYPE OUT_JSON
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "The largest planet in the solar system is",
    "Water boils at a temperature of",
    "Here is a list of fruits: apple, banana,",
]
MAX_TOKENS = 32
BLOCK_SIZE = 32


def main(model: str, kv_cache_dtype: str, out_path: str) -> None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # The engine core runs in this process: faster to start, and one process to account for.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(
        model=model,
        dtype="float32",
        max_model_len=512,
        block_size=BLOCK_SIZE,
        kv_cache_dtype=kv_cache_dtype,
        enforce_eager=True,
        seed=0,
    )
    start_s = time.perf_counter() - started
    num_blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
    started = time.perf_counter()
    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=1)
    outputs = llm.generate(PROMPTS, greedy)
    generate_s = time.perf_counter() - started
    completions = []
    for output in outputs:
        sample = output.outputs[0]
        token_ids = list(sample.token_ids)
        steps = zip(sample.logprobs, token_ids, strict=True)
        logprobs = [step[token].logprob for step, token in steps]
        completions.append({"text": sample.text, "token_ids": token_ids, "logprobs": logprobs})
    result = {
        "kv_cache_dtype": kv_cache_dtype,
        "num_blocks": num_blocks,
        "block_size": BLOCK_SIZE,
        "start_s": start_s,
        "generate_s": generate_s,
        "completions": completions,
    }
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:4])
