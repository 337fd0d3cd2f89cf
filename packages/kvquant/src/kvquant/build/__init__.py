"""Ahead-of-time build of every kvquant Triton kernel for gfx90a (and sm_90) on a CPU machine.

``build()`` compiles each cell of a TOML matrix with ``triton.compile`` for the chosen targets,
verifies every code object (no GPU needed), records each kernel's resource use and gfx90a
occupancy in ``manifest.json``, and caches by source hash, Triton version and cell. It must run
in a process with compiled Triton: ``TRITON_INTERPRET`` unset (or 0).
"""

from .._occupancy import cdna2_waves_per_simd
from ._build import BUILD_FORMAT, build, default_cache_dir, diff_manifests
from ._elf import verify_cubin, verify_hsaco
from ._errors import ArtifactError, BuildError, MatrixFileError, UnknownTargetError
from ._matrix import GATES, load_matrix, parse_matrix
from ._report import format_report
from ._result import BuildGate, BuildResult
from ._targets import TARGETS
from ._tritons import TARGET_TRITON_ENV, TritonBuild, TritonBuilds, build_tritons

__all__ = [
    "BUILD_FORMAT",
    "GATES",
    "TARGETS",
    "TARGET_TRITON_ENV",
    "ArtifactError",
    "BuildError",
    "BuildGate",
    "BuildResult",
    "MatrixFileError",
    "TritonBuild",
    "TritonBuilds",
    "UnknownTargetError",
    "build",
    "build_tritons",
    "cdna2_waves_per_simd",
    "default_cache_dir",
    "diff_manifests",
    "format_report",
    "load_matrix",
    "parse_matrix",
    "verify_cubin",
    "verify_hsaco",
]
