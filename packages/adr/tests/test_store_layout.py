"""Anything in the evidence store or a results root that is not where the layout says is an error
naming it; a stray file never hides folders or removes evidence. And the records a careless user
or a hostile node may leave there: a stage that is not its file's name, an end in year 9999, an
accelerator name of 300 characters, a table of 150,000 rows, a run folder that is a link out.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

from adrkit import write_record
from adrkit.schema import Record, Table

from conftest import PNG, assert_one_line_error, make_record, run_update, tree_hashes

H200 = {"accelerator": "NVIDIA H200", "accelerator_arch": "sm_90"}
HARDWARE_TOML = """
[nvidia-h200]
label = { en = "NVIDIA H200" }
stages = ["throughput"]
[nvidia-h200-nvl]
label = { en = "NVIDIA H200 NVL" }
stages = ["throughput"]
[cpu]
label = { en = "CPU nightly" }
stages = ["throughput"]
"""
ADR = (
    "---\nlang: en\n---\n# 0009 INT8\n\n"
    "<!-- generated:kvbench-kernel-throughput begin -->\n"
    "<!-- generated:kvbench-kernel-throughput end -->\n"
)
FIGURE = "throughput-trend.png"


def throughput(run_id: str, ended_at: str, hardware: dict[str, str] | None) -> Record:
    base = make_record("throughput", run_id=run_id, ended_at=ended_at)
    provenance = dataclasses.replace(base.provenance, hardware=dict(hardware or {}))
    table = Table(["op", "median_ms"], [["decode", 0.0764 if hardware else 9.5]])
    return dataclasses.replace(base, tables={"kernels": table}, gates=[], provenance=provenance)


def with_figure(results: Path, record: Record) -> None:
    """Write RECORD into RESULTS with a PNG named FIGURE in its stage's folder."""
    folder = results / record.provenance.run_id / record.stage
    folder.mkdir(parents=True)
    (folder / FIGURE).write_bytes(PNG + record.provenance.run_id.encode())
    write_record(results, dataclasses.replace(record, artifacts={FIGURE: str(folder / FIGURE)}))


@pytest.fixture
def stored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """An ADR directory whose store holds an H200 record with a figure, and the CPU night's."""
    adr = tmp_path / "adr"
    adr.mkdir()
    (adr / "0009-int8.md").write_text(ADR)
    (adr / "hardware.toml").write_text(HARDWARE_TOML)
    gpu, cpu = tmp_path / "gpu", tmp_path / "cpu"
    with_figure(gpu, throughput("gpu-1", "2026-12-01T00:00:00Z", H200))
    write_record(cpu, throughput("cpu-1", "2026-12-02T00:00:00Z", None))
    for results in (gpu, cpu):
        assert run_update(capsys, adr, results, "--store", str(results)) == (0, "")
    assert "run `gpu-1`" in (adr / "0009-int8.md").read_text()
    return adr


def _fails_naming(
    capsys: pytest.CaptureFixture[str], adr: Path, results: Path, *fragments: str
) -> None:
    """`--check` and the update both exit 2 with one line naming FRAGMENTS; nothing changes."""
    before = tree_hashes(adr)
    for extra in (("--check",), ()):
        code, err = run_update(capsys, adr, results, *extra)
        assert code == 2, err
        assert_one_line_error(err, *fragments)
    assert tree_hashes(adr) == before


def test_a_stray_json_at_the_stores_root_is_an_error_not_a_hidden_store(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A record copied to the store's root once made it read as one class folder: every stored
    # record, the H200 one among them, fell out of the ADR, and the update exited 0.
    stray = stored / "evidence" / "throughput.json"
    shutil.copy(stored / "evidence" / "cpu" / "throughput.json", stray)
    results = tmp_path / "cpu"
    _fails_naming(capsys, stored, results, str(stray), "evidence store's layout")
    stray.unlink()
    assert run_update(capsys, stored, results) == (0, "")
    assert "run `gpu-1`" in (stored / "0009-int8.md").read_text()


def test_a_stray_json_at_a_results_root_is_an_error_not_hidden_runs(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    write_record(root, throughput("cpu-2", "2026-12-03T00:00:00Z", None))
    shutil.copy(root / "cpu-2" / "throughput.json", root / "throughput.json")
    _fails_naming(capsys, stored, root, f"{root} holds records", str(root / "cpu-2"))


def test_a_run_whose_stage_is_still_running_is_no_stray(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The throughput stage has written its benchmark's JSON into its folder, not its record yet.
    root = tmp_path / "root"
    write_record(root, throughput("cpu-2", "2026-12-03T00:00:00Z", None))
    running = root / "cpu-2" / "accuracy"
    running.mkdir()
    (running / "accuracy.json").write_text('{"results": {"arc": 0.5}}\n')
    assert run_update(capsys, stored, root) == (0, "")
    assert "run `cpu-2`" in (stored / "0009-int8.md").read_text()


@pytest.mark.parametrize(
    ("plant", "named"),
    [
        ("evidence/README.md", "evidence/README.md"),
        ("evidence/nvidia-h200/notes.txt", "evidence/nvidia-h200/notes.txt"),
        ("evidence/nvidia-h200/throughput/notes.png.txt", "throughput/notes.png.txt"),
        ("evidence/Not_A_Class/throughput.json", "evidence/Not_A_Class"),
        ("evidence/cpu/orphan/x.png", "evidence/cpu/orphan"),
        ("evidence/.x.adrkit.tmp/", "evidence/.x.adrkit.tmp"),
        ("evidence/cpu/.y.adrkit.tmp/", "evidence/cpu/.y.adrkit.tmp"),
    ],
)
def test_anything_in_the_store_out_of_its_layout_is_an_error_naming_it(
    plant: str, named: str, stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = stored / plant
    if plant.endswith("/"):  # a folder with a temp file's name: not adrkit's
        path.mkdir()
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(PNG)
    _fails_naming(capsys, stored, tmp_path / "cpu", named)


def test_a_temp_named_folder_beside_the_adrs_is_left_alone(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = stored / ".0009-int8.md.x.adrkit.tmp"
    folder.mkdir()
    (folder / "kept").write_text("someone else's\n")
    stale_temp = stored / ".README.md.abc.adrkit.tmp"  # a dead writer's
    stale_temp.write_text("half written\n")
    assert run_update(capsys, stored, tmp_path / "cpu") == (0, "")
    assert (folder / "kept").read_text() == "someone else's\n"
    assert not stale_temp.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a folder whatever its permissions")
def test_a_store_folder_that_cannot_be_read_is_one_line(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = stored / "evidence" / "cpu"
    folder.chmod(0)
    try:
        _fails_naming(capsys, stored, tmp_path / "cpu", f"cannot list {folder}")
    finally:
        folder.chmod(0o755)


def test_a_stored_record_of_another_class_than_its_folder_is_an_error(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moved = stored / "evidence" / "cpu" / "throughput.json"
    shutil.copy(stored / "evidence" / "nvidia-h200" / "throughput.json", moved)
    _fails_naming(capsys, stored, tmp_path / "cpu", str(moved), "hardware class 'nvidia-h200'")


def test_a_record_whose_stage_is_not_its_file_name_is_an_error(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "renamed"
    written = write_record(results, throughput("cpu-3", "2026-12-03T00:00:00Z", None))
    written.rename(written.with_name("kernels.json"))
    _fails_naming(capsys, stored, results, "kernels.json is of stage 'throughput'")


def test_a_record_that_ends_in_the_future_cannot_pin_the_store(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "future"
    write_record(results, throughput("gpu-9", "9999-12-31T23:59:59Z", H200))
    before = tree_hashes(stored)
    code, err = run_update(capsys, stored, results, "--store", str(results))
    assert code == 2
    assert_one_line_error(err, "ends at 9999-12-31T23:59:59Z, after this machine's clock")
    assert tree_hashes(stored) == before


def test_a_run_folder_that_links_out_of_its_results_root_is_an_error(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere, root = tmp_path / "elsewhere", tmp_path / "root"
    with_figure(elsewhere, throughput("gpu-2", "2026-12-03T00:00:00Z", H200))
    root.mkdir()
    (root / "gpu-2").symlink_to(elsewhere / "gpu-2")
    _fails_naming(capsys, stored, root, str(root / "gpu-2"), "(a link)")


def test_an_accelerator_name_of_300_characters_is_a_class_within_file_name_limits(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long_name = {"accelerator": "Vendor Accelerator " + "X" * 300}
    results = tmp_path / "long"
    with_figure(results, throughput("long-1", "2026-12-03T00:00:00Z", long_name))
    assert run_update(capsys, stored, results, "--store", str(results)) == (0, "")
    (folder,) = [p for p in (stored / "evidence").iterdir() if p.name.startswith("vendor")]
    assert len(folder.name) <= 40
    assert (folder / "throughput" / FIGURE).read_bytes() == PNG + b"long-1"
    assert all(len(p.name) <= 255 - 30 for p in (stored / "assets").iterdir())
    assert run_update(capsys, stored, results, "--check") == (0, "")


def test_an_adr_over_one_mib_is_refused_as_design_promises(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "rows"
    record = throughput("rows-1", "2026-12-03T00:00:00Z", None)
    rows = [["decode", i] for i in range(150_000)]
    write_record(results, dataclasses.replace(record, tables={"kernels": Table(["op", "n"], rows)}))
    before = tree_hashes(stored)
    code, err = run_update(capsys, stored, results)
    assert code == 2
    assert_one_line_error(err, "0009-int8.md would be", "over the limit of 1048576")
    assert tree_hashes(stored) == before


def test_a_figure_of_a_class_no_record_shows_stays_whatever_its_name_reads_as(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `throughput-nvidia-h200-nvl-throughput-trend.png` also reads as class nvidia-h200's
    # figure `nvl-throughput-trend.png`, which no record names; it is the NVL class's.
    nvl = stored / "assets" / "throughput-nvidia-h200-nvl-throughput-trend.png"
    nvl.write_bytes(PNG + b"nvl")
    newer = tmp_path / "newer"
    write_record(newer, throughput("gpu-3", "2026-12-03T00:00:00Z", H200))  # drops the figure
    assert run_update(capsys, stored, newer, "--store", str(newer)) == (0, "")
    assert nvl.read_bytes() == PNG + b"nvl"
    assert not (stored / "assets" / f"throughput-nvidia-h200-{FIGURE}").exists()
    stored_record = json.loads(
        (stored / "evidence" / "nvidia-h200" / "throughput.json").read_text()
    )
    assert stored_record["provenance"]["run_id"] == "gpu-3"
