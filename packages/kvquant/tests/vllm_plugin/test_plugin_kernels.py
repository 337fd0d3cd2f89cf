"""The plugin's kernel path against its reference path, on the same engine-shaped inputs, no vLLM.

The kernels run on CUDA when present, else in Triton's CPU interpreter: ``tests/conftest.py``
sets ``TRITON_INTERPRET=1`` at collection, before anything imports kvquant's kernel modules. The
reference path always runs on the CPU.
"""

from __future__ import annotations

import pytest
import torch

from kvquant.vllm_plugin import UnsupportedConfigError
from kvquant.vllm_plugin._kernels import (
    KERNELS_ENV,
    attend_with_kernels,
    check_kernel_dtype,
    describe_numerics,
    numerics_for,
    plan_kernel_batch,
    write_with_kernels,
)
from kvquant.vllm_plugin._serving import attend, cache_view, int8_content_bytes, write

HEADS, KV_HEADS, HEAD, BLOCK = 8, 2, 64, 16
BLOCKS_PER_SEQ = 5
# kvquant's kernel tolerance against its fp32 reference (relative L2 of fp32 attention outputs),
# and its tolerance for a 16-bit output (tests/test_decode_attention.py): the rounding to bf16
# alone adds about 2e-3 to each path.
MAX_REL_L2 = 2e-3
MAX_REL_L2_16_BIT_OUT = 1e-2


def _engine_tensor(num_blocks: int, device: torch.device) -> torch.Tensor:
    """What vLLM 0.32 binds to a layer for int8_per_token_head: int8 [blocks, H, N, C bytes]."""
    content = int8_content_bytes(HEAD)
    return torch.zeros(num_blocks, KV_HEADS, BLOCK, content, dtype=torch.int8, device=device)


def _slots(block_table: torch.Tensor, seq: int, positions: torch.Tensor) -> torch.Tensor:
    return block_table[seq].long()[positions // BLOCK] * BLOCK + positions % BLOCK


def _rel_l2(got: torch.Tensor, expected: torch.Tensor) -> float:
    got, expected = got.float().cpu(), expected.float().cpu()
    return float((got - expected).norm() / expected.norm())


# Three decodes, then a chunked prefill (24 new tokens after a 16-token prefix) and a whole prompt
# of 9: the order both vLLM runners give once the builder asks for it.
ORDERED = ([1, 1, 1, 24, 9], [33, 70, 17, 40, 9], 3)
# Not ordered: only the leading decode goes to the decode launch; the prefill kernel serves the
# later one-token requests too.
UNORDERED = ([1, 24, 1, 1, 9], [33, 40, 70, 17, 9], 1)


@pytest.mark.parametrize(
    ("dtype", "batch_lens", "window", "softcap"),
    [
        (torch.float16, ORDERED, None, None),
        (torch.bfloat16, ORDERED, 20, None),
        (torch.bfloat16, UNORDERED, None, None),
        (torch.float16, UNORDERED, None, 5.0),
    ],
)
def test_kernel_path_matches_reference_path_on_a_mixed_batch(
    device: torch.device,
    gen: torch.Generator,
    dtype: torch.dtype,
    batch_lens: tuple[list[int], list[int], int],
    window: int | None,
    softcap: float | None,
) -> None:
    query_lens, context_lens, decodes_first = batch_lens
    seq_lens = torch.tensor(context_lens)
    num_seqs = len(query_lens)
    num_blocks = num_seqs * BLOCKS_PER_SEQ + 3
    block_table = torch.randperm(num_blocks, generator=gen)[: num_seqs * BLOCKS_PER_SEQ]
    block_table = block_table.view(num_seqs, BLOCKS_PER_SEQ).int()

    # One engine step's write: every sequence's tokens up to its end (the prefix as well, which
    # earlier steps would have written), a padding token (slot -1) and rows past the slot mapping.
    per_seq = [_slots(block_table, i, torch.arange(n)) for i, n in enumerate(context_lens)]
    slots = torch.cat([*per_seq, torch.tensor([-1])])
    num_rows = len(slots) + 3
    key = (torch.randn(num_rows, KV_HEADS, HEAD, generator=gen) * 3).to(dtype)
    value = torch.randn(num_rows, KV_HEADS, HEAD, generator=gen).to(dtype)
    reference_engine = _engine_tensor(num_blocks, torch.device("cpu"))
    kernel_engine = _engine_tensor(num_blocks, device)
    reference_cache = cache_view(reference_engine, HEAD)
    kernel_cache = cache_view(kernel_engine, HEAD)
    write(reference_cache, key, value, slots)
    write_with_kernels(kernel_cache, key.to(device), value.to(device), slots.to(device))
    assert torch.equal(kernel_engine.cpu(), reference_engine)

    query_start_loc = torch.cat([torch.zeros(1, dtype=torch.int32), torch.tensor(query_lens)])
    query_start_loc = query_start_loc.cumsum(0).int()
    num_tokens = int(query_start_loc[-1])
    query = torch.randn(num_tokens + 2, HEADS, HEAD, generator=gen).to(dtype)  # 2 padded rows
    scale = HEAD**-0.5
    batch = plan_kernel_batch(
        query_start_loc,
        query_start_loc.to(device),
        seq_lens.int().to(device),
        block_table.to(device),
        max_seq_len=int(seq_lens.max()),
    )
    assert (batch.num_decodes, batch.num_tokens) == (decodes_first, num_tokens)
    rows = [slice(int(query_start_loc[i]), int(query_start_loc[i + 1])) for i in range(num_seqs)]

    def both_paths(out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        reference_out = torch.full(query.shape, torch.nan, dtype=out_dtype)
        attend(
            query,
            reference_cache,
            block_table,
            seq_lens,
            query_start_loc,
            scale,
            reference_out,
            window,
            softcap,
        )
        kernel_out = torch.full(query.shape, torch.nan, dtype=out_dtype, device=device)
        attend_with_kernels(
            query.to(device), kernel_cache, batch, scale, kernel_out, window, softcap
        )
        assert kernel_out[num_tokens:].isnan().all()  # padded rows are left alone
        return kernel_out[:num_tokens].cpu(), reference_out[:num_tokens]

    # fp32 outputs: the kernels' own error, against kvquant's kernel tolerance.
    kernel_out, reference_out = both_paths(torch.float32)
    print(f"kernel vs reference path, fp32 out: rel L2 {_rel_l2(kernel_out, reference_out):.2e}")
    for seq_rows in rows:  # per sequence: none hides behind the others' agreement
        assert _rel_l2(kernel_out[seq_rows], reference_out[seq_rows]) <= MAX_REL_L2
    # The model dtype, as the engine's output buffer is: each path rounds once more.
    kernel_out, reference_out = both_paths(dtype)
    error = _rel_l2(kernel_out, reference_out)
    print(f"kernel vs reference path, {dtype} out: rel L2 {error:.2e}")
    assert error <= MAX_REL_L2_16_BIT_OUT


def test_numerics_follow_the_tensors_device_and_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(KERNELS_ENV, raising=False)
    assert numerics_for(torch.device("cpu")) == "reference"
    assert numerics_for(torch.device("cuda", 0)) == "triton"
    monkeypatch.setenv(KERNELS_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert numerics_for(torch.device("cpu")) == "triton"
    assert describe_numerics("triton", "cpu") == (
        "kvquant's Triton kernels, in Triton's CPU interpreter"
    )
    assert describe_numerics("triton", "cuda") == "kvquant's Triton kernels"
    assert describe_numerics("reference", "cpu") == "kvquant's fp32 torch reference numerics"


def _one_line_refusal(error: pytest.ExceptionInfo[UnsupportedConfigError]) -> str:
    message = str(error.value)
    assert message.startswith("kvquant: ") and "\n" not in message
    return message


@pytest.mark.parametrize("value", ["1", "TRITON", "reference", "cuda"])
def test_other_values_of_the_kernel_switch_are_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(KERNELS_ENV, value)
    for device in (torch.device("cpu"), torch.device("cuda", 0)):
        with pytest.raises(UnsupportedConfigError) as error:
            numerics_for(device)
        assert f"{KERNELS_ENV}={value!r} is not understood" in _one_line_refusal(error)


def test_kernels_on_the_cpu_without_the_interpreter_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KERNELS_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(UnsupportedConfigError) as error:
        numerics_for(torch.device("cpu"))
    assert "set TRITON_INTERPRET=1" in _one_line_refusal(error)


def test_kernels_refuse_an_fp32_model() -> None:
    check_kernel_dtype(torch.bfloat16)
    check_kernel_dtype(torch.float16)
    with pytest.raises(UnsupportedConfigError) as error:
        check_kernel_dtype(torch.float32)
    assert "--dtype bfloat16" in _one_line_refusal(error)
