"""Stage `kernels`: does every kvquant kernel still build for gfx90a (and sm_90), what does each
cost in registers, LDS and occupancy, and did that change since the last build?

Compiles ahead of time on the CPU node (no GPU), with the Triton the gfx90a target runs (the
matrix's `[triton] target`, from `$KVQUANT_TARGET_TRITON`) and with the newest installed; the
gates judge the target's build. Fills ADR 0009's `kvquant-resources`, `kvquant-resource-diff` and
`kvquant-specializations` blocks.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task

from adrkit.schema import Record
from flows._stage import REPO_ROOT, RunContext, run_stage
from kvquant.build import TritonBuilds, build_tritons

STAGE = "kernels"
NIGHTLY_MATRIX = REPO_ROOT / "flows" / "kernels-nightly.toml"


def previous_manifest(results_root: Path, run_id: str, triton: str) -> Path | None:
    """The newest manifest an earlier run of this stage left at Triton ``triton``, to diff
    resource use against."""
    manifests = sorted(
        p
        for p in results_root.glob(f"*/{STAGE}/triton-{triton}/manifest.json")
        if p.parts[-4] != run_id
    )
    return manifests[-1] if manifests else None


@task
def build_kernels(
    targets: list[str], matrix: Path | None, out: Path, results_root: Path, run_id: str
) -> TritonBuilds:
    return build_tritons(
        targets,
        matrix,
        out=out,
        previous=lambda triton: previous_manifest(results_root, run_id, triton),
    )


@flow(name="kernels", flow_run_name="kernels-{run_id}", log_prints=True)
def kernels_stage(
    run_id: str,
    results_root: Path,
    targets: list[str] | None = None,
    matrix: str | None = str(NIGHTLY_MATRIX),
    flow_run_id: str | None = None,
) -> Record:
    """Build every kvquant kernel of `matrix` (None: kvquant's full default) for `targets`, at
    the target's Triton and the newest installed, each diffed against the previous build of its
    release under the results root (none: the diff says so)."""
    root = Path(results_root)
    return run_stage(
        STAGE,
        RunContext(run_id, root, flow_run_id),
        lambda out: build_kernels(
            targets or ["gfx90a", "sm90"], Path(matrix) if matrix else None, out, root, run_id
        ).record_parts(),
        title="kvquant kernel build",
        table="resources",
        gpu=False,
    )
