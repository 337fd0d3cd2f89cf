"""The build: plan the cells, compile what the cache lacks in parallel, write the manifest."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import multiprocessing
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from adrkit.schema import holds

from .._output import output_problem
from ..cache_dtypes import BUILD, cache_dtype
from ._compile import RESULT_FILE, compile_cell
from ._errors import BuildError
from ._matrix import GATES, Matrix, load_matrix
from ._result import BuildGate, BuildResult
from ._targets import Target, resolve_targets

# Bump when the cache entry or manifest layout changes: old entries are then ignored.
BUILD_FORMAT = 1
# Fields compared against the previous manifest.
DIFF_FIELDS = (
    "status", "vgprs", "agprs", "total_vgprs", "sgprs", "registers", "lds_bytes",
    "scratch_bytes", "vgpr_spills", "sgpr_spills", "spill_bytes", "waves_per_simd",
    "code_object_version",
)  # fmt: skip
# The order cells are handed to workers: slow kernels first, so no core idles at the end.
_SLOW_FIRST = ("prefill", "decode", "attention")


def default_cache_dir() -> Path:
    """``$KVQUANT_BUILD_CACHE``, else ``$XDG_CACHE_HOME/kvquant/build`` (``~/.cache``)."""
    if os.environ.get("KVQUANT_BUILD_CACHE"):
        return Path(os.environ["KVQUANT_BUILD_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kvquant" / "build"


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _sources_digest(provider_module: str) -> str:
    """Hash of every .py file of the provider's top-level package (or of its single file).

    Cheap and import-free, so a warm rebuild can trust its plan without importing Triton.
    """
    top = provider_module.split(".")[0]
    found = importlib.util.find_spec(top)
    if found is None:
        raise BuildError(f"`specs` module {provider_module!r} is not importable")
    if found.submodule_search_locations:
        files = sorted(
            path
            for location in found.submodule_search_locations
            for path in Path(location).rglob("*.py")
        )
    else:
        files = [Path(str(found.origin))]
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _torch_dtypes(point: dict[str, Any]) -> dict[str, Any]:
    import torch

    model = {"fp16": torch.float16, "bf16": torch.bfloat16}[point["model_dtype"]]
    stored = cache_dtype(point["cache_dtype"], BUILD).torch_dtype
    cache = model if stored is None else getattr(torch, stored)
    return {**point, "model_dtype": model, "cache_dtype": cache}


def _load_provider(matrix: Matrix) -> Any:
    module, name = matrix.specs.split(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise BuildError(f"`specs` {matrix.specs!r} in {matrix.source}: {error}") from None


def _plan_cells(
    matrix: Matrix, targets: list[Target], triton_version: str, cache: Path
) -> list[dict[str, Any]]:
    """Every distinct cell (spec x target) the matrix asks for, with its cache key and entry."""
    provider = _load_provider(matrix)
    cells: dict[str, dict[str, Any]] = {}
    for target in targets:
        for point in matrix.points():
            try:
                specs = provider(**_torch_dtypes(point), target=target.spec_target)
            except Exception as error:
                raise BuildError(f"`specs` {matrix.specs} failed at {point}: {error}") from None
            for spec in specs:
                if matrix.kernels and spec.name not in matrix.kernels:
                    continue
                for warps in matrix.num_warps or (spec.num_warps,):
                    for stages in matrix.num_stages or (spec.num_stages,):
                        cell = _cell(spec, target, warps, stages, triton_version, cache)
                        cells.setdefault(cell["cache_key"], cell)["axes"].append(point)
    unknown = set(matrix.kernels) - {cell["kernel"] for cell in cells.values()}
    if unknown:
        raise BuildError(f"`axes.kernels` names {sorted(unknown)}; the provider has no such spec")
    return list(cells.values())


def _cell(
    spec: Any, target: Target, warps: int, stages: int, triton_version: str, cache: Path
) -> dict[str, Any]:
    kernel = spec.kernel
    if not hasattr(kernel, "cache_key"):
        raise BuildError(
            f"kernel {spec.name!r} is not a compiled @triton.jit function "
            f"({type(kernel).__name__}); run the build without TRITON_INTERPRET"
        )
    python_fn = kernel.fn
    specialization = {
        "signature": {k: v for k, v in spec.signature.items() if v != "constexpr"},
        "constexprs": dict(spec.constexprs),
        "num_warps": warps,
        "num_stages": stages,
        "aligned": list(spec.aligned),
    }
    source_hash = hashlib.sha256(kernel.cache_key.encode()).hexdigest()
    key = _digest([BUILD_FORMAT, source_hash, triton_version, target.name, spec.name,
                   python_fn.__qualname__, spec.signature, specialization])  # fmt: skip
    return {
        "kernel": spec.name,
        "specialization": specialization,
        "target": target.name,
        "triton_version": triton_version,
        "source_hash": source_hash,
        "cache_key": key,
        "axes": [],
        "task": {
            "module": python_fn.__module__,
            "qualname": python_fn.__qualname__,
            "file": inspect.getsourcefile(python_fn),
            "signature": dict(spec.signature),
            "constexprs": dict(spec.constexprs),
            "num_warps": warps,
            "num_stages": stages,
            "aligned": list(spec.aligned),
            "target": target.name,
            "entry": str(cache / "cells" / key[:2] / key),
        },
    }


def _compile_missing(tasks: list[dict[str, Any]], jobs: int) -> list[dict[str, Any]]:
    """compile_cell over ``tasks``, in ``jobs`` spawned processes (in this one when jobs == 1)."""
    if jobs == 1 or len(tasks) <= 1:
        return [compile_cell(task) for task in tasks]
    # spawn, not fork: a fresh interpreter per worker, so no lock or thread state of this
    # process (torch, Triton's LLVM) is inherited half-held.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=context) as pool:
        return list(pool.map(compile_cell, tasks, chunksize=1))


def _entry(cell: dict[str, Any], target: Target, out: Path, results: dict[str, Any]) -> Any:
    """The manifest entry of a cell, its artifacts copied into ``out``."""
    result = results[cell["cache_key"]]
    entry = {k: v for k, v in cell.items() if k not in ("task",)}
    if not result["ok"]:
        return {**entry, "status": "failed", "error": result["error"]}
    name = f"{cell['kernel']}.{cell['cache_key'][:12]}"
    artifacts = {}
    for kind in (target.binary, target.listing):
        source = Path(cell["task"]["entry"]) / f"kernel.{kind}"
        relative = Path(target.name) / cell["kernel"] / f"{name}.{kind}"
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, out / relative)
        artifacts[kind] = {"path": relative.as_posix(), "bytes": source.stat().st_size}
    fields = {k: v for k, v in result.items() if k not in ("ok",)}
    return {**entry, "status": "ok", "error": None, **fields, "artifacts": artifacts}


def _gates(matrix: Matrix, entries: list[dict[str, Any]]) -> list[BuildGate]:
    """One verdict per gate: its worst value over the cells that have the field."""
    verdicts = []
    for name, threshold in matrix.gates.items():
        field, op = GATES[name]
        values = [
            (e[field], f"{e['kernel']}.{e['cache_key'][:12]}@{e['target']}")
            for e in entries
            if e.get(field) is not None
        ]
        breaking = [cell for value, cell in values if not holds(value, op, threshold)]
        worst = (max if op == "<=" else min)((v for v, _ in values), default=None)
        verdicts.append(BuildGate(name, field, worst, op, threshold, not breaking, breaking))
    return verdicts


def _identity(entry: dict[str, Any]) -> str:
    return json.dumps([entry["kernel"], entry["specialization"], entry["target"]], sort_keys=True)


def diff_manifests(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """Changes of resource use from manifest ``old`` to ``new``, cell by cell.

    A cell present on one side only is one row with field "cell" and old/new "absent"/"present".
    """
    before = {_identity(e): e for e in old.get("cells", [])}
    after = {_identity(e): e for e in new.get("cells", [])}
    rows = []
    for key in sorted(before.keys() | after.keys()):
        one = after.get(key) or before[key]
        where = {k: one[k] for k in ("kernel", "specialization", "target")}
        if key not in before or key not in after:
            present = ("absent", "present") if key not in before else ("present", "absent")
            rows.append({**where, "field": "cell", "old": present[0], "new": present[1]})
            continue
        for field in DIFF_FIELDS:
            if before[key].get(field) != after[key].get(field):
                rows.append({
                    **where, "field": field,
                    "old": before[key].get(field), "new": after[key].get(field),
                })  # fmt: skip
    return rows


def _manifest_path(previous: Path) -> Path:
    return previous / "manifest.json" if previous.is_dir() else previous


def _json_kind(value: Any) -> str:
    """How a JSON value is named in an error: its JSON type, not its (possibly long) text."""
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return kinds.get(type(value), "null" if value is None else "a number")


def _read_previous(path: Path) -> dict[str, Any]:
    """The manifest to diff against, its shape checked now: before anything compiles."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise BuildError(f"previous manifest {path} is not UTF-8 text") from None
    except (OSError, ValueError) as error:
        raise BuildError(f"previous manifest {path}: {error}") from None
    expected = "expected a kvquant build manifest.json (an object with a `cells` list)"
    if not isinstance(loaded, dict):
        raise BuildError(f"previous manifest {path} is {_json_kind(loaded)}; {expected}")
    cells = loaded.get("cells")
    if not isinstance(cells, list):
        found = " has no `cells`" if cells is None else f": `cells` is {_json_kind(cells)}"
        raise BuildError(f"previous manifest {path}{found}; {expected}")
    for index, cell in enumerate(cells):
        if not _is_manifest_cell(cell):
            raise BuildError(
                f"previous manifest {path}: `cells[{index}]` is not a manifest cell; expected an "
                "object with kernel and target strings and a specialization with constexprs"
            )
    return loaded


def _is_manifest_cell(cell: Any) -> bool:
    """Whether ``cell`` has what the diff and the report read from a cell."""
    if not isinstance(cell, dict):
        return False
    specialization = cell.get("specialization")
    return (
        isinstance(cell.get("kernel"), str)
        and isinstance(cell.get("target"), str)
        and isinstance(specialization, dict)
        and isinstance(specialization.get("constexprs"), dict)
    )


def build(
    targets: list[str] | None = None,
    matrix: Path | None = None,
    *,
    out: Path,
    previous: Path | None = None,
    jobs: int | None = None,
    cache_dir: Path | None = None,
) -> BuildResult:
    """Compile every cell of ``matrix`` (default: the shipped one) for ``targets`` into ``out``.

    Must run in a process where Triton compiles (``TRITON_INTERPRET`` unset or 0), because the
    kernels are imported from here. A failing cell does not stop the others: it appears in
    ``failures`` and in the manifest with the compiler's message. The result's ``diff`` is
    against ``previous`` (a manifest.json or the directory holding one), and ``compared_with``
    that manifest's path, or None. Raises BuildError (or a subclass) when the build cannot run
    at all.
    """
    started = time.perf_counter()
    resolved = resolve_targets(list(targets) if targets is not None else ["gfx90a"])
    parsed = load_matrix(matrix)
    previous_path = _manifest_path(Path(previous)) if previous is not None else None
    old = _read_previous(previous_path) if previous_path is not None else None
    out = Path(out)
    problem = output_problem(out, "`out`", folder=True)
    if problem is not None:
        raise BuildError(problem)
    if jobs is not None and jobs < 1:
        raise BuildError(f"`jobs` is {jobs}; expected an integer >= 1")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise BuildError("TRITON_INTERPRET is set; `kvquant build` needs compiled Triton")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    triton_version = installed_triton()
    sources = _sources_digest(parsed.specs.split(":")[0])
    names = [t.name for t in resolved]
    plan_key = _digest(
        [BUILD_FORMAT, parsed.text, parsed.specs, names, triton_version, sources, str(cache)]
    )
    plan_file = cache / "plans" / f"{plan_key}.json"
    cells = _read_plan(plan_file)
    if cells is None:
        cells = _plan_cells(parsed, resolved, triton_version, cache)
        plan_file.parent.mkdir(parents=True, exist_ok=True)
        plan_file.write_text(json.dumps(cells, default=str))

    results: dict[str, Any] = {}
    for cell in cells:
        stored = Path(cell["task"]["entry"]) / RESULT_FILE
        if stored.is_file():
            results[cell["cache_key"]] = json.loads(stored.read_text())
    cached = len(results)
    missing = sorted(
        (cell for cell in cells if cell["cache_key"] not in results),
        key=lambda c: not any(word in c["kernel"] for word in _SLOW_FIRST),
    )
    by_name = {t.name: t for t in resolved}
    # Checked only when something compiles: finding the backend imports Triton, which a warm
    # rebuild (every cell cached) otherwise never does.
    if (
        any(by_name[cell["target"]].backend == "hip" for cell in missing)
        and importlib.util.find_spec("triton.backends.amd") is None
    ):
        raise BuildError(f"Triton {triton_version} has no AMD backend (triton.backends.amd)")
    try:  # before compiling: a directory that cannot be made must not cost the compile
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BuildError(f"`out` {out}: {error.strerror}") from None
    compiled = _compile_missing([c["task"] for c in missing], jobs or os.cpu_count() or 1)
    results |= {c["cache_key"]: r for c, r in zip(missing, compiled, strict=True)}

    entries = [_entry(cell, by_name[cell["target"]], out, results) for cell in cells]
    manifest = {
        "format": BUILD_FORMAT,
        "triton_version": triton_version,
        "targets": [t.name for t in resolved],
        "matrix": parsed.source,
        "cells": entries,
    }
    gates = _gates(parsed, [e for e in entries if e["status"] == "ok"])
    diff = diff_manifests(old, manifest) if old is not None else []
    manifest |= {"gates": [gate.to_dict() for gate in gates], "diff": diff}
    manifest_path = out / "manifest.json"
    staging = out / "manifest.json.partial"
    staging.write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    staging.replace(manifest_path)
    return BuildResult(
        manifest=str(manifest_path),
        cells=entries,
        gates=gates,
        diff=diff,
        compared_with=str(previous_path) if previous_path is not None else None,
        elapsed_s=round(time.perf_counter() - started, 3),
        cached=cached,
        triton_version=triton_version,
    )


def installed_triton() -> str:
    """The release of the Triton this process imports."""
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        raise BuildError("Triton is not installed") from None


def _read_plan(path: Path) -> list[dict[str, Any]] | None:
    try:
        cells: list[dict[str, Any]] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return cells
