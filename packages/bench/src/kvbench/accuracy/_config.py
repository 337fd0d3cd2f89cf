"""The accuracy config file (TOML): model, comparison, gate and the runs; unknown keys rejected."""

from __future__ import annotations

import itertools
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvquant.cache_dtypes import (
    ACCURACY,
    CONTROL,
    UnknownCacheDTypeError,
    cache_dtype,
    cache_dtype_names,
)

from ._errors import ConfigError

# Shipped inside the package, so a plain (non-editable) install runs the defaults too. The task
# folder must be a directory on disk: lm-eval's TaskManager walks it and imports kvb_data.py.
DEFAULT_CONFIG = Path(__file__).with_name("cpu_nightly.toml")
TASKS_DIR = Path(__file__).with_name("tasks")

# Task modes score lm-eval tasks; "divergence" compares the caches' next-token distributions on
# running text (no lm-eval), see `DivergenceSpec`.
TASK_MODES = ("single-pass", "decode", "generate")
DIVERGENCE_MODE = "divergence"
RUN_MODES = (*TASK_MODES, DIVERGENCE_MODE)
# The caches an accuracy run compares (`kvquant.cache_dtypes`, path "accuracy").
KV_CACHE_DTYPES = cache_dtype_names(ACCURACY)
# The divergence runs' degraded control: an emulated 4-bit per-(token, kv-head) cache.
DEGRADED_KV_CACHE_DTYPE = "int4"
# The divergence controls' caches (`kvquant.cache_dtypes`, path "control"): INT8's scheme (one
# scale per token and kv head) with codes of fewer bits, "int<bits>", never caches to ship.
# Stored as INT8 codes, so kvquant's INT8 kernels read them.
CONTROL_CACHE_BITS = {name: int(name.removeprefix("int")) for name in cache_dtype_names(CONTROL)}
# Which kvquant kernel reads the cache at a divergence run's scored positions: "prefill" scores
# chunks in one forward each; "decode" prefills the start of each text and scores every
# position of its windows as one decode step of a batch of texts.
DIVERGENCE_KERNELS = ("prefill", "decode")
# How the attention reads a paged cache: kvquant's Triton kernels (a GPU) or its torch reference.
ATTENTION_PATHS = ("kernels", "reference")
# Offline running text for the divergence runs (kvbench.accuracy._corpus).
CORPORA = ("coqa-stories", "lambada-passages", "qasper-papers")
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
class DivergenceSpec:
    """Next-token distributions of the candidate cache against the baseline's on running text.

    Attributes:
        index: the run's place in the config's ``runs``, for messages.
        corpus: one of `CORPORA`, its documents concatenated and cut into chunks.
        tokens: tokens fed per cache, a multiple of ``chunk_length``; a chunk of L tokens gives
            L - 1 next-token predictions, each scored.
        control_tokens: the tokens of the first chunks that the two controls (degraded cache,
            prefill trap) also score; 0 runs no control.
        attention: the paths that read the paged caches, each scoring every chunk; None: the
            kernels on a GPU, the reference on the CPU (`check_attention`).
        attention_name: the setting ``attention`` came from, for messages.
        kernel: one of `DIVERGENCE_KERNELS`. The fields below are the decode kernel's (a
            prefill run leaves them empty); ``tokens``, ``chunk_length`` and ``control_tokens``
            are the prefill kernel's (a decode run leaves them 0).
        texts: texts decoded together, one batch, each ``text_length`` tokens.
        windows: ``(first, end)`` position ranges scored, in order: every position p with
            ``first <= p < end`` is one decode step that reads p + 1 keys and predicts token
            p + 1. The tokens before a window that no window scores are prefilled.
        control_windows: the windows the controls score (the candidate scores ``windows``).
        buckets: the context lengths (keys read) that end each row's bucket, ascending.
        near_gate: a control cache (`CONTROL_CACHE_BITS`) reported beside the gate, not gated;
            None for none.
    """

    index: int
    corpus: str
    tokens: int
    chunk_length: int
    control_tokens: int
    attention: tuple[str, ...] | None
    attention_name: str
    kernel: str = "prefill"
    texts: int = 0
    text_length: int = 0
    windows: tuple[tuple[int, int], ...] = ()
    control_windows: tuple[tuple[int, int], ...] = ()
    buckets: tuple[int, ...] = ()
    near_gate: str | None = None


@dataclass(frozen=True)
class DivergenceGate:
    """The divergence gate (each candidate row must meet all three) and the paths' agreement."""

    max_mean_kld: float
    min_same_top1: float
    max_ppl_ratio: float
    # Two attention paths agree when their INT8 mean KLDs differ by at most this fraction (or
    # by three standard errors of the paired per-token difference, if that is larger).
    path_agreement: float


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
    divergence: tuple[DivergenceSpec, ...] = ()
    divergence_gate: DivergenceGate | None = None


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


def _run_mode(index: int, entry: object) -> str:
    where = f"runs[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"`{where}` is {type(entry).__name__}; expected a table")
    mode: str = _typed(entry, where, "mode", str, "")
    if mode not in RUN_MODES:
        raise ConfigError(f"`{where}.mode` is {mode!r}; expected one of {', '.join(RUN_MODES)}")
    return mode


def _task_run(index: int, entry: dict[str, Any]) -> RunSpec:
    where = f"runs[{index}]"
    mode = entry["mode"]
    unknown = sorted(set(entry) - {"mode", "tasks", "limit"})
    if unknown:
        raise ConfigError(f"`{where}.{unknown[0]}` is not a known key; expected mode, tasks, limit")
    tasks = entry.get("tasks")
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
        raise ConfigError(f"`{where}.tasks` is {tasks!r}; expected a non-empty list of task names")
    limit = entry.get("limit")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ConfigError(f"`{where}.limit` is {limit!r}; expected a positive integer")
    return RunSpec(mode=mode, tasks=tuple(tasks), limit=limit)


_DIVERGENCE_KEYS = ("mode", "corpus", "tokens", "chunk_length", "control_tokens", "attention")
_DECODE_KEYS = (
    "mode",
    "kernel",
    "corpus",
    "texts",
    "text_length",
    "windows",
    "control_windows",
    "buckets",
    "near_gate",
    "attention",
)
# The overrides that apply to a decode run; the others size prefill chunks.
_DECODE_OVERRIDES = ("corpus", "attention")
# What `kvbench divergence` may override in every divergence run, and its option for each.
DIVERGENCE_OPTIONS = {
    "corpus": "--corpus",
    "tokens": "--tokens",
    "chunk_length": "--chunk-length",
    "control_tokens": "--control-tokens",
    "attention": "--attention",
}


def _divergence_run(
    index: int, entry: dict[str, Any], max_length: int, overrides: dict[str, Any]
) -> DivergenceSpec:
    """Check one divergence run; a value from ``overrides`` is named by its command-line option."""
    kernel = entry.get("kernel", "prefill")
    if kernel not in DIVERGENCE_KERNELS:
        raise ConfigError(
            f"`runs[{index}].kernel` is {kernel!r}; expected one of {', '.join(DIVERGENCE_KERNELS)}"
        )
    if kernel == "decode":
        return _decode_run(index, entry, max_length, overrides)
    keys = (*_DIVERGENCE_KEYS, "kernel")
    unknown = sorted(set(entry) - set(keys))
    if unknown:
        raise ConfigError(
            f"`runs[{index}].{unknown[0]}` is not a known key of a prefill divergence run; "
            f"expected one of {', '.join(keys)}"
        )
    entry = {**entry, **overrides}

    def name(key: str) -> str:
        return DIVERGENCE_OPTIONS[key] if key in overrides else f"runs[{index}].{key}"

    def integer(key: str, default: int, minimum: int) -> int:
        value = entry.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(f"`{name(key)}` is {value!r}; expected an integer >= {minimum}")
        return value

    corpus = entry.get("corpus")
    if corpus not in CORPORA:
        raise ConfigError(f"`{name('corpus')}` is {corpus!r}; expected one of {', '.join(CORPORA)}")
    chunk_length = integer("chunk_length", 512, 2)
    if chunk_length > max_length:
        raise ConfigError(
            f"`{name('chunk_length')}` is {chunk_length}; expected at most `model.max_length` "
            f"({max_length})"
        )
    tokens = integer("tokens", 0, chunk_length)
    control_tokens = integer("control_tokens", 0, 0)
    for key, value in (("tokens", tokens), ("control_tokens", control_tokens)):
        if value % chunk_length:
            raise ConfigError(
                f"`{name(key)}` is {value}; expected a multiple of chunk_length ({chunk_length})"
            )
    if control_tokens > tokens:
        raise ConfigError(
            f"`{name('control_tokens')}` is {control_tokens}; expected at most tokens ({tokens})"
        )
    attention = entry.get("attention")
    if attention is not None:
        paths = attention if isinstance(attention, list) else None
        if (
            not paths
            or not all(isinstance(p, str) and p in ATTENTION_PATHS for p in paths)
            or len(set(paths)) != len(paths)
        ):
            raise ConfigError(
                f"`{name('attention')}` is {attention!r}; expected a list of distinct paths from "
                f"{', '.join(ATTENTION_PATHS)}"
            )
        attention = tuple(paths)
    return DivergenceSpec(
        index, str(corpus), tokens, chunk_length, control_tokens, attention, name("attention")
    )


def _windows(where: str, value: object, text_length: int) -> tuple[tuple[int, int], ...]:
    """Ascending, disjoint ``[first, end)`` ranges with ``0 <= first < end < text_length``."""
    expected = (
        f"expected a list of [first, end] position ranges, ascending and disjoint, with "
        f"0 <= first < end <= text_length - 1 ({text_length - 1})"
    )
    if not isinstance(value, list) or not value:
        raise ConfigError(f"`{where}` is {value!r}; {expected}")
    windows: list[tuple[int, int]] = []
    for pair in value:
        ok = (
            isinstance(pair, list)
            and len(pair) == 2
            and all(isinstance(p, int) and not isinstance(p, bool) for p in pair)
        )
        if not ok or not 0 <= pair[0] < pair[1] <= text_length - 1:
            raise ConfigError(f"`{where}` holds {pair!r}; {expected}")
        if windows and pair[0] < windows[-1][1]:
            raise ConfigError(f"`{where}` holds {pair!r} after {list(windows[-1])}; {expected}")
        windows.append((pair[0], pair[1]))
    return tuple(windows)


def _decode_run(
    index: int, entry: dict[str, Any], max_length: int, overrides: dict[str, Any]
) -> DivergenceSpec:
    """Check one decode-kernel divergence run (see `DivergenceSpec`)."""
    unknown = sorted(set(entry) - set(_DECODE_KEYS))
    if unknown:
        raise ConfigError(
            f"`runs[{index}].{unknown[0]}` is not a known key of a decode divergence run; "
            f"expected one of {', '.join(_DECODE_KEYS)}"
        )
    applied = {k: v for k, v in overrides.items() if k in _DECODE_OVERRIDES}
    entry = {**entry, **applied}
    where = f"runs[{index}]"

    def name(key: str) -> str:
        return DIVERGENCE_OPTIONS[key] if key in applied else f"{where}.{key}"

    def integer(key: str, minimum: int) -> int:
        value = entry.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(f"`{where}.{key}` is {value!r}; expected an integer >= {minimum}")
        return value

    corpus = entry.get("corpus")
    if corpus not in CORPORA:
        raise ConfigError(f"`{name('corpus')}` is {corpus!r}; expected one of {', '.join(CORPORA)}")
    texts = integer("texts", 1)
    text_length = integer("text_length", 3)
    if text_length > max_length:
        raise ConfigError(
            f"`{where}.text_length` is {text_length}; expected at most `model.max_length` "
            f"({max_length})"
        )
    windows = _windows(f"{where}.windows", entry.get("windows"), text_length)
    control_windows = windows
    if "control_windows" in entry:
        control_windows = _windows(
            f"{where}.control_windows", entry["control_windows"], text_length
        )
    buckets = entry.get("buckets")
    longest = max(windows[-1][1], control_windows[-1][1])  # keys read at the last position
    if (
        not isinstance(buckets, list)
        or not buckets
        or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in buckets)
        or any(a >= b for a, b in itertools.pairwise(buckets))
        or buckets[-1] < longest
    ):
        raise ConfigError(
            f"`{where}.buckets` is {buckets!r}; expected ascending context lengths, the last "
            f">= {longest} (the longest context a window reads)"
        )
    near_gate = entry.get("near_gate")
    if near_gate is not None and (
        near_gate not in CONTROL_CACHE_BITS or near_gate == DEGRADED_KV_CACHE_DTYPE
    ):
        controls = [k for k in CONTROL_CACHE_BITS if k != DEGRADED_KV_CACHE_DTYPE]
        raise ConfigError(
            f"`{where}.near_gate` is {near_gate!r}; expected one of {', '.join(controls)}"
        )
    attention = entry.get("attention")
    if attention is not None:
        paths = attention if isinstance(attention, list) else None
        if (
            not paths
            or not all(isinstance(p, str) and p in ATTENTION_PATHS for p in paths)
            or len(set(paths)) != len(paths)
        ):
            raise ConfigError(
                f"`{name('attention')}` is {attention!r}; expected a list of distinct paths from "
                f"{', '.join(ATTENTION_PATHS)}"
            )
        attention = tuple(paths)
    return DivergenceSpec(
        index,
        str(corpus),
        tokens=0,
        chunk_length=0,
        control_tokens=0,
        attention=attention,
        attention_name=name("attention"),
        kernel="decode",
        texts=texts,
        text_length=text_length,
        windows=windows,
        control_windows=control_windows,
        buckets=tuple(buckets),
        near_gate=near_gate,
    )


def check_attention(spec: DivergenceSpec, device: str, device_name: str) -> tuple[str, ...]:
    """The paths ``spec`` runs on ``device``; kernels are refused where there is no CUDA device.

    ``device_name`` is the setting the device came from, for the message.
    """
    if spec.attention is None:
        return ("reference",) if device == "cpu" else ("kernels",)
    if "kernels" in spec.attention and device == "cpu":
        raise ConfigError(
            f"`{spec.attention_name}` holds 'kernels' but `{device_name}` is 'cpu'; kvquant's "
            "kernels need a CUDA device, expected ['reference'] on the CPU"
        )
    return spec.attention


_DIVERGENCE_GATE_KEYS = ("max_mean_kld", "min_same_top1", "max_ppl_ratio", "path_agreement")


def _divergence_gate(gate: dict[str, Any]) -> DivergenceGate:
    values = []
    for key in _DIVERGENCE_GATE_KEYS:
        if key not in gate:
            raise ConfigError(f"`gate.{key}` is missing; a divergence run is judged by it")
        value = _typed(gate, "gate", key, float, None)
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"`gate.{key}` is {value!r}; expected a finite number >= 0")
        values.append(value)
    if values[1] > 1:
        raise ConfigError(f"`gate.min_same_top1` is {values[1]!r}; expected a share in [0, 1]")
    return DivergenceGate(*values)


def load_config(
    path: Path | None, divergence_overrides: dict[str, Any] | None = None
) -> AccuracyConfig:
    """Read and check ``path`` (None: the embedded CPU nightly config, cpu_nightly.toml).

    ``divergence_overrides`` replaces keys (`DIVERGENCE_OPTIONS`) of every divergence run and
    is checked as the run's own values are.
    """
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
    gate = _table(data, "gate", {"tolerance", *_DIVERGENCE_GATE_KEYS})
    for key, default in (("baseline", "auto"), ("candidate", "int8")):
        name = _typed(compare, "compare", key, str, default)
        try:
            cache_dtype(name, ACCURACY)
        except UnknownCacheDTypeError as error:
            raise ConfigError(f"`compare.{key}`: {error}") from None
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
    modes = [_run_mode(i, entry) for i, entry in enumerate(runs)]
    divergence = tuple(
        _divergence_run(i, entry, max_length, divergence_overrides or {})
        for i, (entry, mode) in enumerate(zip(runs, modes, strict=True))
        if mode == DIVERGENCE_MODE
    )
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
        runs=tuple(
            _task_run(i, entry)
            for i, (entry, mode) in enumerate(zip(runs, modes, strict=True))
            if mode != DIVERGENCE_MODE
        ),
        divergence=divergence,
        divergence_gate=_divergence_gate(gate) if divergence else None,
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
    if config.divergence:
        raise ConfigError(
            "`runs` holds a divergence run but backend 'vllm' returns no logits to compare; "
            "expected kvquant-hf for divergence runs"
        )
    if not config.prefill_reads_cache:
        raise ConfigError(
            "`compare.prefill_reads_cache` is false but backend 'vllm' always attends over the "
            "cache it just wrote; expected true"
        )
    for index, run in enumerate(config.runs):  # task runs only, past the check above
        if run.mode not in VLLM_RUN_MODES:
            raise ConfigError(
                f"`runs[{index}].mode` is {run.mode!r}, kvquant-hf's teacher-forced path; "
                f"backend 'vllm' runs {' and '.join(VLLM_RUN_MODES)}"
            )
