"""Stage `kernels`: does every kvquant kernel still build for gfx90a (and sm_90), what does each
cost in registers, LDS and occupancy, and did that change since the last build?

Compiles ahead of time on the CPU node (no GPU). Fills ADR 0009's `kvquant-resources` and
`kvquant-resource-diff` blocks.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from prefect import flow, task

from adrkit import Gate, Record, Scalar, Table, utc_now, write_record
from flows._stage import REPO_ROOT, RunContext, build_record, publish, tables_markdown
from kvquant.build import build

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
) -> dict[str, Any]:
    return build(targets, matrix, out=out, previous=previous)


def _resource_rows(cells: list[dict[str, Any]]) -> list[list[Scalar]]:
    """One row per (target, kernel, cache): the worst cell of each, so the table stays short."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for cell in cells:
        constexprs = cell["specialization"]["constexprs"]
        quantized = constexprs.get("QUANTIZED", constexprs.get("QUANTIZE"))
        cache = "int8" if quantized else ("16-bit" if quantized is not None else "—")
        groups[(cell["target"], cell["kernel"], cache)].append(cell)

    def worst(group: list[dict[str, Any]], field: str, pick: Any = max) -> Scalar:
        values = [c[field] for c in group if c.get(field) is not None]
        return pick(values) if values else None

    def registers(group: list[dict[str, Any]]) -> Scalar:
        # gfx90a reports VGPRs; NVIDIA has one register file, reported as `registers`.
        return (
            worst(group, "vgprs") if group[0]["target"] == "gfx90a" else worst(group, "registers")
        )

    return [
        [
            target,
            kernel,
            cache,
            len(group),
            sum(c["status"] != "ok" for c in group),
            registers(group),
            worst(group, "agprs"),
            worst(group, "sgprs"),
            worst(group, "lds_bytes"),
            worst(group, "spill_bytes"),
            worst(group, "scratch_bytes"),
            worst(group, "waves_per_simd", min),
        ]
        for (target, kernel, cache), group in sorted(groups.items())
    ]


def kernels_record(ctx: RunContext, started_at: str, result: dict[str, Any]) -> Record:
    """The stage's record of `result`, a build diffed against the manifest it names in
    `compared_with` (None: the first build under the results root, whose empty diff compares
    nothing)."""
    compared = result["compared_with"] is not None
    cells, failures = result["cells"], result["failures"]
    gates = [
        Gate.judge(g["name"], float(g["value"]), g["op"], float(g["threshold"]))
        for g in result["gates"]
        if g.get("value") is not None
    ]
    targets = sorted({c["target"] for c in cells})
    changes = (
        f"{len(result['diff'])} resource changes"
        if compared
        else "no previous build to compare resource use against"
    )
    return build_record(
        ctx,
        STAGE,
        started_at,
        summary=(
            f"{len(cells) - len(failures)}/{len(cells)} kernel cells build for "
            f"{', '.join(targets)} ({result['cached']} from the cache, "
            f"{result['elapsed_s']:.0f} s); {changes}"
        ),
        metrics={
            "cells": len(cells),
            "cells_failed": len(failures),
            "cached": result["cached"],
            "elapsed_s": round(result["elapsed_s"], 1),
        },
        tables={
            "resources": Table(
                [
                    "target",
                    "kernel",
                    "cache",
                    "cells",
                    "failed",
                    "vgprs",
                    "agprs",
                    "sgprs",
                    "lds_bytes",
                    "spill_bytes",
                    "scratch_bytes",
                    "waves_per_simd",
                ],
                _resource_rows(cells),
            ),
            "resource-diff": Table(
                ["target", "kernel", "specialization", "field", "old", "new"],
                [
                    [
                        d["target"],
                        d["kernel"],
                        str(d["specialization"])[:120],
                        d["field"],
                        d["old"],
                        d["new"],
                    ]
                    for d in result["diff"]
                ],
                baseline_found=compared,
            ),
        },
        gates=gates,
        artifacts={"manifest": str(result["manifest"])},
    )


@flow(name="kernels", flow_run_name="kernels-{run_id}", log_prints=True)
def kernels_stage(
    run_id: str,
    results_root: Path,
    targets: list[str] | None = None,
    matrix: str | None = str(NIGHTLY_MATRIX),
    flow_run_id: str | None = None,
) -> Record:
    """Build every kvquant kernel of `matrix` (None: kvquant's full default) for `targets`."""
    ctx = RunContext(run_id, Path(results_root), flow_run_id)
    started_at = utc_now()
    out = ctx.stage_dir(STAGE)
    previous = previous_manifest(ctx.results_root, run_id)
    result = build_kernels(
        targets or ["gfx90a", "sm90"],
        Path(matrix) if matrix else None,
        out,
        previous,
    )
    record = kernels_record(ctx, started_at, result)
    write_record(ctx.results_root, record)
    publish(record, tables_markdown(record, "kvquant kernel build"), "resources")
    return record
