"""The kernels stage's record, built from real builds under one results root: the first has no
previous manifest to diff against and must say so, the second diffs against the first; each build
runs at the target's Triton and the newest installed, and the record says which is which."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adrkit import (
    Evidence,
    Shown,
    load_decisions,
    load_hardware,
    read_record,
    render_block,
    utc_now,
    write_record,
)
from flows._stage import ADR_DIR, RunContext, stage_record
from flows.kernels import STAGE, previous_manifest
from kvquant.build import TARGET_TRITON_ENV, build_tritons, load_matrix

FIRST_RUN = "No previous build under this results root: nothing to compare against."
NO_CHANGE = "No resource use changed since the previous build."
TARGET = load_matrix(None).target_triton


def _target_triton() -> Path:
    folder = os.environ.get(TARGET_TRITON_ENV)
    if not folder:
        pytest.skip(f"{TARGET_TRITON_ENV} is not set (`nox -s test` installs Triton {TARGET})")
    return Path(folder)


def test_resource_diff_block_tells_a_first_build_from_an_unchanged_one(
    tmp_path: Path, tiny_kernel_matrix: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the build compiles for real
    root = tmp_path / "results"
    blocks, summaries = [], []
    target_triton = _target_triton()
    for run_id in ("run-1", "run-2"):
        ctx = RunContext(run_id, root)
        builds = build_tritons(
            ["gfx90a"],
            tiny_kernel_matrix,
            out=ctx.stage_dir(STAGE),
            previous=lambda triton, run_id=run_id: previous_manifest(root, run_id, triton),
            target_triton=target_triton,
            cache_dir=tmp_path / "build-cache",
        )
        # Through the JSON file, as the ADR writer reads it.
        record = stage_record(ctx, STAGE, utc_now(), builds.record_parts())
        record = read_record(write_record(root, record))
        blocks.append(render_block("kvquant-resource-diff", {STAGE: record}, "en"))
        summaries.append(record.summary)

    assert previous_manifest(root, "run-3", TARGET) == (
        root / "run-2" / STAGE / f"triton-{TARGET}" / "manifest.json"
    )
    first, second = blocks
    assert first.startswith(FIRST_RUN)
    assert NO_CHANGE not in first
    assert "no previous build to compare resource use against" in summaries[0]
    assert second.startswith(NO_CHANGE)
    assert summaries[1].count("; 0 resource changes") == 2  # one per Triton build


def test_each_triton_build_is_its_own_column_set_and_the_gates_judge_the_targets(
    tmp_path: Path, tiny_kernel_matrix: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ctx = RunContext("run-1", tmp_path / "results")
    builds = build_tritons(
        ["gfx90a", "sm90"],
        tiny_kernel_matrix,
        out=ctx.stage_dir(STAGE),
        target_triton=_target_triton(),
        cache_dir=tmp_path / "cache",
    )
    record = stage_record(ctx, STAGE, utc_now(), builds.record_parts())
    assert record.metrics["triton_target"] == TARGET == record.metrics["triton_gated"]
    assert record.metrics["triton_newest"] != TARGET
    assert "rocm-build.txt" in str(record.metrics["triton_target_source"])
    releases = {row[0]: row[1] for row in record.tables["resources"].rows}
    assert releases == {TARGET: "target", record.metrics["triton_newest"]: "newest"}
    block = render_block("kvquant-resources", {STAGE: record}, "en")
    assert f"_The gfx90a target runs Triton {TARGET}: `vLLM 0.18.1 requirements" in block
    assert f"VGPRs, NVIDIA: registers (max) · Triton {TARGET} (target)" in block
    assert "· Triton 3.9.0 (newest)" in block
    shapes = render_block("kvquant-specializations", {STAGE: record}, "en")
    assert "| gfx90a | reduce_splits | — | `HEAD_SIZE" not in shapes  # the reducer has no head size
    assert "| gfx90a | reduce_splits | — | `SPLIT_TILE=16 warps=4 stages=1` | 1 |" in shapes


def test_a_missing_target_triton_is_named_and_its_row_is_not_measured(
    tmp_path: Path, tiny_kernel_matrix: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ctx = RunContext("run-1", tmp_path / "results")
    empty = tmp_path / "no-triton-here"
    empty.mkdir()
    builds = build_tritons(
        ["gfx90a"],
        tiny_kernel_matrix,
        out=ctx.stage_dir(STAGE),
        target_triton=empty,
        cache_dir=tmp_path / "cache",
    )
    record = stage_record(ctx, STAGE, utc_now(), builds.record_parts())
    why = f"{TARGET_TRITON_ENV}={empty} holds no Triton; `pip install --no-deps --target DIR"
    assert str(record.metrics["triton_target_not_built"]).startswith(why)
    assert record.status == "passed"  # the newest build passed its gates; the row says the rest
    shown = Shown(Evidence.of([record]), load_hardware(ADR_DIR), load_decisions(ADR_DIR))
    summary = render_block("decision-0009", shown, "en")
    row = next(line for line in summary.splitlines() if "Builds on gfx90a" in line)
    assert f"no gfx90a build at the target's Triton {TARGET}: ``{why}" in row
    assert row.endswith("| not measured |")


def test_resource_table_gives_nvidia_registers_in_the_vgpr_column(
    tmp_path: Path, tiny_kernel_matrix: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The column reads "VGPRs, NVIDIA: registers": an sm_90 row carries its register count."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ctx = RunContext("run-1", tmp_path / "results")
    builds = build_tritons(
        ["sm90"], tiny_kernel_matrix, out=ctx.stage_dir(STAGE), cache_dir=tmp_path / "cache"
    )
    table = stage_record(ctx, STAGE, utc_now(), builds.record_parts()).tables["resources"]
    column = table.columns.index("vgprs")
    registers = {row[3]: row[column] for row in table.rows}
    assert registers, "the build produced no rows"
    for kernel, count in registers.items():
        assert isinstance(count, int) and 0 < count <= 255, (kernel, count)
