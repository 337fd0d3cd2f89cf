"""Every kernel spec of ``kvquant.ops.aot_specs`` compiles ahead of time for sm_90 and gfx90a.

The compile runs in a subprocess: this test session may have selected Triton's interpreter,
which replaces ``@triton.jit`` functions by objects that cannot be compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

from kvquant import PrefillConfig
from kvquant._cache import SUPPORTED_BLOCK_SIZES as BLOCKS
from kvquant._cache import SUPPORTED_HEAD_SIZES as SIZES
from kvquant.ops import KernelSpec, aot_specs
from kvquant.ops._common import make_spec
from kvquant.ops.prefill import prefill_spec

DECODES = ("decode_attention", "decode_attention_one_split")
WORKSPACE = ("prefill_bounds", "prefill_expand", "prefill_attention_expanded")

_COMPILE_ALL = """
import json, sys, torch, triton
from triton.backends.compiler import GPUTarget
from kvquant.ops import aot_specs

targets = {"cuda": GPUTarget("cuda", 90, 32), "hip": GPUTarget("hip", "gfx90a", 64)}
compiled = []
for name in sys.argv[1:]:
    target = targets[name]
    for spec in aot_specs(head_size=64, block_size=16, gqa=4, model_dtype=torch.float16,
                          cache_dtype=torch.int8, target=name):
        source = triton.compiler.ASTSource(spec.kernel, spec.signature, spec.constexprs)
        options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
        kernel = triton.compile(source, target=target, options=options)
        binary = kernel.asm["cubin" if name == "cuda" else "hsaco"]
        compiled.append([name, spec.name, len(binary)])
print(json.dumps(compiled))
"""


def _specs(**overrides: object) -> list[KernelSpec]:
    """``aot_specs`` of head 128, block 16, GQA 4, bf16 model, INT8 cache, gfx90a, but overrides."""
    geometry: dict[str, object] = {
        "head_size": 128,
        "block_size": 16,
        "gqa": 4,
        "model_dtype": torch.bfloat16,
        "cache_dtype": torch.int8,
        "target": "hip",
    }
    return aot_specs(**(geometry | overrides))  # type: ignore[arg-type]


def test_jit_may_not_specialize_an_integer_the_build_compiles_as_a_runtime_value() -> None:
    """A kernel whose plain integer argument the JIT could specialize (== 1, divisible by 16) is
    refused: the JIT would compile variants the build does not, and compile them mid-serving."""
    types = {"x_ptr": "*fp32", "n": "i32", "stride_x": "i64"}

    @triton.jit  # type: ignore[untyped-decorator]
    def specialized(x_ptr, n, stride_x):  # type: ignore[no-untyped-def]
        tl.store(x_ptr + n * stride_x, 0.0)

    with pytest.raises(AssertionError, match=r"\['n'\]"):
        make_spec("specialized", specialized, types, {}, num_warps=1, num_stages=1)

    @triton.jit(do_not_specialize=["n"])  # type: ignore[untyped-decorator]
    def unspecialized(x_ptr, n, stride_x):  # type: ignore[no-untyped-def]
        tl.store(x_ptr + n * stride_x, 0.0)

    spec = make_spec("unspecialized", unspecialized, types, {}, num_warps=1, num_stages=1)
    assert spec.aligned == ("x_ptr", "stride_x")


def test_launch_arguments_are_named_and_come_out_in_the_kernels_order() -> None:
    """`KernelSpec.arguments` takes each runtime parameter by name, in any order, and returns
    them as the kernel declares them; a launch that misses one or names another is refused."""
    reducer = _specs()[2]
    assert reducer.runtime_parameters == (
        "out_ptr", "partial_acc_ptr", "partial_max_ptr", "partial_sum_ptr", "num_splits",
        "head_size", "stride_o_t", "stride_o_h",
    )  # fmt: skip
    named = {name: index for index, name in enumerate(reducer.runtime_parameters)}
    assert reducer.arguments(**dict(reversed(named.items()))) == tuple(range(len(named)))
    renamed = {("splits" if name == "num_splits" else name): v for name, v in named.items()}
    with pytest.raises(TypeError, match=r"missing \['num_splits'\], unknown \['splits'\]$"):
        reducer.arguments(**renamed)


def test_specs_cover_every_parameter() -> None:
    specs = _specs()
    names = [spec.name for spec in specs]
    assert names == [
        "decode_attention",
        "decode_attention_one_split",
        "reduce_splits",
        "prefill_attention",
        *WORKSPACE,
        "cache_write",
    ]
    for spec in specs:
        constexpr_names = {k for k, v in spec.signature.items() if v == "constexpr"}
        assert constexpr_names == set(spec.constexprs)
    decode, one_split = specs[:2]
    assert decode.signature["k_ptr"] == "*i8" and decode.signature["q_ptr"] == "*i16"
    # The one-split variant differs only in its epilogue: the result instead of partials.
    assert decode.signature == one_split.signature
    assert {k for k, v in decode.constexprs.items() if one_split.constexprs[k] != v} == {
        "ONE_SPLIT"
    }
    cuda = _specs(target="cuda")
    by_name = {spec.name: (spec, hip) for spec, hip in zip(cuda, specs, strict=True)}
    # One code path on every target; only launch shapes differ, and how INT8 codes widen: on CUDA
    # one warp owns a decode program, with a 64-key tile and 8 query-head columns (the n8 integer
    # MMA); gfx90a's MFMA needs 16 columns, and it keeps 4 warps. The prefill's tiles are smaller
    # on gfx90a (2 waves per SIMD), and only CUDA widens codes by PTX. On gfx90a the host, not the
    # workspace's prefill, zeroes the bounds (a register the prefill cannot spare there).
    for name in ("reduce_splits", "prefill_bounds", "prefill_expand", "cache_write"):
        cuda_spec, hip_spec = by_name[name]
        assert cuda_spec.constexprs == hip_spec.constexprs, name
    for name, target_only in (
        ("prefill_attention", set()),
        ("prefill_attention_expanded", {"RESET_BOUNDS"}),
    ):
        cuda_prefill, hip_prefill = by_name[name]
        differs = {k for k, v in cuda_prefill.constexprs.items() if hip_prefill.constexprs[k] != v}
        assert differs == {"TILE_N", "WIDEN_PTX"} | target_only, name
    expanded_cuda, expanded_hip = by_name["prefill_attention_expanded"]
    assert expanded_cuda.constexprs["RESET_BOUNDS"] and not expanded_hip.constexprs["RESET_BOUNDS"]
    # The workspace is read as a 16-bit cache of 64-key pages, at the 16-bit prefill's shape.
    expanded, _ = by_name["prefill_attention_expanded"]
    assert expanded.signature["k_ptr"] == "*fp16" and expanded.signature["k_scale_ptr"] == "*i32"
    assert (expanded.constexprs["QUANTIZED"], expanded.constexprs["EXPANDED"]) == (False, True)
    # Its tiles lie in one workspace page (one block-table entry per tile), unless a launch
    # shape's tile is wider than the page.
    fused = by_name["prefill_attention"][0]
    assert expanded.constexprs["ONE_PAGE"] and not fused.constexprs["ONE_PAGE"]
    wide = prefill_spec(
        head_size=128, block_size=16, gqa=4, model_dtype=torch.bfloat16, cache_dtype=torch.int8,
        target="cuda", config=PrefillConfig(128, 128, 8, 2), expanded=True,
    )  # fmt: skip
    assert not wide.constexprs["ONE_PAGE"]
    # The fused INT8 prefill is not pipelined on either target; the 16-bit one takes two stages
    # on CUDA, and so does the prefill that reads the workspace.
    cuda_prefill, hip_prefill = by_name["prefill_attention"]
    assert (cuda_prefill.num_stages, hip_prefill.num_stages) == (1, 1)
    cuda_16bit = _specs(target="cuda", cache_dtype=torch.bfloat16)[3]
    assert cuda_16bit.num_stages == expanded.num_stages == 2
    for cuda_decode, hip_decode in zip(cuda[:2], specs[:2], strict=True):
        differs = {k for k, v in cuda_decode.constexprs.items() if hip_decode.constexprs[k] != v}
        assert differs == {"GROUP_PAD", "TILE_N"}
        assert (cuda_decode.constexprs["TILE_N"], cuda_decode.constexprs["GROUP_PAD"]) == (64, 8)
        assert (cuda_decode.num_warps, hip_decode.num_warps) == (1, 4)


def _compiled_variants(
    *,
    target: str = "hip",
    head_size: int = 128,
    block_size: int = 16,
    gqa: int = 4,
    model_dtype: torch.dtype = torch.bfloat16,
    cache_dtype: torch.dtype = torch.int8,
) -> dict[str, tuple[object, ...]]:
    """What decides each kernel's compiled binary, by kernel name."""
    if cache_dtype != torch.int8:
        cache_dtype = model_dtype
    specs = _specs(
        head_size=head_size,
        block_size=block_size,
        gqa=gqa,
        model_dtype=model_dtype,
        cache_dtype=cache_dtype,
        target=target,
    )
    return {
        spec.name: (spec.constexprs, spec.signature, spec.aligned, spec.num_warps, spec.num_stages)
        for spec in specs
    }


def test_one_compiled_variant_serves_every_gqa_ratio_up_to_the_decode_columns() -> None:
    """The group is a runtime argument: the ratios that pad to the decode's query-head columns
    share every spec (one build cell). gfx90a: 16 columns, wider groups pad further. CUDA: 8
    (the n8 integer MMA) up to GQA 8; INT8 groups of 9 to 16 and of 17 and more take the fp16
    P x V decode at 16 and 32 columns (a wider group split over programs of 32); the 16-bit
    decode keeps the whole group."""
    one, four, eight, sixteen = (_compiled_variants(gqa=g) for g in (1, 4, 8, 16))
    assert one == four == eight == sixteen
    assert _compiled_variants(gqa=32)["decode_attention"] != sixteen["decode_attention"]
    cuda = {g: _compiled_variants(gqa=g, target="cuda") for g in (1, 4, 7, 8, 9, 16, 24, 32, 64)}
    assert cuda[1] == cuda[4] == cuda[7] == cuda[8]
    assert cuda[9] == cuda[16] and cuda[24] == cuda[32] == cuda[64]
    for gqa, columns in ((8, 8), (16, 16), (32, 32)):
        constexprs = _specs(gqa=gqa, target="cuda")[0].constexprs
        assert (constexprs["USE_FP16_PV"], constexprs["GROUP_PAD"]) == (gqa > 8, columns)
    assert [k for k in cuda[8] if cuda[8][k] != cuda[16][k]] == list(DECODES)
    bf16 = [
        _compiled_variants(gqa=g, target="cuda", cache_dtype=torch.bfloat16)["decode_attention"]
        for g in (8, 16, 32)
    ]
    assert bf16[0] != bf16[1] != bf16[2]


def test_reducer_and_cache_write_serve_head_sizes_that_pad_alike() -> None:
    """Their head_size is a runtime argument: 80, 96 and 128 (padded to 128) share them; the
    attention kernels keep a compile-time head size (a runtime one cost the INT8 decode 7-11%)."""
    for cache_dtype in (torch.int8, torch.bfloat16):
        by_head = {h: _compiled_variants(head_size=h, cache_dtype=cache_dtype) for h in SIZES}
        for padded in (80, 96):
            differ = [k for k in by_head[128] if by_head[128][k] != by_head[padded][k]]
            workspace = WORKSPACE if cache_dtype == torch.int8 else ()
            assert differ == [*DECODES, "prefill_attention", *workspace]
        for kernel, variant in by_head[128].items():
            assert variant != by_head[64][kernel] and variant != by_head[256][kernel]


def test_int8_attention_serves_both_model_dtypes() -> None:
    """The INT8 kernels take the query and output as int16 bits: fp16 and bf16 share them."""
    int8 = [_compiled_variants(model_dtype=d) for d in (torch.float16, torch.bfloat16)]
    assert [k for k in int8[0] if int8[0][k] != int8[1][k]] == ["reduce_splits", "cache_write"]
    dense = [
        _compiled_variants(model_dtype=d, cache_dtype=d) for d in (torch.float16, torch.bfloat16)
    ]
    assert all(dense[0][k] != dense[1][k] for k in dense[0])


def test_one_compiled_variant_serves_every_block_size_but_int8_page_rows() -> None:
    """block_size is a runtime argument; only INT8 at block 16 loads V page by page."""
    bf16 = [_compiled_variants(block_size=b, cache_dtype=torch.bfloat16) for b in BLOCKS]
    assert bf16[0] == bf16[1] == bf16[2]
    int8 = [_compiled_variants(block_size=b) for b in BLOCKS]
    assert int8[1] == int8[2]
    # The workspace's pages are 64 keys whatever the cache's block size.
    assert [k for k in int8[0] if int8[0][k] != int8[1][k]] == [
        *DECODES,
        "prefill_attention",
        *WORKSPACE[:2],
    ]


def test_runtime_sizes_are_multiples_of_16_and_marked_so() -> None:
    """The JIT marks 16-divisible integers; the build must mark the same ones (and only them)."""
    assert all(size % 16 == 0 for size in (*SIZES, *BLOCKS))
    assert all(block & (block - 1) == 0 for block in BLOCKS)  # the cache write shifts
    specs = _specs(head_size=80, block_size=32, model_dtype=torch.float16, target="cuda")
    for spec in specs:
        for size in ("head_size", "block_size"):
            assert (size in spec.signature) == (size in spec.aligned), (spec.name, size)
        assert "block_shift" not in spec.aligned


def test_bad_target_is_one_line_error() -> None:
    from kvquant import InvalidInputError

    with pytest.raises(InvalidInputError, match=r"^`target`"):
        _specs(head_size=64, gqa=1, model_dtype=torch.float16, target="metal")


def test_every_spec_compiles_for_sm90_and_gfx90a() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    # One process per target, side by side: the two compiles take about 25 s each.
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _COMPILE_ALL, target],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for target in ("cuda", "hip")
    ]
    compiled = []
    for run in runs:
        stdout, stderr = run.communicate()
        assert run.returncode == 0, stderr[-3000:]
        compiled += json.loads(stdout.strip().splitlines()[-1])
    assert [name for _, name, _ in compiled] == 2 * [
        *DECODES,
        "reduce_splits",
        "prefill_attention",
        *WORKSPACE,
        "cache_write",
    ]
    assert all(size > 0 for _, _, size in compiled)


_COMPILE_FP16_PV = """
import json, sys, torch, triton
from triton.backends.compiler import GPUTarget
from kvquant.build._elf import verify_cubin
from kvquant.ops.decode import decode_spec

report = []
for head_size, block_size, gqa, one_split in json.loads(sys.argv[1]):
    spec = decode_spec(head_size=head_size, block_size=block_size, gqa=gqa,
                       model_dtype=torch.bfloat16, cache_dtype=torch.int8, target="cuda",
                       one_split=one_split)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(spec.signature)
             if n in spec.aligned}
    source = triton.compiler.ASTSource(spec.kernel, spec.signature, spec.constexprs, attrs)
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    found = verify_cubin(kernel.asm["cubin"], sm=90, kernel=kernel.metadata.name)
    report.append([head_size, block_size, gqa, one_split, spec.constexprs["USE_FP16_PV"], found])
print(json.dumps(report))
"""


def test_fp16_pv_decode_builds_for_sm90_without_a_stack_frame() -> None:
    """The fp16 P x V decode (INT8, GQA >= 16 on CUDA) at the shapes that hold the most
    registers: head 128 at 32 columns (both epilogues; at block 32, without page-wise V loads,
    its tile is halved) and head 256 at 16 and 32 columns (its own launch shapes,
    `_fp16_pv_shape`). The build matrix's GQA ratios (1, 4, 8) do not reach it. Two processes
    side by side, like the test above."""
    cells = [
        [[128, 16, 32, False], [128, 32, 32, False], [256, 16, 16, False]],
        [[128, 16, 32, True], [256, 16, 32, False]],
    ]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _COMPILE_FP16_PV, json.dumps(part)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for part in cells
    ]
    report = []
    for run in runs:
        stdout, stderr = run.communicate()
        assert run.returncode == 0, stderr[-3000:]
        report += json.loads(stdout.strip().splitlines()[-1])
    assert len(report) == 5
    for head_size, block_size, gqa, one_split, fp16_pv, found in report:
        cell = (head_size, block_size, gqa, one_split, found)
        assert fp16_pv and found["scratch_bytes"] == 0 and found["registers"] <= 255, cell


_LAUNCH_CONTRACT = """
import json, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import MockTensor, create_function_from_signature
from kvquant.ops import aot_specs
from kvquant.ops._common import _COMPILED_KERNEL_API, _constexprs_not_last, sample_arguments

backend = make_backend(GPUTarget("cuda", 90, 32))
report = {}
for spec in aot_specs(head_size=128, block_size=16, gqa=4, model_dtype=torch.bfloat16,
                      cache_dtype=torch.int8, target="cuda"):
    bind = create_function_from_signature(spec.kernel.signature, spec.kernel.params, backend)
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    samples = sample_arguments(spec)
    # A launch's arguments: 16-byte aligned tensors, aligned sizes (strides, head and block
    # size) multiples of 16, other integers anything, floats.
    real = []
    for name, kind in spec.signature.items():
        if kind.startswith("*"):
            real.append(torch.empty(64, dtype=samples[len(real)]))
        elif kind.startswith("fp"):
            real.append(0.5)
        elif kind != "constexpr":
            real.append(48 if name in spec.aligned else 3)
    bound, real_key, _ = bind(*real, **spec.constexprs, **options)
    _, sample_key, _ = bind(*map(MockTensor.wrap_dtype, samples), **spec.constexprs, **options)
    constexprs = [spec.constexprs[n] for n, k in spec.signature.items() if k == "constexpr"]
    report[spec.name] = {
        "jit_arguments_are_runtime_then_constexprs": list(bound.values()) == real + constexprs,
        "same_variant": str(real_key) == str(sample_key),
        "constexprs_last": not _constexprs_not_last(spec),
    }
spec = aot_specs(head_size=128, block_size=16, gqa=4, model_dtype=torch.bfloat16,
                 cache_dtype=torch.int8, target="cuda")[2]
source = triton.compiler.ASTSource(spec.kernel, spec.signature, spec.constexprs)
kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
report["compiled_kernel_api"] = [
    name for name in (*_COMPILED_KERNEL_API, "launch_metadata")
    if not (hasattr(type(kernel), name) or name in vars(kernel))
]
print(json.dumps(report))
"""


def test_compiled_launch_passes_what_the_jit_passes_for_the_variant_it_compiles() -> None:
    """`CompiledLaunch` (ops._common) skips the JIT's per-call binding: its arguments must be
    the JIT's own (every runtime argument in order, then the constexpr values), its variant the
    one the JIT picks for a real launch, and the compiled kernel must have the launcher API it
    uses. Checked with this Triton's own binder for CUDA (no GPU needed); the H200's Triton 3.6
    is checked by the GPU test that compares the two launch paths bit for bit."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    run = subprocess.run(
        [sys.executable, "-c", _LAUNCH_CONTRACT], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report.pop("compiled_kernel_api") == []
    assert set(report) == {
        *DECODES,
        "reduce_splits",
        "prefill_attention",
        *WORKSPACE,
        "cache_write",
    }
    for name, checks in report.items():
        assert all(checks.values()), (name, checks)
