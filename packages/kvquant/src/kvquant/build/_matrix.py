"""The build matrix: a TOML file of specialization axes, the spec provider and the gates."""

from __future__ import annotations

import itertools
import re
import tomllib
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from ..cache_dtypes import BUILD, cache_dtype_names
from ._errors import MatrixFileError

DEFAULT_MATRIX = "default_matrix.toml"
MODEL_DTYPES = ("fp16", "bf16")
# "auto": the 16-bit cache, in the model dtype (`kvquant.cache_dtypes`).
CACHE_DTYPES = cache_dtype_names(BUILD)
_INT_AXES = ("head_size", "block_size", "gqa")
_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")
_OPTIONAL_AXES = ("kernels", "num_warps", "num_stages")
# Gate name -> (manifest field, operator). A cell without the field (e.g. no occupancy on
# sm90) is not gated by it.
GATES = {
    "max_vgpr_spills": ("vgpr_spills", "<="),
    "max_sgpr_spills": ("sgpr_spills", "<="),
    "max_spill_bytes": ("spill_bytes", "<="),
    "max_scratch_bytes": ("scratch_bytes", "<="),
    "max_lds_bytes": ("lds_bytes", "<="),
    "min_waves_per_simd": ("waves_per_simd", ">="),
}


@dataclass(frozen=True)
class Matrix:
    """A parsed matrix file. ``text`` is kept: it is part of the build plan's cache key."""

    source: str
    text: str
    specs: str  # "module:function" returning list[KernelSpec]
    head_size: tuple[int, ...]
    block_size: tuple[int, ...]
    gqa: tuple[int, ...]
    model_dtype: tuple[str, ...]
    cache_dtype: tuple[str, ...]
    kernels: tuple[str, ...]  # empty: every kernel the provider returns
    num_warps: tuple[int, ...]  # empty: each spec's own
    num_stages: tuple[int, ...]
    gates: dict[str, int]
    # The Triton release the gfx90a target runs, and where that is stated; the shipped default
    # matrix declares it, and another matrix inherits it unless it declares its own `[triton]`.
    target_triton: str | None = None
    target_triton_source: str | None = None

    def points(self) -> list[dict[str, Any]]:
        """Every combination of the axes, as keyword arguments of ``aot_specs`` (dtype names)."""
        axes = (self.head_size, self.block_size, self.gqa, self.model_dtype, self.cache_dtype)
        names = ("head_size", "block_size", "gqa", "model_dtype", "cache_dtype")
        return [dict(zip(names, values, strict=True)) for values in itertools.product(*axes)]


def _fail(source: str, message: str) -> MatrixFileError:
    return MatrixFileError(f"{source}: {message}")


def _int_list(source: str, axes: dict[str, Any], key: str, *, required: bool) -> tuple[int, ...]:
    values = axes.get(key, None if required else [])
    if (
        not isinstance(values, list)
        or (required and not values)
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)
    ):
        raise _fail(source, f"`axes.{key}` is {values!r}; expected a list of positive integers")
    return tuple(values)


def _name_list(
    source: str, axes: dict[str, Any], key: str, allowed: tuple[str, ...] | None
) -> tuple[str, ...]:
    values = axes.get(key, [] if allowed is None else None)
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise _fail(source, f"`axes.{key}` is {values!r}; expected a list of strings")
    if allowed is not None and (not values or not set(values) <= set(allowed)):
        raise _fail(source, f"`axes.{key}` is {values!r}; expected values from {list(allowed)}")
    return tuple(values)


def parse_matrix(text: str, source: str) -> Matrix:
    """Validate a matrix file's text; MatrixFileError names the key, the value and the expected."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise _fail(source, f"not valid TOML: {error}") from None
    unknown = set(data) - {"specs", "axes", "gates", "triton"}
    if unknown:
        raise _fail(source, f"unknown keys {sorted(unknown)}; expected specs, axes, gates, triton")
    specs = data.get("specs", "kvquant.ops:aot_specs")
    if not isinstance(specs, str) or specs.count(":") != 1:
        raise _fail(source, f"`specs` is {specs!r}; expected 'module:function'")
    axes = data.get("axes")
    if not isinstance(axes, dict):
        raise _fail(source, "missing table `[axes]`")
    known_axes = {*_INT_AXES, "model_dtype", "cache_dtype", *_OPTIONAL_AXES}
    if set(axes) - known_axes:
        raise _fail(
            source, f"unknown keys {sorted(set(axes) - known_axes)} in `[axes]`; "
            f"expected {sorted(known_axes)}"
        )  # fmt: skip
    gates = data.get("gates", {})
    if not isinstance(gates, dict) or set(gates) - set(GATES):
        raise _fail(source, f"`[gates]` is {gates!r}; expected keys from {sorted(GATES)}")
    for name, threshold in gates.items():
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
            raise _fail(source, f"`gates.{name}` is {threshold!r}; expected an integer >= 0")
    triton = data.get("triton")
    if triton is not None and (
        not isinstance(triton, dict)
        or set(triton) != {"target", "source"}
        or not all(isinstance(v, str) and v for v in triton.values())
        or not _VERSION.fullmatch(triton["target"])
    ):
        raise _fail(
            source,
            f'`[triton]` is {triton!r}; expected a release `target` (e.g. "3.6.0") and the '
            "`source` that states it",
        )
    return Matrix(
        source=source,
        text=text,
        specs=specs,
        head_size=_int_list(source, axes, "head_size", required=True),
        block_size=_int_list(source, axes, "block_size", required=True),
        gqa=_int_list(source, axes, "gqa", required=True),
        model_dtype=_name_list(source, axes, "model_dtype", MODEL_DTYPES),
        cache_dtype=_name_list(source, axes, "cache_dtype", CACHE_DTYPES),
        kernels=_name_list(source, axes, "kernels", None),
        num_warps=_int_list(source, axes, "num_warps", required=False),
        num_stages=_int_list(source, axes, "num_stages", required=False),
        gates=dict(gates),
        target_triton=triton["target"] if triton else None,
        target_triton_source=triton["source"] if triton else None,
    )


def _default_matrix() -> Matrix:
    resource = resources.files("kvquant.build").joinpath(DEFAULT_MATRIX)
    return parse_matrix(resource.read_text(encoding="utf-8"), f"kvquant/build/{DEFAULT_MATRIX}")


def load_matrix(path: Path | None) -> Matrix:
    """The matrix at ``path``, or the default one shipped with kvquant. A matrix without a
    `[triton]` table takes the default matrix's target Triton."""
    if path is None:
        return _default_matrix()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise MatrixFileError(f"matrix file {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise MatrixFileError(f"matrix file {path} is not UTF-8 text") from None
    parsed = parse_matrix(text, str(path))
    if parsed.target_triton is not None:
        return parsed
    default = _default_matrix()
    return replace(
        parsed,
        target_triton=default.target_triton,
        target_triton_source=default.target_triton_source,
    )
