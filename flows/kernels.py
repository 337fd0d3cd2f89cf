"""Stage `kernels`: does every kvquant kernel still build for gfx90a (and sm_90), what does each
cost in registers, LDS and occupancy, and did that change since the last build?

Compiles ahead of time on the CPU node (no GPU). Fills ADR 0009's `kvquant-resources` and
`kvquant-resource-diff` blocks.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task

from adrkit import Record
from flows._stage import REPO_ROOT, RunContext, run_stage
from kvquant.build import BuildResult, build

STAGE = "kernels"
NIGHTLY_MATRIX = REPO_ROOT / "flows" / "kernels-nightly.toml"


def previous_manifest(results_root: Path, run_id: str) -> Path | None:
    """The newest manifest an earlier run of this stage left, to diff resource use against."""
    manifests = sorted(
        p for p in results_root.glob(f"*/{STAGE}/manifest.json") if p.parts[-3] != run_id
    )
    return manifests[-1] if manifests else None


@task
def build_kernels(
    targets: list[str], matrix: Path | None, out: Path, previous: Path | None
) -> BuildResult:
    return build(targets, matrix, out=out, previous=previous)


@flow(name="kernels", flow_run_name="kernels-{run_id}", log_prints=True)
def kernels_stage(
    run_id: str,
    results_root: Path,
    targets: list[str] | None = None,
    matrix: str | None = str(NIGHTLY_MATRIX),
    flow_run_id: str | None = None,
) -> Record:
    """Build every kvquant kernel of `matrix` (None: kvquant's full default) for `targets`,
    diffed against the previous build under the results root (none: the diff says so)."""
    previous = previous_manifest(Path(results_root), run_id)
    return run_stage(
        STAGE,
        RunContext(run_id, Path(results_root), flow_run_id),
        lambda out: build_kernels(
            targets or ["gfx90a", "sm90"], Path(matrix) if matrix else None, out, previous
        ).record_parts(),
        title="kvquant kernel build",
        table="resources",
        gpu=False,
    )
