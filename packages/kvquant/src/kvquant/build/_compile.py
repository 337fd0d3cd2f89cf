"""Compile one cell into a cache entry; runs in worker processes (picklable task in, dict out)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from .._occupancy import cdna2_waves_per_simd
from ._elf import verify_cubin, verify_hsaco
from ._resources import amdgcn_resources
from ._targets import TARGETS, Target

RESULT_FILE = "result.json"
_MAX_ERROR_CHARS = 4000


def find_kernel(module: str, qualname: str, file: str | None) -> Any:
    """The @triton.jit object ``qualname`` of ``module``; by ``file`` when not importable."""
    try:
        namespace: Any = importlib.import_module(module)
    except ImportError:
        if file is None:
            raise
        spec = importlib.util.spec_from_file_location(f"_kvquant_build_{module}", file)
        if spec is None or spec.loader is None:
            raise
        namespace = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = namespace
        spec.loader.exec_module(namespace)
    for part in qualname.split("."):
        namespace = getattr(namespace, part)
    return namespace


def _compile(task: dict[str, Any], target: Target) -> Any:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = find_kernel(task["module"], task["qualname"], task["file"])
    # The JIT marks 16-divisible pointers and strides; so must an ahead-of-time build, or the
    # kernels it describes are not the ones that run (single-element loads instead of 16-byte).
    aligned = set(task.get("aligned", ()))
    attrs = {
        (index,): [["tt.divisibility", 16]]
        for index, name in enumerate(task["signature"])
        if name in aligned
    }
    source = ASTSource(
        fn=kernel, signature=task["signature"], constexprs=task["constexprs"], attrs=attrs
    )
    options = {"num_warps": task["num_warps"], "num_stages": task["num_stages"]}
    with warnings.catch_warnings():
        # Triton 3.9 warns once per process that FP fusion defaults to on; the runtime launch
        # compiles with the same default, so the build keeps it and silences the notice.
        warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
        return triton.compile(
            source,
            target=GPUTarget(target.backend, target.arch, target.warp_size),
            options=options,
        )


def _resources(task: dict[str, Any], target: Target, compiled: Any) -> dict[str, Any]:
    """Verify the binary and read its resource use; ArtifactError when a check fails."""
    binary: bytes = compiled.asm[target.binary]
    symbol = compiled.metadata.name
    lds = int(compiled.metadata.shared)
    if target.backend == "hip":
        checked = verify_hsaco(binary, arch=str(target.arch), kernel=symbol)
        found: dict[str, Any] = amdgcn_resources(
            compiled.asm[target.listing], checked["kernel_metadata"]
        )
        found["waves_per_simd"] = cdna2_waves_per_simd(
            vgprs=found["vgprs"],
            agprs=found["agprs"],
            sgprs=found["sgprs"],
            lds_bytes=lds,
            num_warps=task["num_warps"],
        )
        found["code_object_version"] = checked["code_object_version"]
    else:
        found = verify_cubin(binary, sm=int(target.arch), kernel=symbol)
    return {"symbol": symbol, "lds_bytes": lds, **found}


def compile_cell(task: dict[str, Any]) -> dict[str, Any]:
    """Compile, verify and store one cell under ``task["entry"]``; never raises.

    Returns ``{"ok": True, ...resources}`` or ``{"ok": False, "error": message}`` where the
    message is the compiler's (or the verifier's) own, shortened to its last 4000 characters.
    """
    target = TARGETS[task["target"]]
    entry = Path(task["entry"])
    started = time.perf_counter()
    try:
        compiled = _compile(task, target)
        result = {"ok": True, **_resources(task, target, compiled)}
    except Exception as error:  # any compiler failure is this cell's result
        message = f"{type(error).__name__}: {error}".strip() or traceback.format_exc()
        return {"ok": False, "error": message[-_MAX_ERROR_CHARS:]}
    result["compile_s"] = round(time.perf_counter() - started, 3)
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=entry.parent))
    (staging / f"kernel.{target.binary}").write_bytes(compiled.asm[target.binary])
    (staging / f"kernel.{target.listing}").write_text(compiled.asm[target.listing])
    (staging / RESULT_FILE).write_text(json.dumps(result, indent=1, sort_keys=True))
    try:
        staging.replace(entry)  # atomic: a reader sees a whole entry or none
    except OSError:  # another build stored the same entry first
        shutil.rmtree(staging, ignore_errors=True)
    return result
