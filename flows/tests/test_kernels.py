"""The kernels stage's record, built from two real builds under one results root: the first has
no previous manifest to diff against and must say so, the second diffs against the first."""

from __future__ import annotations

from pathlib import Path

import pytest

from adrkit import read_record, render_block, utc_now, write_record
from flows._stage import RunContext, stage_record
from flows.kernels import STAGE, previous_manifest
from kvquant.build import build

FIRST_RUN = "No previous build under this results root: nothing to compare against."
NO_CHANGE = "No resource use changed since the previous build."


def test_resource_diff_block_tells_a_first_build_from_an_unchanged_one(
    tmp_path: Path, tiny_kernel_matrix: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the build compiles for real
    root = tmp_path / "results"
    blocks, summaries = [], []
    for run_id in ("run-1", "run-2"):
        ctx = RunContext(run_id, root)
        previous = previous_manifest(root, run_id)
        result = build(
            ["gfx90a"],
            tiny_kernel_matrix,
            out=ctx.stage_dir(STAGE),
            previous=previous,
            cache_dir=tmp_path / "build-cache",
        )
        # Through the JSON file, as the ADR writer reads it.
        record = stage_record(ctx, STAGE, utc_now(), result.record_parts())
        record = read_record(write_record(root, record))
        blocks.append(render_block("kvquant-resource-diff", {STAGE: record}, "en"))
        summaries.append(record.summary)

    assert previous == root / "run-1" / STAGE / "manifest.json"
    first, second = blocks
    assert first.startswith(FIRST_RUN)
    assert NO_CHANGE not in first
    assert "no previous build to compare resource use against" in summaries[0]
    assert second.startswith(NO_CHANGE)
    assert summaries[1].endswith("; 0 resource changes")


def test_resource_table_gives_nvidia_registers_in_the_vgpr_column(
    tmp_path: Path, tiny_kernel_matrix: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The column reads "VGPRs, NVIDIA: registers": an sm_90 row carries its register count."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ctx = RunContext("run-1", tmp_path / "results")
    result = build(
        ["sm90"], tiny_kernel_matrix, out=ctx.stage_dir(STAGE), cache_dir=tmp_path / "cache"
    )
    table = stage_record(ctx, STAGE, utc_now(), result.record_parts()).tables["resources"]
    column = table.columns.index("vgprs")
    registers = {row[1]: row[column] for row in table.rows}
    assert registers, "the build produced no rows"
    for kernel, count in registers.items():
        assert isinstance(count, int) and 0 < count <= 255, (kernel, count)
