"""The build at each Triton that matters: the one the gfx90a target runs and the newest installed.

The gfx90a target runs the Triton its vLLM requires (the matrix's ``[triton] target``, with where
that is stated), which register allocation depends on: the same kernel can take other VGPRs and
AGPRs, and so fit fewer waves per SIMD, under another release. `build_tritons` builds the matrix
with the Triton of this process (the newest installed) and, when that is not the target's, again
in a process of its own whose ``import triton`` finds the target release first: a folder made by
``pip install --no-deps --target DIR triton==<target>``, named by ``$KVQUANT_TARGET_TRITON``. The
matrix's gates judge the target's build, which is the one the team ships; without one, the newest
build's, and the result says why the target's is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from adrkit.schema import Gate, RecordParts, Scalar, Table

from ._build import build, installed_triton
from ._errors import BuildError
from ._matrix import load_matrix
from ._result import DIFF_COLUMNS, RESOURCE_COLUMNS, BuildResult, ManifestCell, resource_rows

TARGET_TRITON_ENV = "KVQUANT_TARGET_TRITON"
# A cold build of the full default matrix for both targets takes minutes on a 2-core machine.
_SUBPROCESS_TIMEOUT_S = 4 * 3600
# Constexprs the specializations table leaves out of a launch shape: the cache (its own column),
# the kernel's variant (its name says it), the interpreter's switch and the padded head size.
_NOT_LAUNCH = frozenset(
    {"QUANTIZED", "QUANTIZE", "DOT_IN_FP32", "FIND_BOUNDS", "ONE_SPLIT", "EXPANDED", "HEAD_PAD"}
)


@dataclass(frozen=True)
class TritonBuild:
    """One build of the matrix at one Triton release; ``result`` None when it could not run,
    and ``why_not`` says why."""

    version: str
    target: bool
    newest: bool
    result: BuildResult | None = None
    why_not: str | None = None


@dataclass(frozen=True)
class TritonBuilds:
    """The builds of one kernels stage, the target's first; ``target_source`` states why the
    target runs that release."""

    builds: list[TritonBuild]
    target_version: str | None
    target_source: str | None

    RECORD_TABLES: ClassVar[tuple[str, ...]] = ("resources", "resource-diff", "specializations")

    @property
    def gated(self) -> TritonBuild:
        """The build the gates judge: the target's when it ran, else the newest's."""
        ran = [b for b in self.builds if b.result is not None]
        return next((b for b in ran if b.target), ran[0])

    @property
    def passed(self) -> bool:
        """Every build that ran built every cell, and the gated build held every gate."""
        ran = [b.result for b in self.builds if b.result is not None]
        gated = self.gated.result
        assert gated is not None
        return not any(r.failures for r in ran) and gated.passed

    def record_parts(self) -> RecordParts:
        """The kernels stage's record: each build's worst resource use per (target, kernel,
        cache) and its changes since the previous build of the same release, each row under its
        Triton release and that release's role (target, newest); the launch shapes each target
        compiles in the gated build; the gated build's gates."""
        ran = [b for b in self.builds if b.result is not None]
        gated = self.gated
        assert gated.result is not None
        resources: list[list[Scalar]] = []
        diff: list[list[Scalar]] = []
        compared = True
        for one in ran:
            assert one.result is not None
            role = ",".join(
                r for r, held in (("target", one.target), ("newest", one.newest)) if held
            )
            resources += [[one.version, role, *row] for row in resource_rows(one.result.cells)]
            parts = one.result.record_parts()
            diff += [[one.version, *row] for row in parts.tables["resource-diff"].rows]
            compared = compared and one.result.compared_with is not None
        shapes = [[gated.version, *row] for row in specialization_rows(gated.result.cells)]
        failed = sum(len(b.result.failures) for b in ran if b.result is not None)
        cells = sum(len(b.result.cells) for b in ran if b.result is not None)
        missing = [b for b in self.builds if b.result is None]
        summary = "; ".join(
            [
                *(
                    f"Triton {b.version}{' (target)' if b.target else ''}: "
                    f"{b.result.record_parts().summary}"
                    for b in ran
                    if b.result is not None
                ),
                *(f"Triton {b.version} (target): not built: {b.why_not}" for b in missing),
            ]
        )
        newest = next(b for b in self.builds if b.newest)
        metrics: dict[str, Scalar] = {
            "cells": cells,
            "cells_failed": failed,
            "cached": sum(b.result.cached for b in ran if b.result is not None),
            "elapsed_s": round(sum(b.result.elapsed_s for b in ran if b.result is not None), 1),
            "triton_target": self.target_version,
            "triton_target_source": self.target_source,
            "triton_newest": newest.version,
            "triton_gated": gated.version,
            "triton_target_not_built": missing[0].why_not if missing else None,
        }
        return RecordParts(
            summary=summary,
            metrics=metrics,
            tables=dict(
                zip(
                    self.RECORD_TABLES,
                    (
                        Table(["triton", "triton_role", *RESOURCE_COLUMNS], resources),
                        Table(["triton", *DIFF_COLUMNS], diff, baseline_found=compared),
                        Table(["triton", *_SHAPE_COLUMNS], shapes),
                    ),
                    strict=True,
                )
            ),
            gates=[
                Gate(g.name, g.value, g.op, g.threshold, g.passed)
                for g in gated.result.gates
                if g.value is not None
            ],
            artifacts={
                f"manifest-triton-{b.version}": b.result.manifest
                for b in ran
                if b.result is not None
            },
        )


def build_tritons(
    targets: list[str] | None,
    matrix: Path | None,
    *,
    out: Path,
    previous: Callable[[str], Path | None] = lambda version: None,
    target_triton: Path | None = None,
    jobs: int | None = None,
    cache_dir: Path | None = None,
) -> TritonBuilds:
    """Build ``matrix`` for ``targets`` with this process's Triton, into
    ``out/triton-<version>``, and with the matrix's target Triton from the folder
    ``target_triton`` (default: ``$KVQUANT_TARGET_TRITON``) when that is another release.
    ``previous(version)`` is the manifest each build is diffed against."""
    parsed = load_matrix(matrix)
    newest = installed_triton()
    result = build(
        targets,
        matrix,
        out=out / f"triton-{newest}",
        previous=previous(newest),
        jobs=jobs,
        cache_dir=cache_dir,
    )
    wanted = parsed.target_triton
    builds = [TritonBuild(newest, target=wanted in (None, newest), newest=True, result=result)]
    if wanted is not None and wanted != newest:
        folder = target_triton or _env_folder()
        builds.insert(
            0,
            _build_elsewhere(
                wanted, folder, targets, matrix, out, previous(wanted), jobs, cache_dir
            ),
        )
    return TritonBuilds(builds, wanted, parsed.target_triton_source)


def _env_folder() -> Path | None:
    value = os.environ.get(TARGET_TRITON_ENV)
    return Path(value) if value else None


def _build_elsewhere(
    version: str,
    folder: Path | None,
    targets: list[str] | None,
    matrix: Path | None,
    out: Path,
    previous: Path | None,
    jobs: int | None,
    cache_dir: Path | None,
) -> TritonBuild:
    """The build at Triton ``version``, in a process whose first import path is ``folder``."""
    install = (
        f"`pip install --no-deps --target DIR triton=={version}` and set {TARGET_TRITON_ENV}=DIR"
    )
    if folder is None:
        return _not_built(version, f"{TARGET_TRITON_ENV} is not set; {install}")
    found = _installed_version(folder)
    if found != version:
        what = f"Triton {found}" if found else "no Triton"
        return _not_built(version, f"{TARGET_TRITON_ENV}={folder} holds {what}; {install}")
    into = out / f"triton-{version}"
    result_file = out / f"triton-{version}.json"
    command = [sys.executable, "-m", "kvquant", "build", "--out", str(into)]
    command += ["--json", str(result_file)]
    command += [arg for target in targets or [] for arg in ("--target", target)]
    command += ["--matrix", str(matrix)] if matrix is not None else []
    command += ["--previous", str(previous)] if previous is not None else []
    command += ["--jobs", str(jobs)] if jobs is not None else []
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), *sys.path])
    if cache_dir is not None:
        env["KVQUANT_BUILD_CACHE"] = str(cache_dir)
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=_SUBPROCESS_TIMEOUT_S, check=False
    )
    if done.returncode not in (0, 1) or not result_file.is_file():
        lines = (done.stderr or done.stdout).strip().splitlines()
        why = lines[-1] if lines else f"exit {done.returncode}"
        return _not_built(version, f"the build stopped: {why}")
    result = BuildResult.from_dict(json.loads(result_file.read_text(encoding="utf-8")))
    if result.triton_version != version:
        raise BuildError(f"the build in {folder} ran Triton {result.triton_version}, not {version}")
    return TritonBuild(version, target=True, newest=False, result=result)


def _not_built(version: str, why: str) -> TritonBuild:
    return TritonBuild(version, target=True, newest=False, why_not=why)


def _installed_version(folder: Path) -> str | None:
    """The Triton release installed in ``folder`` (its dist-info), None without one."""
    found = sorted(folder.glob("triton-*.dist-info"))
    if not found:
        return None
    return found[0].name.removeprefix("triton-").removesuffix(".dist-info")


def specialization_rows(cells: list[ManifestCell]) -> list[list[Scalar]]:
    """One row per (target, kernel, cache, launch shape): how many cells compiled it. The launch
    shape is the kernel's constexprs (head size, tiles, the paths it takes) with its warps and
    stages."""
    counts: dict[tuple[str, str, str, str], int] = {}
    for cell in cells:
        specialization = cell["specialization"]
        constexprs: Mapping[str, Any] = specialization["constexprs"]
        quantized = constexprs.get("QUANTIZED", constexprs.get("QUANTIZE"))
        cache = "int8" if quantized else ("16-bit" if quantized is not None else "—")
        # A switch shows by its name when on; every other constexpr with its value.
        launch = [
            name if value is True else f"{name}={value}"
            for name, value in constexprs.items()
            if name not in _NOT_LAUNCH and value is not False
        ]
        launch += [f"warps={specialization['num_warps']}", f"stages={specialization['num_stages']}"]
        key = (cell["target"], cell["kernel"], cache, " ".join(launch))
        counts[key] = counts.get(key, 0) + 1
    return [[*key, count] for key, count in sorted(counts.items())]


_SHAPE_COLUMNS = ["target", "kernel", "cache", "launch", "cells"]
