"""Start one real vLLM engine on the CPU, generate greedily, and write what the tests compare.

Run as a script by ``test_vllm_engine.py``, one engine per process: each engine then starts from
a clean process (vLLM keeps process-wide state), and its log is captured whole, so the test can
count the plugin's activation line.

Usage: python engine_run.py MODEL_DIR KV_CACHE_DTYPE OUT_JSON [--dtype D] [--prompts N]
       [--max-tokens N] [--num-blocks N]

``--dtype`` defaults to float32; kvquant's Triton kernels need float16 or bfloat16. ``--prompts``,
``--max-tokens`` and ``--num-blocks`` (vLLM's ``num_gpu_blocks_override``) shorten a run in
Triton's interpreter, where one kernel launch takes most of a second.
"""

from __future__ import annotations

import argparse
import json
import os
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


def main(
    model: str,
    kv_cache_dtype: str,
    out_path: str,
    model_dtype: str,
    num_prompts: int,
    max_tokens: int,
    num_blocks: int | None,
) -> None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # The engine core runs in this process: faster to start, and one process to account for.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(
        model=model,
        dtype=model_dtype,
        num_gpu_blocks_override=num_blocks,
        max_model_len=512,
        block_size=BLOCK_SIZE,
        kv_cache_dtype=kv_cache_dtype,
        enforce_eager=True,
        seed=0,
    )
    start_s = time.perf_counter() - started
    num_blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
    started = time.perf_counter()
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=1)
    outputs = llm.generate(PROMPTS[:num_prompts], greedy)
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
        "model_dtype": model_dtype,
        "num_blocks": num_blocks,
        "block_size": BLOCK_SIZE,
        "start_s": start_s,
        "generate_s": generate_s,
        "completions": completions,
    }
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("kv_cache_dtype")
    parser.add_argument("out_path")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--num-blocks", type=int, default=None)
    args = parser.parse_args()
    main(
        args.model,
        args.kv_cache_dtype,
        args.out_path,
        args.dtype,
        args.prompts,
        args.max_tokens,
        args.num_blocks,
    )
