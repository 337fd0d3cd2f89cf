"""Evidence per hardware class: the store, the per-class sections, and what a CPU night may not do.

Records are written as the pipeline writes them (`write_record` into a results root) and read
back by `adrkit update` through its command line, so every test crosses the real files.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from adrkit import hardware_class, write_record
from adrkit.schema import Record, Table

from conftest import PNG, make_record, run_update, tree_hashes

H200 = {"accelerator": "NVIDIA H200", "accelerator_arch": "sm_90"}
MI250 = {"accelerator": "AMD Instinct MI250X", "accelerator_arch": "gfx90a"}

HARDWARE_TOML = """
[gfx90a]
label = { en = "gfx90a node", zh = "gfx90a 节点" }
stages = ["throughput"]
[nvidia-h200]
label = { en = "NVIDIA H200", zh = "NVIDIA H200" }
stages = ["throughput"]
[cpu]
label = { en = "CPU nightly", zh = "CPU 每晚" }
stages = ["throughput"]
"""

ADR = """---
lang: en
---
# 0009 INT8

<!-- generated:kvbench-kernel-throughput begin -->
<!-- generated:kvbench-kernel-throughput end -->
"""

KERNELS = ["op", "cache_dtype", "batch", "context", "median_ms", "speedup_vs_16bit", "verdict"]


def throughput_record(
    run_id: str, ended_at: str, hardware: dict[str, str] | None, median_ms: float
) -> Record:
    base = make_record("throughput", run_id=run_id, ended_at=ended_at)
    rows = [["decode", "int8", 16, 8192, median_ms, 1.8, "passed"]]
    provenance = dataclasses.replace(base.provenance, hardware=dict(hardware or {}))
    return dataclasses.replace(
        base,
        metrics={"decode_speedup_vs_16bit_min": 1.7, "decode_speedup_vs_16bit_max": 1.9},
        tables={"kernels": Table(KERNELS, rows)},
        gates=[],
        provenance=provenance,
    )


@pytest.fixture
def adr(tmp_path: Path) -> Path:
    directory = tmp_path / "adr"
    directory.mkdir()
    (directory / "0009-int8.md").write_text(ADR)
    (directory / "hardware.toml").write_text(HARDWARE_TOML)
    return directory


def _block(adr: Path) -> str:
    text = (adr / "0009-int8.md").read_text()
    return text.split("generated:kvbench-kernel-throughput begin -->")[1].split("<!--")[0]


def test_a_records_class_comes_from_its_accelerator() -> None:
    def record(hardware: dict[str, str]) -> Record:
        return throughput_record("r", "2026-12-01T00:00:00Z", hardware, 1.0)

    assert hardware_class(record(H200)) == "nvidia-h200"
    assert hardware_class(record(MI250)) == "gfx90a"
    assert hardware_class(record({})) == "cpu"
    assert hardware_class(record({"accelerator": None, "accelerator_arch": None})) == "cpu"  # type: ignore[dict-item]


def test_a_cpu_night_never_replaces_the_gpu_row(
    adr: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpu_run = tmp_path / "gpu-results"
    write_record(gpu_run, throughput_record("gpu-1", "2026-12-01T10:00:00Z", H200, 0.0764))
    assert run_update(capsys, adr, gpu_run, "--store", str(gpu_run)) == (0, "")
    stored = adr / "evidence" / "nvidia-h200" / "throughput.json"
    assert json.loads(stored.read_text())["provenance"]["run_id"] == "gpu-1"
    # Two CPU nights later, from a results root that never saw the GPU run.
    cpu_nights = tmp_path / "cpu-results"
    for night, day in (("cpu-1", "02"), ("cpu-2", "03")):
        write_record(cpu_nights, throughput_record(night, f"2026-12-{day}T02:00:00Z", None, 9.5))
        code, _ = run_update(capsys, adr, cpu_nights, "--store", str(cpu_nights / night))
        assert code == 0
    block = _block(adr)
    h200, cpu = block.index("**NVIDIA H200**"), block.index("**CPU nightly**")
    assert cpu < h200  # newest first
    assert "0.0764" in block[h200:] and "run `gpu-1`" in block[h200:]
    assert "9.5" in block[cpu:h200] and "run `cpu-2`" in block[cpu:h200]
    assert "run `cpu-1`" not in block  # each class shows only its newest record
    assert "_gfx90a node: not yet run_" in block
    assert json.loads(stored.read_text())["provenance"]["run_id"] == "gpu-1"


def test_the_store_keeps_only_newer_records_and_never_a_skipped_one(
    adr: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    newer, older = tmp_path / "newer", tmp_path / "older"
    write_record(newer, throughput_record("new", "2026-12-02T00:00:00Z", H200, 1.0))
    write_record(older, throughput_record("old", "2026-12-01T00:00:00Z", H200, 2.0))
    skipped = dataclasses.replace(
        make_record("throughput", run_id="skip", ended_at="2026-12-03T00:00:00Z"),
        status="skipped",
        reason="not run: no worker took it",
        gates=[],
    )
    skipped = dataclasses.replace(
        skipped, provenance=dataclasses.replace(skipped.provenance, hardware=dict(H200))
    )
    write_record(tmp_path / "skipped", skipped)
    for results in (newer, older, tmp_path / "skipped"):
        assert run_update(capsys, adr, results, "--store", str(results))[0] == 0
    stored = json.loads((adr / "evidence" / "nvidia-h200" / "throughput.json").read_text())
    assert stored["provenance"]["run_id"] == "new"


def test_stored_figures_travel_with_the_record_and_render_from_a_fresh_clone(
    adr: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results"
    record = throughput_record("gpu-1", "2026-12-01T00:00:00Z", H200, 1.0)
    run_dir = results / "gpu-1" / "throughput"
    run_dir.mkdir(parents=True)
    (run_dir / "throughput-kernel-vs-context.png").write_bytes(PNG + b"h200")
    (run_dir / "throughput.json").write_text("{}")
    artifacts = {
        "throughput-kernel-vs-context.png": str(run_dir / "throughput-kernel-vs-context.png"),
        "throughput.json": str(run_dir / "throughput.json"),
    }
    write_record(results, dataclasses.replace(record, artifacts=artifacts))
    assert run_update(capsys, adr, results, "--store", str(results))[0] == 0
    store = adr / "evidence" / "nvidia-h200"
    assert (store / "throughput" / "throughput-kernel-vs-context.png").read_bytes() == PNG + b"h200"
    kept = json.loads((store / "throughput.json").read_text())["artifacts"]
    assert kept == {
        "throughput-kernel-vs-context.png": "throughput/throughput-kernel-vs-context.png"
    }
    # A fresh clone: the results are gone, the store and the ADRs are what the repository holds.
    for path in (adr / "assets").iterdir():
        path.unlink()
    before = (adr / "0009-int8.md").read_text()
    (adr / "0009-int8.md").write_text(ADR)
    from adrkit.__main__ import main

    capsys.readouterr()
    assert main(["update", "--adr-dir", str(adr)]) == 0, capsys.readouterr().err
    assert (adr / "0009-int8.md").read_text() == before
    asset = adr / "assets" / "throughput-nvidia-h200-throughput-kernel-vs-context.png"
    assert asset.read_bytes() == PNG + b"h200"


def test_a_gpu_architecture_the_build_compiled_for_says_compiled_not_yet_run(
    adr: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results"
    write_record(results, throughput_record("cpu-1", "2026-12-01T00:00:00Z", None, 9.5))
    columns = ["target", "kernel", "cache", "cells", "failed"]
    kernels = dataclasses.replace(
        make_record("kernels", run_id="cpu-1"),
        tables={"resources": Table(columns, [["gfx90a", "decode_attention", "int8", 2, 0]])},
        gates=[],
    )
    write_record(results, kernels)
    assert run_update(capsys, adr, results)[0] == 0
    block = _block(adr)
    assert "_gfx90a node: compiled, not yet run_" in block
    assert "_NVIDIA H200: not yet run_" in block


def test_a_store_folder_that_is_a_link_is_refused_and_nothing_is_written(
    adr: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (adr / "evidence").symlink_to(outside, target_is_directory=True)
    results = tmp_path / "results"
    write_record(results, throughput_record("gpu-1", "2026-12-01T00:00:00Z", H200, 1.0))
    before = tree_hashes(tmp_path)
    code, err = run_update(capsys, adr, results, "--store", str(results))
    assert code == 2 and "not a link or a file" in err and err.count("\n") == 1
    assert tree_hashes(tmp_path) == before


def test_an_explicit_results_folder_that_does_not_exist_is_an_error(
    adr: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_update(capsys, adr, tmp_path / "no-such-results")
    assert code == 2 and "does not exist" in err


def test_a_class_the_hardware_file_does_not_name_shows_under_its_accelerators_name(
    adr: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results"
    b200 = {"accelerator": "NVIDIA B200", "accelerator_arch": "sm_100"}
    write_record(results, throughput_record("b200-1", "2026-12-01T00:00:00Z", b200, 0.05))
    assert run_update(capsys, adr, results)[0] == 0
    block = _block(adr)
    assert "**NVIDIA B200**" in block and "0.05" in block
    assert "_NVIDIA H200: not yet run_" in block and "_CPU nightly: not yet run_" in block


def _gpu_run_with_figures(results: Path, run_id: str, ended_at: str, figures: list[str]) -> None:
    """An H200 throughput record of ``run_id`` with a PNG of each of ``figures``."""
    run_dir = results / run_id / "throughput"
    run_dir.mkdir(parents=True)
    for name in figures:
        (run_dir / name).write_bytes(PNG + run_id.encode())
    record = throughput_record(run_id, ended_at, H200, 1.0)
    artifacts = {name: str(run_dir / name) for name in figures}
    write_record(results, dataclasses.replace(record, artifacts=artifacts))


def test_a_figure_a_newer_record_dropped_is_removed_from_assets_and_the_store(
    adr: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from adrkit.__main__ import main

    kept, dropped = "throughput-kernel-vs-context.png", "throughput-trend.png"
    first, second = tmp_path / "first", tmp_path / "second"
    _gpu_run_with_figures(first, "gpu-1", "2026-12-01T00:00:00Z", [kept, dropped])
    assert run_update(capsys, adr, first, "--store", str(first)) == (0, "")
    store = adr / "evidence" / "nvidia-h200" / "throughput"
    assets = adr / "assets"
    stale = [assets / f"throughput-nvidia-h200-{dropped}", store / dropped]
    assert all(path.read_bytes() == PNG + b"gpu-1" for path in stale)
    # Files adrkit did not write by its naming rule: a user's own figures and notes, a figure
    # named for a class no record shows, and a link (the store holds nothing of anyone else's:
    # test_store_layout.py).
    foreign = [
        assets / "architecture.png",
        assets / "throughput-nvidia-h200-notes.txt",
        assets / f"throughput-gfx90a-{dropped}",
        assets / f"kernels-nvidia-h200-{dropped}",
    ]
    for path in foreign:
        path.write_bytes(PNG + b"someone else's")
    (assets / f"throughput-nvidia-h200-link-{dropped}").symlink_to(tmp_path / "first")
    _gpu_run_with_figures(second, "gpu-2", "2026-12-02T00:00:00Z", [kept])

    # --check sees the removals first, and removes nothing.
    before = tree_hashes(adr)
    capsys.readouterr()
    args = ["update", "--adr-dir", str(adr), "--results", str(second), "--store", str(second)]
    assert main([*args, "--check"]) == 1
    out = capsys.readouterr().out
    assert all(f"stale: {path}\n" in out for path in stale), out
    assert tree_hashes(adr) == before

    assert main(args) == 0
    out = capsys.readouterr().out
    assert all(f"removed: {path}\n" in out for path in stale), out
    assert not any(path.exists() for path in stale)
    assert (assets / f"throughput-nvidia-h200-{kept}").read_bytes() == PNG + b"gpu-2"
    assert (store / kept).read_bytes() == PNG + b"gpu-2"
    assert all(path.read_bytes() == PNG + b"someone else's" for path in foreign)
    assert (assets / f"throughput-nvidia-h200-link-{dropped}").is_symlink()
    stored = json.loads((adr / "evidence" / "nvidia-h200" / "throughput.json").read_text())
    assert stored["artifacts"] == {kept: f"throughput/{kept}"}
    assert main([*args, "--check"]) == 0


def test_a_stored_record_replaced_by_one_without_figures_leaves_none_of_its_copies(
    adr: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _gpu_run_with_figures(first, "gpu-1", "2026-12-01T00:00:00Z", ["throughput-trend.png"])
    assert run_update(capsys, adr, first, "--store", str(first)) == (0, "")
    _gpu_run_with_figures(second, "gpu-2", "2026-12-02T00:00:00Z", [])
    assert run_update(capsys, adr, second, "--store", str(second)) == (0, "")
    assert list((adr / "assets").iterdir()) == []
    assert list((adr / "evidence" / "nvidia-h200" / "throughput").iterdir()) == []
