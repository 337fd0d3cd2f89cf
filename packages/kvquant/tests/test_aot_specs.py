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

from kvquant.ops import aot_specs

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


def test_specs_cover_every_parameter() -> None:
    specs = aot_specs(
        head_size=128,
        block_size=16,
        gqa=4,
        model_dtype=torch.bfloat16,
        cache_dtype=torch.int8,
        target="hip",
    )
    names = [spec.name for spec in specs]
    assert names == ["decode_attention", "reduce_splits", "prefill_attention", "cache_write"]
    for spec in specs:
        constexpr_names = {k for k, v in spec.signature.items() if v == "constexpr"}
        assert constexpr_names == set(spec.constexprs)
    decode = specs[0]
    assert decode.signature["k_ptr"] == "*i8" and decode.signature["q_ptr"] == "*bf16"
    cuda = aot_specs(
        head_size=128,
        block_size=16,
        gqa=4,
        model_dtype=torch.bfloat16,
        cache_dtype=torch.int8,
        target="cuda",
    )
    # One code path on every target: no inline assembly, the same specializations.
    assert [spec.constexprs for spec in cuda] == [spec.constexprs for spec in specs]
    # Only the register cap differs: CUDA's INT8 decode is held to 128 (4 programs per SM).
    assert [spec.maxnreg for spec in cuda] == [128, None, None, None]
    assert [spec.maxnreg for spec in specs] == [None] * 4


def test_one_compiled_variant_serves_every_gqa_ratio_up_to_16() -> None:
    """The group is a runtime argument: GQA 1, 4, 8 and 16 share every spec (one build cell)."""

    def specs(gqa: int) -> list[tuple[str, dict[str, object], dict[str, str]]]:
        return [
            (spec.name, spec.constexprs, spec.signature)
            for spec in aot_specs(
                head_size=128,
                block_size=16,
                gqa=gqa,
                model_dtype=torch.bfloat16,
                cache_dtype=torch.int8,
                target="hip",
            )
        ]

    assert specs(1) == specs(4) == specs(8) == specs(16)
    # Past 16 the query rows of one kv head no longer fit the decode tile: a wider variant.
    assert specs(32) != specs(16)


def test_bad_target_is_one_line_error() -> None:
    from kvquant import InvalidInputError

    with pytest.raises(InvalidInputError, match=r"^`target`"):
        aot_specs(
            head_size=64,
            block_size=16,
            gqa=1,
            model_dtype=torch.float16,
            cache_dtype=torch.int8,
            target="metal",
        )


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
        "decode_attention",
        "reduce_splits",
        "prefill_attention",
        "cache_write",
    ]
    assert all(size > 0 for _, _, size in compiled)
