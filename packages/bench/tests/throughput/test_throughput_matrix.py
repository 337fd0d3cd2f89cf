"""The matrix file: the embedded default, expansion of lists, and one-line errors."""

from __future__ import annotations

import importlib
import itertools
from pathlib import Path

import pytest
import torch

from kvbench.throughput import MatrixError, load_matrix
from kvbench.throughput._kernels import moved_bytes
from kvbench.throughput._matrix import E2ECell, KernelCell, ServedStepCell, parse_matrix
from kvquant.served import STEPS

CONFIGS = Path(__file__).parents[2] / "configs"
# kvquant's benchmarks, beside kvbench in the monorepo: the scripts whose figures the GPU
# kernel matrix must reproduce.
KVQUANT_BENCHMARKS = Path(__file__).parents[3] / "kvquant" / "benchmarks"


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


@pytest.mark.skipif(not KVQUANT_BENCHMARKS.is_dir(), reason="kvquant's benchmarks are not here")
def test_the_gpu_kernel_matrix_times_the_shapes_kvquants_benchmarks_print(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As when they run from their folder: the scripts import the shapes they share (_shapes.py)
    # by module name.
    monkeypatch.syspath_prepend(str(KVQUANT_BENCHMARKS))
    shapes = importlib.import_module("_shapes")
    cache_write = importlib.import_module("benchmark_cache_write")
    decode = importlib.import_module("benchmark_decode_geometry")
    matrix = load_matrix(CONFIGS / "throughput-gpu-kernels.toml")
    cells = [cell for cell in matrix.cells if isinstance(cell, KernelCell)]
    steps = [cell for cell in matrix.cells if isinstance(cell, ServedStepCell)]
    # Kernels and served steps only: the run needs no vLLM engine.
    assert len(cells) + len(steps) == len(matrix.cells)
    # benchmark_served_step.py's table, ours and upstream's, INT8 and bf16, 32 layers.
    assert {(c.step, c.cache_dtype, c.impl, c.layers) for c in steps} == {
        (step.spec, cache, impl, 32)
        for step, cache, impl in itertools.product(STEPS, ("int8", "bfloat16"), ("kvquant", "vllm"))
    }
    assert all(c.shape == cells[0].shape for c in steps)
    # The served steps alone, for a GPU node whose time is short: the same cells.
    served = load_matrix(CONFIGS / "throughput-gpu-served.toml")
    assert served.cells == tuple(steps)
    s = cells[0].shape
    assert (s.num_q_heads, s.num_kv_heads, s.head_size, s.block_size) == (
        shapes.NUM_Q_HEADS,
        shapes.NUM_KV_HEADS,
        shapes.HEAD_SIZE,
        shapes.BLOCK_SIZE,
    )
    assert getattr(torch, s.model_dtype) == shapes.MODEL_DTYPE
    base = f"{shapes.NUM_Q_HEADS}/{shapes.NUM_KV_HEADS}x{shapes.HEAD_SIZE}"
    by_op: dict[str, set[tuple[str, int, int, int]]] = {}
    geometry_rows = set()
    for cell in cells:
        if cell.heads == base and (cell.batch, cell.context) not in decode.GEOMETRY_SHAPES:
            by_op.setdefault(cell.op, set()).add(
                (cell.cache_dtype, cell.batch, cell.context, cell.prefix)
            )
        else:
            assert cell.op == "decode" and cell.shape.block_size == shapes.BLOCK_SIZE
            geometry_rows.add((cell.cache_dtype, cell.heads, cell.batch, cell.context))
    caches = ("int8", "bfloat16")
    assert by_op["decode"] == {
        (cache, batch, context, 0)
        for cache, batch, context in itertools.product(caches, shapes.BATCHES, shapes.CONTEXTS)
    }
    # benchmark_decode_geometry.py's rows, each geometry at each of its shapes.
    assert geometry_rows == {
        (cache, f"{q}/{kv}x{head}", batch, context)
        for cache, (q, kv, head), (batch, context) in itertools.product(
            caches, decode.GEOMETRIES, decode.GEOMETRY_SHAPES
        )
    }
    assert by_op["prefill"] == {
        (cache, batch, cached + new, cached)
        for cache, (batch, cached, new) in itertools.product(caches, shapes.PREFILL_SHAPES)
    }
    assert by_op["cache_write"] == {(cache, 1, cache_write.NUM_TOKENS, 0) for cache in caches}
    # And the decode's GB/s counts the benchmark's bytes.
    # (Its rows count 2 x head bytes of INT8 codes and two fp32 scales per token and
    # kv head, 4 x head bytes for bf16.)
    for cell in cells:
        if cell.op == "decode" and cell.heads == base:
            expected = shapes.kv_bytes(cell.batch, cell.context, getattr(torch, cell.cache_dtype))
            assert moved_bytes(cell) == expected
        elif cell.op == "decode":
            per_token_head = 2 * cell.shape.head_size + (8 if cell.cache_dtype == "int8" else 0)
            if cell.cache_dtype != "int8":
                per_token_head *= 2
            tokens = cell.batch * cell.context * cell.shape.num_kv_heads
            assert moved_bytes(cell) == tokens * per_token_head


def test_a_prefix_belongs_to_a_prefill_and_leaves_it_new_tokens() -> None:
    with pytest.raises(MatrixError, match=r"`kernel\[0\].prefix` is 8; expected 0 for op 'decode'"):
        parse_matrix(
            "[[kernel]]\nop = 'decode'\ncache_dtype = 'int8'\nbatch = 1\ncontext = 16\n"
            "prefix = 8\n",
            "m.toml",
        )
    with pytest.raises(MatrixError, match=r"`kernel\[0\].prefix` is 16; expected less than"):
        parse_matrix(
            "[[kernel]]\nop = 'prefill'\ncache_dtype = 'int8'\nbatch = 1\ncontext = 16\n"
            "prefix = 16\n",
            "m.toml",
        )


def test_heads_give_a_cell_its_own_geometry_and_name() -> None:
    matrix = parse_matrix(
        "[kernel_shape]\nnum_q_heads = 32\nnum_kv_heads = 8\nhead_size = 128\n"
        "[[kernel]]\nop = 'decode'\ncache_dtype = 'int8'\nbatch = 4\ncontext = 64\n"
        "heads = ['', '32/1x128', '16/2x64']\n",
        "m.toml",
    )
    cells = [cell for cell in matrix.cells if isinstance(cell, KernelCell)]
    shapes = [(c.shape.num_q_heads, c.shape.num_kv_heads, c.shape.head_size) for c in cells]
    assert shapes == [(32, 8, 128), (32, 1, 128), (16, 2, 64)]
    assert [c.params()["heads"] for c in cells] == ["32/8x128", "32/1x128", "16/2x64"]
    assert "heads=32/1x128 " in cells[1].name and moved_bytes(cells[1]) * 8 == moved_bytes(cells[0])
    # The kernel_shape's own geometry named again is the same cell.
    with pytest.raises(MatrixError, match="declared twice"):
        parse_matrix(
            "[[kernel]]\nop = 'decode'\ncache_dtype = 'int8'\nbatch = 4\ncontext = 64\n"
            "heads = ['', '32/8x128']\n",
            "m.toml",
        )


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
        ("[engine]\ntimeout_s = -1\n", "`engine.timeout_s` is -1; expected a number > 0"),
        ("[engine]\ntimeout_s = 0\n", "`engine.timeout_s` is 0; expected a number > 0"),
        ("[engine]\ntimeout_s = inf\n", "`engine.timeout_s` is inf; expected a finite number"),
        ("[capacity]\nkv_budget_gib = 0\n", "`capacity.kv_budget_gib` is 0; expected a number > 0"),
        ("[capacity]\nblock_size = 0\n", "`capacity.block_size` is 0; expected a number > 0"),
        ("[kernel_shape]\ncpu_runs = 0\n", "`kernel_shape.cpu_runs` is 0; expected a number > 0"),
        ("[gates]\nmin_history = 0\n", "`gates.min_history` is 0; expected a number > 0"),
        ("[gates]\nmin_change = -0.1\n", "`gates.min_change` is -0.1; expected a number >= 0"),
        ("[gates]\nhistory_runs = 2\nmin_history = 3\n",
         "`gates.min_history` is 3 but `gates.history_runs` is 2, so no cell could ever be "
         "judged; expected at most 2"),
        ("[[kernel]]\nop = 'decode'\ncache_dtype = 'int8'\nbatch = [1, 0]\ncontext = 8\n",
         "`kernel[0].batch` is 0; expected a number > 0"),
        ("[[e2e]]\nbench = 'latency'\ninput_len = 8\noutput_len = 0\nbatch = 1\n",
         "`e2e[0].output_len` is 0; expected a number > 0"),
        ("[[e2e]]\nbench = 'latency'\ninput_len = 8\noutput_len = 4\nbatch = 1\niterations = 0\n",
         "`e2e[0].iterations` is 0; expected a number > 0"),
        ("[[kernel]]\nop = 'decode'\ncache_dtype = 'int8'\nbatch = 1\ncontext = 8\n"
         "heads = '32:8x128'\n",
         "`kernel[0].heads` is '32:8x128'; expected query heads / kv heads x head size"),
        ("[[kernel]]\nop = 'decode'\ncache_dtype = 'int8'\nbatch = 1\ncontext = 8\n"
         "heads = '30/4x128'\n",
         "`kernel[0].heads` is '30/4x128'; expected positive sizes and query heads a multiple"),
        ("[[kernel]]\nop = 'decode'\ncache_dtype = 'int8'\nbatch = 1\ncontext = 8\n"
         "heads = '8/0x128'\n",
         "`kernel[0].heads` is '8/0x128'; expected positive sizes"),
        ("name = [", "not valid TOML"),
    ],
)  # fmt: skip
def test_bad_matrix_is_one_line_naming_the_key(text: str, expected: str) -> None:
    with pytest.raises(MatrixError) as error:
        parse_matrix(text, "m.toml")
    message = str(error.value)
    assert expected in message
    assert message.startswith("m.toml") and "\n" not in message


def test_zero_is_kept_where_it_means_something() -> None:
    matrix = parse_matrix(
        "[gates]\nnoise_sigmas = 0\nmin_change = 0\n"
        "[[e2e]]\nbench = 'throughput'\ncompilation = 0\ninput_len = 8\noutput_len = 4\n"
        "batch = 1\n",
        "m.toml",
    )
    assert (matrix.gates.noise_sigmas, matrix.gates.min_change) == (0, 0)
    (cell,) = matrix.cells
    assert isinstance(cell, E2ECell) and cell.compilation == 0


def test_file_that_is_not_utf8_is_a_matrix_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes("# réglages\n".encode("latin-1"))
    with pytest.raises(MatrixError) as error:
        load_matrix(path)
    assert str(error.value) == f"{path}: the matrix file is not UTF-8 text"


def test_missing_file_is_a_matrix_error(tmp_path: Path) -> None:
    with pytest.raises(MatrixError, match="cannot read the matrix file"):
        load_matrix(tmp_path / "absent.toml")
