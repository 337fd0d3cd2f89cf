"""The accuracy config file (TOML): model, comparison, gate and the runs; unknown keys rejected."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import ConfigError

# Source-tree folders (packages/bench/...); the package is installed editable from it.
PACKAGE_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CONFIG = PACKAGE_ROOT / "configs" / "accuracy.toml"
TASKS_DIR = PACKAGE_ROOT / "tasks"

RUN_MODES = ("single-pass", "decode", "generate")
# auto: the model dtype; int8: kvquant per-(token, kv-head); fp8_e4m3: emulated vLLM fp8.
KV_CACHE_DTYPES = ("auto", "int8", "fp8_e4m3")
# The lm-eval model that scores the tasks: kvquant-hf (a HF model over a kvquant cache, every
# mode) or lm-eval's own `vllm` model, whose engine is given the cache dtype.
BACKENDS = ("kvquant-hf", "vllm")
# What vLLM can run: lm-eval's scoring (single-pass, generate) with its cache written before
# attention reads it, prefill included. Decode mode is kvquant-hf's teacher-forced path.
VLLM_RUN_MODES = ("single-pass", "generate")


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
    """Read and check ``path`` (None: packages/bench/configs/accuracy.toml)."""
    path = DEFAULT_CONFIG if path is None else path
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"`config` {path} cannot be read: {error.strerror}") from None
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
    config = AccuracyConfig(
        backend=backend,
        model=_typed(model, "model", "path", str, "") or None,
        device=_typed(model, "model", "device", str, "cpu"),
        dtype=_typed(model, "model", "dtype", str, "auto"),
        max_length=_typed(model, "model", "max_length", int, 2048),
        baseline=compare.get("baseline", "auto"),
        candidate=compare.get("candidate", "int8"),
        prefill_reads_cache=_typed(compare, "compare", "prefill_reads_cache", bool, True),
        tolerance=_typed(gate, "gate", "tolerance", float, 0.02),
        runs=tuple(_run(i, entry) for i, entry in enumerate(runs)),
    )
    if backend == "vllm":
        _check_vllm_can_run(config)
    return config


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
