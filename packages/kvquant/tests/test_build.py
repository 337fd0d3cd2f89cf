"""kvquant build: real compiles for gfx90a and sm90 of a small kernel, plus one kvquant kernel.

conftest.py turns on Triton's interpreter in this process, and a build needs compiled Triton; so
the builds run in subprocesses without TRITON_INTERPRET. This module is also their spec provider
(``specs = "test_build:aot_specs"``): head size 80 makes ``tl.arange`` fail, a real compile error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import triton
import triton.language as tl

from kvquant.build import (
    ArtifactError,
    BuildResult,
    MatrixFileError,
    cdna2_waves_per_simd,
    diff_manifests,
    format_report,
    load_matrix,
    parse_matrix,
    verify_cubin,
    verify_hsaco,
)
from kvquant.ops._common import KernelSpec, make_spec


@triton.jit(do_not_specialize=["n"])  # type: ignore[untyped-decorator]  # untyped by nature
def _scaled_copy_kernel(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    values = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tl.store(y_ptr + offsets, (values.to(tl.float32) * scale).to(values.dtype), mask=offsets < n)


def aot_specs(
    *, head_size: int, block_size: int, gqa: int, model_dtype: Any, cache_dtype: Any, target: str
) -> list[KernelSpec]:
    """The test provider: one copy kernel per head size (BLOCK = head size; 80 cannot compile)."""
    types = {"x_ptr": "*fp16", "y_ptr": "*fp16", "n": "i32", "scale": "fp32"}
    return [make_spec("scaled_copy", _scaled_copy_kernel, types, {"BLOCK": head_size},
                      num_warps=4, num_stages=1)]  # fmt: skip


_TEST_MATRIX = """
specs = "test_build:aot_specs"
[axes]
head_size = [64, 80]
block_size = [16]
gqa = [1]
model_dtype = ["fp16"]
cache_dtype = ["auto"]
[gates]
max_vgpr_spills = 0
min_waves_per_simd = 9   # above gfx90a's 8: must fail
"""
_KVQUANT_MATRIX = """
[axes]
head_size = [128]
block_size = [16]
gqa = [4]
model_dtype = ["bf16"]
cache_dtype = ["int8"]
kernels = ["reduce_splits"]
"""
# Runs in the subprocess: cold build (2 processes), warm rebuild diffed against the cold one,
# and one real kvquant kernel.
_SCRIPT = """
import json, sys
from pathlib import Path
from kvquant.build import build
root = Path(sys.argv[1])
cache = root / "cache"
cold = build(["gfx90a", "sm90"], root / "test.toml", out=root / "cold", cache_dir=cache, jobs=2)
warm = build(["sm90", "gfx90a"], root / "test.toml", out=root / "warm", cache_dir=cache,
             previous=root / "cold")
real = build(None, root / "kvquant.toml", out=root / "real", cache_dir=cache, jobs=1)
print(json.dumps({"cold": cold.to_dict(), "warm": warm.to_dict(), "real": real.to_dict()}))
"""


def _compiled_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                      env.get("PYTHONPATH")]))  # fmt: skip
    env["TRITON_CACHE_DIR"] = str(tmp / "triton")  # a cold compile, whatever ran before
    return env


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("build")
    (root / "test.toml").write_text(_TEST_MATRIX)
    (root / "kvquant.toml").write_text(_KVQUANT_MATRIX)
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(root)],
        env=_compiled_env(root), capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["root"] = root
    return result


def _cells(result: dict[str, Any], status: str) -> list[dict[str, Any]]:
    return [c for c in result["cells"] if c["status"] == status]


def test_failing_cell_is_reported_and_the_others_build(builds: dict[str, Any]) -> None:
    cold = builds["cold"]
    assert len(cold["cells"]) == 4  # 2 head sizes x 2 targets
    assert {
        (f["target"], f["specialization"]["constexprs"]["BLOCK"]) for f in cold["failures"]
    } == {
        ("gfx90a", 80),
        ("sm90", 80),
    }
    assert all("power of 2" in f["error"] for f in cold["failures"]), cold["failures"][0]["error"]
    manifest = json.loads(Path(cold["manifest"]).read_text())
    assert [c["status"] for c in manifest["cells"]].count("failed") == 2
    for cell in _cells(cold, "ok"):
        for artifact in cell["artifacts"].values():
            path = builds["root"] / "cold" / artifact["path"]
            assert path.stat().st_size == artifact["bytes"] > 0


def test_gates_in_the_matrix_are_applied(builds: dict[str, Any]) -> None:
    gates = {g["name"]: g for g in builds["cold"]["gates"]}
    assert gates["max_vgpr_spills"]["passed"] and gates["max_vgpr_spills"]["value"] == 0
    assert not gates["min_waves_per_simd"]["passed"]
    assert gates["min_waves_per_simd"]["value"] == 8  # only the gfx90a cell has occupancy


def test_warm_rebuild_comes_from_the_cache(builds: dict[str, Any]) -> None:
    cold, warm = builds["cold"], builds["warm"]
    assert cold["cached"] == 0
    assert warm["cached"] == 2  # the two cells that compiled; failures are retried
    warm_cells = {c["cache_key"]: c for c in _cells(warm, "ok")}
    assert warm_cells.keys() == {c["cache_key"] for c in _cells(cold, "ok")}
    for before in _cells(cold, "ok"):
        after = warm_cells[before["cache_key"]]
        for kind, artifact in before["artifacts"].items():
            old = (builds["root"] / "cold" / artifact["path"]).read_bytes()
            assert old == (builds["root"] / "warm" / after["artifacts"][kind]["path"]).read_bytes()
    assert warm["diff"] == []  # same resources
    assert warm["compared_with"] == str(builds["root"] / "cold" / "manifest.json")
    report = format_report(BuildResult.from_dict(warm))
    assert f"no resource use changed against {warm['compared_with']}" in report
    assert cold["compared_with"] is None
    # Nothing was compared: nothing said.
    assert "against" not in format_report(BuildResult.from_dict(cold))


def test_cache_key_changes_with_the_specialization(builds: dict[str, Any]) -> None:
    ok = {c["target"]: c for c in _cells(builds["cold"], "ok")}
    keys = {c["cache_key"] for c in builds["cold"]["cells"]}
    assert len(keys) == 4
    assert ok["gfx90a"]["source_hash"] == ok["sm90"]["source_hash"]
    assert ok["gfx90a"]["triton_version"] == triton.__version__


def test_manifest_entry_of_gfx90a(builds: dict[str, Any]) -> None:
    (cell,) = [c for c in _cells(builds["cold"], "ok") if c["target"] == "gfx90a"]
    assert cell["code_object_version"] in (4, 5, 6)
    assert cell["vgprs"] > 0 and cell["sgprs"] > 0 and cell["spill_bytes"] == 0
    assert cell["waves_per_simd"] == cdna2_waves_per_simd(
        vgprs=cell["vgprs"], agprs=cell["agprs"], sgprs=cell["sgprs"],
        lds_bytes=cell["lds_bytes"], num_warps=cell["specialization"]["num_warps"],
    )  # fmt: skip
    # The compiler's own figure ignores LDS (Triton allocates it dynamically): never lower.
    assert cell["waves_per_simd"] <= cell["compiler_occupancy"]


def test_real_kvquant_kernel_builds_for_gfx90a(builds: dict[str, Any]) -> None:
    real = builds["real"]
    assert real["failures"] == []
    (cell,) = real["cells"]
    assert (cell["kernel"], cell["target"]) == ("reduce_splits", "gfx90a")
    assert cell["axes"] == [
        {"head_size": 128, "block_size": 16, "gqa": 4, "model_dtype": "bf16", "cache_dtype": "int8"}
    ]
    hsaco = builds["root"] / "real" / cell["artifacts"]["hsaco"]["path"]
    verify_hsaco(hsaco.read_bytes(), arch="gfx90a", kernel=cell["symbol"])


def _artifact(builds: dict[str, Any], target: str, kind: str) -> tuple[bytes, str]:
    (cell,) = [c for c in _cells(builds["cold"], "ok") if c["target"] == target]
    return (builds["root"] / "cold" / cell["artifacts"][kind]["path"]).read_bytes(), cell["symbol"]


def test_hsaco_verification_rejects_wrong_objects(builds: dict[str, Any]) -> None:
    hsaco, symbol = _artifact(builds, "gfx90a", "hsaco")
    checked = verify_hsaco(hsaco, arch="gfx90a", kernel=symbol)
    assert checked["kernel_metadata"][".name"] == symbol
    with pytest.raises(ArtifactError, match=f"expected '{symbol}'"):
        verify_hsaco(hsaco.replace(symbol.encode(), b"_" * len(symbol)), arch="gfx90a",
                     kernel=symbol)  # fmt: skip
    wrong_mach = bytearray(hsaco)
    wrong_mach[48] = 0x30  # e_flags: EF_AMDGPU_MACH of gfx1030
    with pytest.raises(ArtifactError, match="machine 0x030"):
        verify_hsaco(bytes(wrong_mach), arch="gfx90a", kernel=symbol)
    cubin, _ = _artifact(builds, "sm90", "cubin")
    with pytest.raises(ArtifactError, match="e_machine 190"):
        verify_hsaco(cubin, arch="gfx90a", kernel=symbol)
    with pytest.raises(ArtifactError, match="not an ELF64"):
        verify_hsaco(b"\x7fELF" + bytes(10), arch="gfx90a", kernel=symbol)


def test_cubin_verification(builds: dict[str, Any]) -> None:
    cubin, symbol = _artifact(builds, "sm90", "cubin")
    assert verify_cubin(cubin, sm=90, kernel=symbol)["registers"] > 0
    with pytest.raises(ArtifactError, match="expected sm_80"):
        verify_cubin(cubin, sm=80, kernel=symbol)
    hsaco, _ = _artifact(builds, "gfx90a", "hsaco")
    with pytest.raises(ArtifactError, match="expected NVIDIA"):
        verify_cubin(hsaco, sm=90, kernel=symbol)


def test_diff_against_a_changed_manifest(builds: dict[str, Any]) -> None:
    new = json.loads(Path(builds["warm"]["manifest"]).read_text())
    old = json.loads(json.dumps(new))
    (cell,) = [c for c in old["cells"] if c["target"] == "gfx90a" and c["status"] == "ok"]
    cell["vgprs"] += 8
    dropped = old["cells"].pop()
    rows = diff_manifests(old, new)
    assert {"kernel": cell["kernel"], "specialization": cell["specialization"],
            "target": "gfx90a", "field": "vgprs", "old": cell["vgprs"],
            "new": cell["vgprs"] - 8} in rows  # fmt: skip
    assert {(r["target"], r["field"], r["old"], r["new"]) for r in rows} >= {
        (dropped["target"], "cell", "absent", "present")
    }
    assert len(rows) == 2


def test_cli_exit_code_and_report(builds: dict[str, Any]) -> None:
    root = builds["root"]
    done = subprocess.run(
        [sys.executable, "-m", "kvquant", "build", "--target", "gfx90a", "--matrix",
         str(root / "test.toml"), "--out", str(root / "cli")],
        env={**_compiled_env(root), "KVQUANT_BUILD_CACHE": str(root / "cache")},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "FAILED gfx90a scaled_copy [BLOCK=80]" in done.stdout
    assert "gate FAIL min_waves_per_simd: worst 8 >= 9" in done.stdout
    assert json.loads((root / "cli" / "manifest.json").read_text())["targets"] == ["gfx90a"]


# ---- Occupancy: hand-computed gfx90a values ----
@pytest.mark.parametrize(
    ("vgprs", "agprs", "sgprs", "lds", "warps", "waves"),
    [
        (31, 0, 55, 1024, 4, 8),  # 32 regs: 512 // 32 = 16, capped at 8
        (65, 0, 100, 2048, 4, 7),  # 65 -> 72 allocated: 512 // 72 = 7
        (61, 3, 40, 0, 4, 7),  # AGPRs start at align(61, 4) = 64: 67 -> 72: 7 (not 64: 8)
        (256, 146, 100, 32768, 4, 1),  # 402 -> 408: 1; LDS would allow 2 workgroups
        (128, 0, 40, 0, 4, 4),  # 512 // 128 = 4
        (129, 0, 40, 0, 4, 3),  # 129 -> 136: 3
        (24, 0, 102, 0, 4, 7),  # more than 100 SGPRs: at most 7
        (32, 0, 32, 40000, 4, 1),  # LDS 40000 -> 40448: one workgroup of 4 waves per CU
        (64, 0, 32, 16384, 8, 8),  # 4 workgroups of 8 waves: 2 per SIMD each -> 8
        (64, 0, 32, 20000, 8, 6),  # 20000 -> 20480: 3 workgroups of 8 waves -> 6 per SIMD
        (300, 0, 32, 0, 8, 0),  # 304: 1 wave per SIMD; a workgroup of 8 needs 2: no fit
        (16, 0, 16, 70000, 4, 0),  # LDS above 64 KiB: does not fit
        (16, 0, 16, 0, 1, 8),  # single-wave workgroups: 32 per CU -> 8 per SIMD
    ],
)
def test_cdna2_occupancy_by_hand(
    vgprs: int, agprs: int, sgprs: int, lds: int, warps: int, waves: int
) -> None:
    assert (
        cdna2_waves_per_simd(vgprs=vgprs, agprs=agprs, sgprs=sgprs, lds_bytes=lds, num_warps=warps)
        == waves
    )


# ---- Matrix files and bad input ----
def test_default_matrix_covers_the_served_shapes() -> None:
    matrix = load_matrix(None)
    assert (matrix.head_size, matrix.block_size) == ((64, 80, 96, 128, 256), (16, 32, 64))
    assert set(matrix.model_dtype) == {"fp16", "bf16"}
    assert set(matrix.cache_dtype) == {"int8", "auto"}
    assert len(matrix.points()) == 5 * 3 * len(matrix.gqa) * 2 * 2
    assert matrix.specs == "kvquant.ops:aot_specs" and matrix.gates["max_vgpr_spills"] == 0
    # The gfx90a target's Triton, with where it is stated: the fork's base's ROCm requirements.
    assert matrix.target_triton == "3.6.0"
    assert str(matrix.target_triton_source).startswith("vLLM 0.18.1 requirements/rocm-build.txt")


def test_a_matrix_without_a_triton_table_takes_the_defaults_target(tmp_path: Path) -> None:
    path = tmp_path / "one.toml"
    path.write_text(_ONE_CELL_MATRIX)
    assert load_matrix(path).target_triton == load_matrix(None).target_triton
    path.write_text(_ONE_CELL_MATRIX + "\n[triton]\ntarget = '3.9.0'\nsource = 'the team'\n")
    assert (load_matrix(path).target_triton, load_matrix(path).target_triton_source) == (
        "3.9.0",
        "the team",
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[axes]\nhead_size = [64]\nblock_size=[16]\ngqa=[1]\nmodel_dtype=['fp8']\n"
         "cache_dtype=['int8']", r"`axes.model_dtype` is \['fp8'\]"),
        ("[axes]\nhead_sizes = [64]", r"unknown keys \['head_sizes'\] in `\[axes\]`"),
        ("[gates]\nmin_occupancy = 2\n[axes]", "expected keys from"),
        ("specs = 'kvquant.ops'\n[axes]", "expected 'module:function'"),
        ("[axes\n", "not valid TOML"),
        ("[triton]\ntarget = '3.6'\nsource = 'x'\n[axes]", "expected a release `target`"),
        ("[triton]\ntarget = '3.6.0'\n[axes]", "and the `source` that states it"),
    ],
)  # fmt: skip
def test_bad_matrix_is_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(MatrixFileError, match=message) as caught:
        parse_matrix(text, "m.toml")
    assert "\n" not in str(caught.value)


def test_cli_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvquant.__main__ import main

    assert main(["build", "--target", "gfx1100", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "error: unknown target 'gfx1100'; supported: gfx90a, sm90\n"
    assert main(["build", "--matrix", str(tmp_path / "none.toml"), "--out", str(tmp_path)]) == 2
    assert "No such file" in capsys.readouterr().err
    if os.environ.get("TRITON_INTERPRET") == "1":  # set by conftest.py where there is no GPU
        # The build compiles for real targets: under the interpreter it refuses, saying why.
        assert main(["build", "--out", str(tmp_path)]) == 2
        assert "TRITON_INTERPRET" in capsys.readouterr().err


def test_matrix_that_is_not_utf8_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvquant.__main__ import main

    matrix = tmp_path / "latin1.toml"
    matrix.write_bytes(_ONE_CELL_MATRIX.replace("[axes]", "# r\xe9glage\n[axes]").encode("latin-1"))
    with pytest.raises(MatrixFileError, match=r"latin1\.toml is not UTF-8 text$"):
        load_matrix(matrix)
    assert main(["build", "--matrix", str(matrix), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"error: matrix file {matrix} is not UTF-8 text\n"
    assert not (tmp_path / "out").exists()


# ---- Bad --out and --previous: refused before anything is planned or compiled ----
_ONE_CELL_MATRIX = """
specs = "test_build:aot_specs"
[axes]
head_size = [64]
block_size = [16]
gqa = [1]
model_dtype = ["fp16"]
cache_dtype = ["auto"]
"""
# Runs in the subprocess, with compiled Triton: each bad input through the CLI, its exit code,
# its stderr, and the exception if one escaped (a traceback for the user).
_BAD_INPUT_SCRIPT = """
import contextlib, io, json, sys
from pathlib import Path
from kvquant.__main__ import main
root = Path(sys.argv[1])
cases = json.loads(sys.argv[2])
report = {}
for name, argv in cases.items():
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            report[name] = {"rc": main(argv), "err": err.getvalue()}
    except Exception as error:
        report[name] = {"rc": None, "err": err.getvalue(), "exception": repr(error)}
print(json.dumps(report))
"""
_PREVIOUS = {
    "list": "[1]",
    "cells_number": '{"cells": 5}',
    "check_json": '{"device": "cpu", "passed": true, "cases": [], "edge_cases": []}',
    "cell_without_kernel": '{"cells": [{"target": "gfx90a"}]}',
    "cell_with_a_string_specialization": (
        '{"cells": [{"kernel": "k", "specialization": "x", "target": "gfx90a"}]}'
    ),
}


@pytest.fixture(scope="module")
def bad_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("bad_build")
    (root / "one.toml").write_text(_ONE_CELL_MATRIX)
    (root / "a_file").write_text("keep me\n")
    base = ["build", "--matrix", str(root / "one.toml")]
    cases = {"out_is_a_file": [*base, "--out", str(root / "a_file")],
             "out_below_a_file": [*base, "--out", str(root / "a_file" / "out")]}  # fmt: skip
    for name, text in _PREVIOUS.items():
        (root / f"{name}.json").write_text(text)
        cases[f"previous_{name}"] = [*base, "--previous", str(root / f"{name}.json"),
                                     "--out", str(root / f"out_{name}")]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", _BAD_INPUT_SCRIPT, str(root), json.dumps(cases)],
        env={**_compiled_env(root), "KVQUANT_BUILD_CACHE": str(root / "cache")},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["root"] = root
    return result


def _refused(report: dict[str, Any], message: str) -> None:
    assert report["rc"] == 2, report
    assert report["err"] == f"error: {message}\n"


def test_build_refuses_out_that_is_a_file_before_compiling(bad_builds: dict[str, Any]) -> None:
    root = bad_builds["root"]
    _refused(bad_builds["out_is_a_file"], f"`out` {root / 'a_file'} is a file; expected a folder")
    _refused(
        bad_builds["out_below_a_file"],
        f"`out` {root / 'a_file' / 'out'} cannot be created: {root / 'a_file'} is a file, not a "
        "folder",
    )
    assert (root / "a_file").read_text() == "keep me\n"
    # The plan is cached before any compile: no cache at all means nothing was compiled.
    assert not (root / "cache").exists()


@pytest.mark.parametrize(
    ("name", "found"),
    [
        ("list", " is a list"),
        ("cells_number", ": `cells` is a number"),
        ("check_json", " has no `cells`"),
    ],
)
def test_build_refuses_previous_of_the_wrong_shape_before_compiling(
    bad_builds: dict[str, Any], name: str, found: str
) -> None:
    root = bad_builds["root"]
    expected = "expected a kvquant build manifest.json (an object with a `cells` list)"
    _refused(
        bad_builds[f"previous_{name}"], f"previous manifest {root / name}.json{found}; {expected}"
    )
    assert not (root / f"out_{name}").exists()
    assert not (root / "cache").exists()


@pytest.mark.parametrize("name", ["cell_without_kernel", "cell_with_a_string_specialization"])
def test_build_refuses_previous_cell_that_is_not_a_manifest_cell(
    bad_builds: dict[str, Any], name: str
) -> None:
    root = bad_builds["root"]
    _refused(
        bad_builds[f"previous_{name}"],
        f"previous manifest {root / name}.json: `cells[0]` is not a manifest cell; expected an "
        "object with kernel and target strings and a specialization with constexprs",
    )
    assert not (root / "cache").exists()
