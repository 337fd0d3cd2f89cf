"""The matrix file: the embedded default, expansion of lists, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.throughput import MatrixError, load_matrix
from kvbench.throughput._matrix import E2ECell, parse_matrix

CONFIGS = Path(__file__).parents[2] / "configs"


def test_embedded_cpu_nightly_is_a_handful_of_vllm_cells() -> None:
    matrix = load_matrix()
    assert matrix.name == "cpu-nightly"
    assert 1 <= len(matrix.cells) <= 6
    assert all(isinstance(cell, E2ECell) and cell.block_size % 32 == 0 for cell in matrix.cells)


def test_gpu_matrix_parses_with_kernel_and_e2e_cells() -> None:
    matrix = load_matrix(CONFIGS / "throughput.toml")
    kinds = {cell.kind for cell in matrix.cells}
    assert kinds == {"kernel", "e2e"}
    assert len({cell.name for cell in matrix.cells}) == len(matrix.cells)


def test_lists_expand_to_their_product() -> None:
    matrix = parse_matrix(
        '[[e2e]]\nbench = "throughput"\nkv_cache_dtype = ["a", "b"]\nblock_size = [32, 64, 96]\n'
        'input_len = 8\noutput_len = 4\nbatch = 2\nextra_args = ["--x", "1"]\n',
        "m.toml",
    )
    assert len(matrix.cells) == 6
    assert all(
        cell.extra_args == ("--x", "1") for cell in matrix.cells if isinstance(cell, E2ECell)
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[gates]\nnoise_sigma = 3\n", "`gates.noise_sigma` is not a known key"),
        ("[[e2e]]\nbench = 'throughput'\ninput_len = 8\noutput_len = 4\n",
         "`e2e[0].batch` is missing"),
        ("[[kernel]]\nop = 'decode'\ncache_dtype = 'int8'\nbatch = '4'\ncontext = 8\n",
         "`kernel[0].batch` is '4'; expected a int"),
        ("[[kernel]]\nop = 'gemm'\ncache_dtype = 'int8'\nbatch = 1\ncontext = 8\n",
         "`kernel[0].op` is 'gemm'"),
        ("[engine]\ntimeout_s = -1\n", "expected a number >= 0"),
        ("name = [", "not valid TOML"),
    ],
)  # fmt: skip
def test_bad_matrix_is_one_line_naming_the_key(text: str, expected: str) -> None:
    with pytest.raises(MatrixError) as error:
        parse_matrix(text, "m.toml")
    message = str(error.value)
    assert expected in message
    assert message.startswith("m.toml") and "\n" not in message


def test_missing_file_is_a_matrix_error(tmp_path: Path) -> None:
    with pytest.raises(MatrixError, match="cannot read the matrix file"):
        load_matrix(tmp_path / "absent.toml")
