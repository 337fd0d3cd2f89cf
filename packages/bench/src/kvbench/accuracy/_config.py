"""The accuracy config file (TOML): model, comparison, gate and the runs; unknown keys rejected."""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import ConfigError

# Shipped inside the package, so a plain (non-editable) install runs the defaults too. The task
# folder must be a directory on disk: lm-eval's TaskManager walks it and imports kvb_data.py.
DEFAULT_CONFIG = Path(__file__).with_name("cpu_nightly.toml")
TASKS_DIR = Path(__file__).with_name("tasks")

RUN_MODES = ("single-pass", "decode", "generate")
# auto: the model dtype; int8: kvquant per-(token, kv-head); fp8_e4m3: emulated vLLM fp8.
KV_CACHE_DTYPES = ("auto", "int8", "fp8_e4m3")
# The lm-eval model that scores the tasks: kvquant-hf (a HF model over a kvquant cache, every
# mode) or lm-eval's own `vllm` model, whose engine is given the cache dtype.
BACKENDS = ("kvquant-hf", "vllm")
# What vLLM can run: lm-eval's scoring (single-pass, generate) with its cache written before
# attention reads it, prefill included. Decode mode is kvquant-hf's teacher-forced path.
VLLM_RUN_MODES = ("single-pass", "generate")
# The model dtypes `load_model` and vLLM's engine both take; auto: fp32 on the CPU, else bf16.
MODEL_DTYPES = ("auto", "float32", "float16", "bfloat16")
# kvquant-hf places the model with transformers' device_map: the CPU or one CUDA device. vLLM is
# given no device index (its platform picks the GPU), so it takes only cpu or cuda.
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


@dataclass(frozen=True)
class RunSpec:
    """One mode over a list of tasks, each limited to the first ``limit`` documents."""

    mode: str
    tasks: tuple[str, ...]
    limit: int | None


@dataclass(frozen=True)
class AccuracyConfig:
    backend: str
    model: str | None
    device: str
    dtype: str
    max_length: int
    baseline: str
    candidate: str
    prefill_reads_cache: bool
    tolerance: float
    runs: tuple[RunSpec, ...]


def _table(data: dict[str, Any], name: str, keys: set[str]) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"`{name}` is {type(table).__name__}; expected a table")
    unknown = sorted(set(table) - keys)
    if unknown:
        raise ConfigError(
            f"`{name}.{unknown[0]}` is not a known key; expected one of {sorted(keys)}"
        )
    return table


def _typed(table: dict[str, Any], where: str, key: str, kind: type, default: Any) -> Any:
    value = table.get(key, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        msg = f"`{where}.{key}` is {value!r}; expected a {kind.__name__}"
        raise ConfigError(msg)
    return value


def _run(index: int, entry: object) -> RunSpec:
    where = f"runs[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"`{where}` is {type(entry).__name__}; expected a table")
    unknown = sorted(set(entry) - {"mode", "tasks", "limit"})
    if unknown:
        raise ConfigError(f"`{where}.{unknown[0]}` is not a known key; expected mode, tasks, limit")
    mode = _typed(entry, where, "mode", str, "")
    if mode not in RUN_MODES:
        raise ConfigError(f"`{where}.mode` is {mode!r}; expected one of {', '.join(RUN_MODES)}")
    tasks = entry.get("tasks")
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
        raise ConfigError(f"`{where}.tasks` is {tasks!r}; expected a non-empty list of task names")
    limit = entry.get("limit")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ConfigError(f"`{where}.limit` is {limit!r}; expected a positive integer")
    return RunSpec(mode=mode, tasks=tuple(tasks), limit=limit)


def load_config(path: Path | None) -> AccuracyConfig:
    """Read and check ``path`` (None: the embedded CPU nightly config, cpu_nightly.toml)."""
    path = DEFAULT_CONFIG if path is None else path
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"`config` {path} cannot be read: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"`config` {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"`config` {path} is not valid TOML: {error}") from None
    unknown = sorted(set(data) - {"model", "compare", "gate", "runs"})
    if unknown:
        raise ConfigError(
            f"`{unknown[0]}` is not a known table; expected model, compare, gate, runs"
        )
    model = _table(data, "model", {"backend", "path", "device", "dtype", "max_length"})
    compare = _table(data, "compare", {"baseline", "candidate", "prefill_reads_cache"})
    gate = _table(data, "gate", {"tolerance"})
    for key, default in (("baseline", "auto"), ("candidate", "int8")):
        name = _typed(compare, "compare", key, str, default)
        if name not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"`compare.{key}` is {name!r}; expected one of {', '.join(KV_CACHE_DTYPES)}"
            )
    backend = _typed(model, "model", "backend", str, "kvquant-hf")
    if backend not in BACKENDS:
        raise ConfigError(f"`model.backend` is {backend!r}; expected one of {', '.join(BACKENDS)}")
    runs = data.get("runs", [])
    if not isinstance(runs, list) or not runs:
        raise ConfigError("`runs` is missing or empty; expected at least one [[runs]] table")
    device = _typed(model, "model", "device", str, "cpu")
    check_device(device, backend, "model.device")
    dtype = _typed(model, "model", "dtype", str, "auto")
    if dtype not in MODEL_DTYPES:
        raise ConfigError(f"`model.dtype` is {dtype!r}; expected one of {', '.join(MODEL_DTYPES)}")
    max_length = _typed(model, "model", "max_length", int, 2048)
    if max_length < 1:
        raise ConfigError(f"`model.max_length` is {max_length!r}; expected a positive integer")
    tolerance = _typed(gate, "gate", "tolerance", float, 0.02)
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ConfigError(f"`gate.tolerance` is {tolerance!r}; expected a finite number >= 0")
    config = AccuracyConfig(
        backend=backend,
        model=_typed(model, "model", "path", str, "") or None,
        device=device,
        dtype=dtype,
        max_length=max_length,
        baseline=compare.get("baseline", "auto"),
        candidate=compare.get("candidate", "int8"),
        prefill_reads_cache=_typed(compare, "compare", "prefill_reads_cache", bool, True),
        tolerance=tolerance,
        runs=tuple(_run(i, entry) for i, entry in enumerate(runs)),
    )
    if backend == "vllm":
        _check_vllm_can_run(config)
    return config


def check_device(device: str, backend: str, where: str) -> None:
    """Refuse a device ``backend`` cannot run on; ``where`` names the setting in the message."""
    if backend == "vllm" and device not in ("cpu", "cuda"):
        raise ConfigError(f"`{where}` is {device!r}; backend 'vllm' runs on cpu or cuda")
    if not _DEVICE.fullmatch(device):
        raise ConfigError(f"`{where}` is {device!r}; expected cpu, cuda or cuda:N (e.g. cuda:0)")


def _check_vllm_can_run(config: AccuracyConfig) -> None:
    """Refuse what lm-eval's `vllm` model cannot score, before any engine starts."""
    if not config.prefill_reads_cache:
        raise ConfigError(
            "`compare.prefill_reads_cache` is false but backend 'vllm' always attends over the "
            "cache it just wrote; expected true"
        )
    for index, run in enumerate(config.runs):
        if run.mode not in VLLM_RUN_MODES:
            raise ConfigError(
                f"`runs[{index}].mode` is {run.mode!r}, kvquant-hf's teacher-forced path; "
                f"backend 'vllm' runs {' and '.join(VLLM_RUN_MODES)}"
            )
