"""The plugin's kernel path against its reference path, on the same engine-shaped inputs, no vLLM.

The kernels run on CUDA when present, else in Triton's CPU interpreter: ``tests/conftest.py``
sets ``TRITON_INTERPRET=1`` at collection, before anything imports kvquant's kernel modules. The
reference path always runs on the CPU.
"""

from __future__ import annotations

import pytest
import torch

from kvquant import AttentionGeometry, PrefillScratch
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

from conftest import require_cuda

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
    geometry = AttentionGeometry(HEADS, KV_HEADS, HEAD, BLOCK, dtype, torch.int8)
    batch = plan_kernel_batch(
        geometry,
        query_start_loc,
        seq_lens,
        seq_lens.int().to(device),
        block_table.to(device),
        max_seq_len=int(seq_lens.max()),
        sliding_window=window,
        prefill_scratch=PrefillScratch(
            num_kv_heads=KV_HEADS, head_size=HEAD, capacity=16, device=device
        ),
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


# A step of each kind (query lengths, sequence lengths): decodes only, prefills only (a chunk
# after a prefix and whole prompts), decodes first then prefills, and not ordered.
STEPS = {
    "decodes": ([1, 1, 1, 1], [33, 70, 17, 80]),
    "prefills": ([24, 9, 30], [40, 9, 75]),
    "mixed": ([1, 1, 1, 24, 9], [33, 70, 17, 40, 9]),
    "unordered": ([1, 24, 1, 1, 9], [33, 40, 70, 17, 9]),
}


def _engine_step(
    query_lens: list[int],
    context_lens: list[int],
    layers: int,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """(query_start_loc, seq_lens, block_table, each layer's engine tensor written up to every
    sequence's end, query): one step of an engine with ``layers`` INT8 layers, on the host but
    the engine tensors, which are on ``device``."""
    num_seqs = len(query_lens)
    num_blocks = num_seqs * BLOCKS_PER_SEQ + 3
    block_table = torch.randperm(num_blocks, generator=gen)[: num_seqs * BLOCKS_PER_SEQ]
    block_table = block_table.view(num_seqs, BLOCKS_PER_SEQ).int()
    slots = torch.cat(
        [_slots(block_table, i, torch.arange(n)) for i, n in enumerate(context_lens)]
    ).to(device)
    engines = []
    for _ in range(layers):
        engine = _engine_tensor(num_blocks, device)
        key = (torch.randn(len(slots), KV_HEADS, HEAD, generator=gen) * 3).to(device, dtype)
        value = torch.randn(len(slots), KV_HEADS, HEAD, generator=gen).to(device, dtype)
        write_with_kernels(cache_view(engine, HEAD), key, value, slots)
        engines.append(engine)
    starts = torch.tensor([0, *query_lens]).cumsum(0).int()
    query = torch.randn(int(starts[-1]), HEADS, HEAD, generator=gen).to(device, dtype)
    return starts, torch.tensor(context_lens).int(), block_table, engines, query


@pytest.mark.parametrize("kind", STEPS)
@pytest.mark.parametrize("window", [None, 20])
def test_one_plan_per_step_gives_the_per_layer_calls_bits(
    kind: str, window: int | None, device: torch.device, gen: torch.Generator
) -> None:
    """Three layers of one step through one plan (`plan_kernel_batch`, then `attend_with_kernels`
    per layer) give, bit for bit, what each layer's own checked calls give: `decode_attention`
    for the leading decodes and `prefill_attention` for the rest, as the layers called them
    before the step was planned once."""
    from kvquant import decode_attention, prefill_attention

    query_lens, context_lens = STEPS[kind]
    dtype = torch.bfloat16
    starts, seq_lens, table, engines, query = _engine_step(
        query_lens, context_lens, 3, dtype, device, gen
    )
    max_seq_len = int(seq_lens.max())
    batch = plan_kernel_batch(
        AttentionGeometry(HEADS, KV_HEADS, HEAD, BLOCK, dtype, torch.int8),
        starts,
        seq_lens,
        seq_lens.to(device),
        table.to(device),
        max_seq_len=max_seq_len,
        sliding_window=window,
        prefill_scratch=PrefillScratch(
            num_kv_heads=KV_HEADS, head_size=HEAD, capacity=16, device=device
        ),
    )
    decodes, tokens = batch.num_decodes, batch.num_tokens
    scale = HEAD**-0.5
    for engine in engines:
        cache = cache_view(engine, HEAD)
        stepped = torch.full(query.shape, torch.nan, dtype=dtype, device=device)
        attend_with_kernels(query, cache, batch, scale, stepped, window)
        called = torch.full_like(stepped, torch.nan)
        if decodes:
            decode_attention(
                query[:decodes], cache, table[:decodes].to(device),
                seq_lens[:decodes].to(device), scale, sliding_window=window,
                out=called[:decodes], max_seq_len=max_seq_len,
            )  # fmt: skip
        if tokens > decodes:
            prefill_attention(
                query[decodes:tokens], cache, table[decodes:].to(device),
                seq_lens[decodes:].to(device), (starts[decodes:] - decodes).to(device), scale,
                sliding_window=window, out=called[decodes:tokens],
            )  # fmt: skip
        assert not stepped.isnan().any()
        assert torch.equal(stepped, called)


@pytest.mark.gpu
@require_cuda()
def test_a_mixed_step_waits_for_nothing_and_allocates_nothing_in_its_layers_gpu(
    gen: torch.Generator,
) -> None:
    """The step's build (`plan_kernel_batch`, which the builder calls with the engine's host
    copies) and then every layer's cache write and attention, under torch's sync debug mode set
    to "error": no call that waits for the device. The layers allocate nothing
    (`torch.cuda.memory_stats`, which sees what the sync mode does not). Then the step again,
    eagerly checked against each layer's own calls."""
    device = torch.device("cuda")
    query_lens, context_lens = STEPS["mixed"]
    dtype = torch.bfloat16
    starts, seq_lens, table, engines, query = _engine_step(
        query_lens, context_lens, 4, dtype, device, gen
    )
    slots = torch.cat(
        [
            _slots(table, i, torch.arange(n - q, n))
            for i, (q, n) in enumerate(zip(query_lens, context_lens, strict=True))
        ]
    ).to(device)
    new_keys = torch.randn(len(slots), KV_HEADS, HEAD, generator=gen).to(device, dtype)
    device_lens, device_table = seq_lens.to(device), table.to(device)
    scratch = PrefillScratch(num_kv_heads=KV_HEADS, head_size=HEAD, capacity=16, device=device)
    out = torch.empty(query.shape, dtype=dtype, device=device)

    def step() -> None:
        batch = plan_kernel_batch(
            AttentionGeometry(HEADS, KV_HEADS, HEAD, BLOCK, dtype, torch.int8),
            starts, seq_lens, device_lens, device_table, max_seq_len=int(seq_lens.max()),
            prefill_scratch=scratch,
        )  # fmt: skip
        before = torch.cuda.memory_stats()["allocation.all.allocated"]
        for engine in engines:
            cache = cache_view(engine, HEAD)
            write_with_kernels(cache, new_keys, new_keys, slots)
            attend_with_kernels(query, cache, batch, HEAD**-0.5, out)
        assert torch.cuda.memory_stats()["allocation.all.allocated"] == before

    step()  # compiles the kernels and makes the plans' launchers
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert not out.isnan().any()
