"""Decode plans (`kvquant.ops.decode.plan`): what a plan sizes, one plan for every length up to
its context, no host work around its launches, graphs that replay exactly as eager, and the
direct launch path against the JIT's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kvquant import (
    InvalidInputError,
    allocate_cache,
    cache_write,
    decode_attention,
    decode_config,
    plan_decode,
)
from kvquant import reference as ref
from kvquant._batch import PagedBatch, make_paged_batch
from kvquant.ops import _common
from kvquant.ops import cache_write as cache_write_module
from kvquant.ops._common import runtime_target
from kvquant.ops.decode import plan as decode_plan_module

from attention_cases import (
    ATTENTION_TOLERANCE,
    assert_close,
    paged_batch,
    plan_for,
    reference_out,
    rel_l2,
)
from conftest import DEVICE, require_cuda


def plan_target() -> str:
    """The target plans on this machine's test device launch for."""
    return runtime_target(DEVICE)


def test_plan_sizes_its_launch_and_scratch(device: torch.device, gen: torch.Generator) -> None:
    batch = paged_batch([300, 1, 40], device, gen, group=16)
    plan = plan_for(batch, 300, out_dtype=torch.float32)
    tile_n = plan.config.tile_n
    # A context rounds up to whole KV tiles; every length rounding alike shares the plan.
    assert plan.max_seq_len == -(-300 // tile_n) * tile_n
    assert plan_for(batch, plan.max_seq_len - 1, out_dtype=torch.float32) is plan
    # 16 query heads per kv head (2 kv heads): one program each on the fp16 P x V decode, two
    # of 8 columns each on the integer one.
    assert plan.fp16_pv and plan._decode_grid == (3, 2, plan.num_splits)
    integer_config = decode_config(
        head_size=64, block_size=16, gqa=16, cache_dtype=torch.int8, target=plan_target(),
        fp16_pv=False,
    )  # fmt: skip
    integer = plan_for(batch, 300, out_dtype=torch.float32, config=integer_config)
    assert not integer.fp16_pv and integer._decode_grid == (3, 2 * 2, integer.num_splits)
    assert plan.num_splits > 1 and plan.tiles_per_split * plan.num_splits >= 300 / tile_n
    stats = 3 * 32 * plan.num_splits
    assert plan.scratch_elements == stats * 64 + 2 * (-(-stats // 4) * 4)
    scratch = plan.new_scratch()
    assert scratch is not None and scratch.numel() == plan.scratch_elements
    one_split = plan_for(batch, 300, out_dtype=torch.float32, num_splits=1)
    assert (one_split.num_splits, one_split.scratch_elements, one_split.new_scratch()) == (
        1,
        0,
        None,
    )
    # A forced count is rounded so that no split is empty: 5 tiles over 4 splits leave one.
    assert plan_for(batch, 5 * tile_n, num_splits=4).num_splits == 3


# Lengths a captured decode is replayed at: its whole context, shorter and ragged ones, one key.
_REPLAY_LENGTHS = ([300, 300, 300], [1, 150, 299], [17, 1, 64], [1, 1, 1])


@pytest.mark.parametrize("num_splits", [None, 1])
def test_one_plan_serves_every_length_up_to_its_context(
    num_splits: int | None, device: torch.device, gen: torch.Generator
) -> None:
    """The same plan, scratch and tensors, new lengths in seq_lens each time: what a replayed
    graph does. Two plans sharing one scratch buffer, run one after the other, as layers do."""
    batch = paged_batch([300, 300, 300], device, gen)
    plan = plan_for(batch, 300, out_dtype=torch.float32, num_splits=num_splits)
    other = paged_batch([90, 20, 5], device, gen, group=2)
    other_plan = plan_for(other, 90, out_dtype=torch.float32)
    scratch = torch.empty(max(plan.scratch_elements, other_plan.scratch_elements, 1), device=device)
    seq_lens = batch.seq_lens
    out = torch.empty(batch.query.shape, device=device)
    for lengths in _REPLAY_LENGTHS:
        seq_lens.copy_(torch.tensor(lengths))
        scale = batch.query.shape[-1] ** -0.5
        plan.run(
            batch.query, batch.cache, batch.block_table, seq_lens, scale, out=out, scratch=scratch
        )
        other_out = other_plan.run(
            other.query, other.cache, other.block_table, other.seq_lens, 0.125, scratch=scratch
        )
        assert_close(out, reference_out(batch), ATTENTION_TOLERANCE)
        assert_close(other_out.float(), _expected_scaled(other, 0.125), 1e-2)


def _expected_scaled(batch: PagedBatch, scale: float) -> torch.Tensor:
    return ref.paged_attention_ref(
        batch.query, batch.cache, batch.block_table, batch.seq_lens, batch.cu_seqlens_q, scale
    )


class _HostWork(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Every torch op issued while active, but those of Triton's interpreter running a kernel
    (its own copies of the arguments): what a launch path does on the host around the kernel."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[str] = []
        self.in_kernel = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self.in_kernel:
            self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


# Ops that only make a view; everything else reads data, allocates or copies.
_VIEWS = {"aten.view", "aten.slice", "aten.alias", "aten.as_strided", "aten.detach"}


@contextmanager
def _host_work(monkeypatch: pytest.MonkeyPatch) -> Iterator[_HostWork]:
    guard = _HostWork()
    real_launch = _common.launch

    def kernel_unguarded(*args: Any) -> None:
        guard.in_kernel = True
        try:
            real_launch(*args)
        finally:
            guard.in_kernel = False

    real_tolist = torch.Tensor.tolist

    def recorded_tolist(tensor: torch.Tensor) -> Any:  # reads the data outside torch's dispatch
        guard.ops.append("Tensor.tolist")
        return real_tolist(tensor)

    for module in (_common, decode_plan_module, cache_write_module):
        monkeypatch.setattr(module, "launch", kernel_unguarded)
    monkeypatch.setattr(torch.Tensor, "tolist", recorded_tolist)
    with guard:
        yield guard


def test_plan_and_unvalidated_write_read_nothing_on_the_host_and_allocate_nothing(
    monkeypatch: pytest.MonkeyPatch, device: torch.device, gen: torch.Generator
) -> None:
    """Given out and scratch: no .item(), .tolist(), int(tensor), allocation or copy around the
    kernels (the conditions of a CUDA-graph capture). The guard catches decode_attention's
    checks, and a plan left to allocate its scratch."""
    batch = paged_batch([300, 17, 1], device, gen)
    plan = plan_for(batch, 300)
    scratch, out = plan.new_scratch(), torch.empty_like(batch.query)
    key = torch.randn(2, 2, 64, generator=gen).to(device, torch.bfloat16)
    slots = torch.tensor([5, -1], device=device)
    with _host_work(monkeypatch) as guard:
        plan.run(
            batch.query,
            batch.cache,
            batch.block_table,
            batch.seq_lens,
            0.1,
            out=out,
            scratch=scratch,
        )
        cache_write(batch.cache, key, key, slots, validate=False)
    # Views only (the interpreter's int16 views of query and out; none on a GPU, where the
    # compiled kernels take addresses).
    assert set(guard.ops) <= _VIEWS, guard.ops
    with _host_work(monkeypatch) as guard:
        decode_attention(batch.query, batch.cache, batch.block_table, batch.seq_lens, 0.1, out=out)
    assert {"Tensor.tolist", "aten._local_scalar_dense"} <= set(guard.ops)
    with _host_work(monkeypatch) as guard:  # no scratch given: the plan allocates it
        plan.run(batch.query, batch.cache, batch.block_table, batch.seq_lens, 0.1, out=out)
    assert "aten.empty" in guard.ops


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ("query_heads", "query"),
        ("query_dtype", "query"),
        ("out_dtype", "out"),
        ("seq_lens_int64", "seq_lens"),
        ("table_rows", "block_table"),
        ("cache_heads", "cache"),
        ("scratch_short", "scratch"),
        ("scale", "softmax_scale"),
    ],
)
def test_plan_run_refuses_tensors_of_another_shape_in_one_line(
    change: str, argument: str, device: torch.device, gen: torch.Generator
) -> None:
    batch = paged_batch([200, 33], device, gen)
    plan = plan_for(batch, 200, num_splits=2)
    scratch = plan.new_scratch()
    assert scratch is not None
    query, out, seq_lens, table = (
        batch.query,
        torch.empty_like(batch.query),
        batch.seq_lens,
        batch.block_table,
    )
    cache, scale = batch.cache, 0.1
    if change == "query_heads":
        query = query[:, :4]
    elif change == "query_dtype":
        query = query.half()
    elif change == "out_dtype":
        out = out.float()
    elif change == "seq_lens_int64":
        seq_lens = seq_lens.long()
    elif change == "table_rows":
        table = table[:1]
    elif change == "cache_heads":
        cache = make_paged_batch(
            seq_lens=[200], num_kv_heads=1, group=8, head_size=64, block_size=16,
            cache_dtype=torch.int8, model_dtype=torch.bfloat16, device=device, generator=gen,
        ).cache  # fmt: skip
    elif change == "scratch_short":
        scratch = scratch[:-1]
    else:
        scale = 0.0
    with pytest.raises(InvalidInputError, match=f"^`{argument}`[^\n]*$"):
        plan.run(query, cache, table, seq_lens, scale, out=out, scratch=scratch)


@pytest.mark.parametrize(
    ("argument", "value"),
    [("num_seqs", 0), ("max_seq_len", 0), ("num_q_heads", 6), ("head_size", 72),
     ("block_size", 24), ("cache_dtype", torch.float16), ("sliding_window", 0),
     ("num_splits", 0)],
)  # fmt: skip
def test_plan_decode_refuses_a_bad_geometry_in_one_line(argument: str, value: object) -> None:
    geometry: dict[str, Any] = {
        "num_seqs": 2,
        "max_seq_len": 100,
        "num_q_heads": 8,
        "num_kv_heads": 4,
        "head_size": 64,
        "block_size": 16,
        "model_dtype": torch.bfloat16,
        "cache_dtype": torch.int8,
        "device": "cpu",
    }
    with pytest.raises(InvalidInputError, match=f"^`{argument}`[^\n]*$"):
        plan_decode(**(geometry | {argument: value}))


def _last_slots(block_table: torch.Tensor, lengths: list[int], block_size: int) -> torch.Tensor:
    """The slot of each sequence's newest key (position length - 1); -1 for a padding row."""
    slots = [
        int(block_table[i, (n - 1) // block_size]) * block_size + (n - 1) % block_size if n else -1
        for i, n in enumerate(lengths)
    ]
    return torch.tensor(slots, dtype=torch.int64, device=block_table.device)


# Lengths at capture, then at replay: shorter, every one at the plan's whole context, ragged, one
# key each, and a padding row as vLLM's padded graphs bring (0 keys, block-table row -1, slot -1).
_CAPTURE_LENGTHS = [700, 700, 700, 700]


_GRAPH_REPLAYS = ([300, 200, 100, 50], [1024] * 4, [1, 1024, 17, 640], [1, 1, 1, 1], [900, 0, 5, 1])


@pytest.mark.gpu
@require_cuda()
@pytest.mark.parametrize("cache_dtype", [torch.int8, torch.bfloat16])
@pytest.mark.parametrize("group", [4, 16])
@pytest.mark.parametrize("num_splits", [None, 1])
def test_captured_write_and_decode_replay_exactly_as_eager_gpu(
    cache_dtype: torch.dtype,
    group: int,
    num_splits: int | None,
    device: torch.device,
    gen: torch.Generator,
) -> None:
    """cache_write and a DecodePlan's run captured once in a CUDA graph, replayed with new
    contents of the query, K/V, slot_mapping, seq_lens and block_table: the cache bytes and
    outputs equal the same calls run eagerly, bit for bit. The eager decode runs the same plan:
    bit-equality needs its split count and tiles per split (another split count sums the
    partials in another order); decode_attention given the plan's max_seq_len and split count
    is that same launch."""
    block = 16
    batch = make_paged_batch(
        seq_lens=[1024] * 4, num_kv_heads=2, group=group, head_size=128, block_size=block,
        cache_dtype=cache_dtype, model_dtype=torch.bfloat16, device=device, generator=gen,
    )  # fmt: skip
    cache, table, seq_lens, query = batch.cache, batch.block_table, batch.seq_lens, batch.query
    plan = plan_for(batch, 1024, num_splits=num_splits)
    assert num_splits == 1 or plan.num_splits > 1
    scratch, out = plan.new_scratch(), torch.empty_like(query)
    # Real values from the first call on: the warm-up and the capture write them into the
    # cache, where later replays' longer sequences attend them (empty memory could hold NaN).
    key = torch.randn(4, 2, 128, generator=gen).to(device, torch.bfloat16)
    value, slots = torch.randn_like(key), _last_slots(table, _CAPTURE_LENGTHS, block)
    full_table = table.clone()
    scale = 128**-0.5

    def step() -> None:
        cache_write(cache, key, value, slots, validate=False)
        plan.run(query, cache, table, seq_lens, scale, softcap=None, out=out, scratch=scratch)

    seq_lens.copy_(torch.tensor(_CAPTURE_LENGTHS))
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    for lengths in _GRAPH_REPLAYS:
        live = torch.tensor([n > 0 for n in lengths], device=device)
        table.copy_(torch.where(live[:, None], full_table, -1))
        seq_lens.copy_(torch.tensor(lengths))
        slots.copy_(_last_slots(table, lengths, block))
        for tensor in (key, value, query):
            tensor.copy_(torch.randn(tensor.shape, generator=gen).to(tensor.dtype))
        before = cache.pages.clone()
        graph.replay()
        torch.cuda.synchronize()
        replayed_pages, replayed = cache.pages.clone(), out.clone()
        cache.pages.copy_(before)
        step()
        assert torch.equal(cache.pages, replayed_pages)
        assert torch.equal(out[live], replayed[live]), lengths
        again = decode_attention(
            query, cache, table, seq_lens, scale, max_seq_len=plan.max_seq_len,
            num_splits=plan.num_splits, validate=False,
        )  # fmt: skip
        assert torch.equal(again[live], replayed[live])
        rows = [i for i, n in enumerate(lengths) if n]
        expected = ref.paged_attention_ref(
            query[rows], cache, table[rows], seq_lens[rows],
            torch.arange(len(rows) + 1, dtype=torch.int32, device=device), scale,
        )  # fmt: skip
        tolerance = 1e-2  # bf16 output (test_decode_16_bit_output)
        assert_close(replayed[rows].float(), expected, tolerance)


@pytest.mark.gpu
@require_cuda()
@pytest.mark.parametrize(
    ("cache_dtype", "group"), [(torch.int8, 8), (torch.int8, 32), (torch.bfloat16, 8)]
)
def test_compiled_launch_matches_the_jit_launch_gpu(
    cache_dtype: torch.dtype,
    group: int,
    monkeypatch: pytest.MonkeyPatch,
    device: torch.device,
    gen: torch.Generator,
) -> None:
    """The compiled kernels launched directly (ops._common.CompiledLaunch) give the bits that
    Triton's JIT launch of the same plan gives, for the decode (INT8 GQA 32: the fp16 P x V
    one), its reducer and the cache write; a query whose address the compiled variant does not
    assume goes through the JIT instead."""
    batch = paged_batch(
        [1, 300, 2000, 77], device, gen, head_size=128, group=group, cache_dtype=cache_dtype
    )
    key = torch.randn(4, 2, 128, generator=gen).to(device, torch.bfloat16)
    slots = torch.tensor([3, -1, 40, 41], device=device)

    def outputs(query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        decode_plan_module.clear_plan_caches()  # plans and launchers made anew under the gate
        written = allocate_cache(batch.cache.num_blocks, 2, 128, 16, cache_dtype, device)
        cache_write(written, key, key, slots, validate=False)
        plan = plan_for(batch, 2000, num_splits=3)
        out = plan.run(query, batch.cache, batch.block_table, batch.seq_lens, 0.09)
        return out, written.pages

    direct = outputs(batch.query)
    monkeypatch.setattr(_common, "DIRECT_LAUNCH", False)
    through_jit = outputs(batch.query)
    monkeypatch.undo()
    assert torch.equal(direct[0], through_jit[0]) and torch.equal(direct[1], through_jit[1])
    storage = torch.empty(batch.query.numel() + 1, dtype=batch.query.dtype, device=device)
    shifted = storage[1:].view(batch.query.shape)  # 2 bytes past a 16-byte boundary
    shifted.copy_(batch.query)
    assert shifted.data_ptr() % 16
    misaligned = outputs(shifted)[0]
    error = rel_l2(misaligned, direct[0])
    assert error < 1e-6, error
    decode_plan_module.clear_plan_caches()


class _RecordedLaunches:
    """Stands in for both launch paths of the decode plans and the cache write: records each
    launch as (path, kernel, grid, arguments), tensors as their addresses, and runs nothing.
    ``direct``: the launchers take addresses, as `CompiledLaunch` does, else they are the JIT's."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, direct: bool) -> None:
        self.calls: list[tuple[str, str, tuple[int, ...], tuple[object, ...]]] = []
        record = self.calls.append

        class Launcher:
            takes_addresses = direct

            def __init__(self, spec: Any, device: torch.device) -> None:
                self.name = spec.name

            def __call__(self, grid: tuple[int, ...], *args: object) -> None:
                record(("direct", self.name, grid, args))

        def jit_launch(spec: Any, grid: tuple[int, ...], arguments: tuple[object, ...]) -> None:
            addresses = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in arguments)
            record(("jit", spec.name, grid, addresses))

        for module in (decode_plan_module, cache_write_module):
            monkeypatch.setattr(module, "kernel_launcher", Launcher)
            monkeypatch.setattr(module, "launch", jit_launch)


@pytest.mark.parametrize("num_splits", [3, 1])
def test_direct_launches_pass_what_the_named_jit_launches_pass(
    num_splits: int, monkeypatch: pytest.MonkeyPatch, device: torch.device, gen: torch.Generator
) -> None:
    """The compiled paths of `DecodePlan.run` and `cache_write` pass their arguments by
    position (binding them by name would cost host time on every call); they must be what the
    JIT paths name through `KernelSpec.arguments`, for the decode, its reducer and the write."""
    batch = paged_batch([300, 17, 1], device, gen)
    shape = {"num_splits": num_splits, "sliding_window": 200}
    out = torch.empty_like(batch.query)
    scratch = plan_for(batch, 300, **shape).new_scratch()
    key = torch.randn(2, 2, 64, generator=gen).to(device, torch.bfloat16)
    slots = torch.tensor([5, 40], device=device)  # int64: both paths pass this tensor itself

    def launches(direct: bool) -> list[tuple[str, str, tuple[int, ...], tuple[object, ...]]]:
        with monkeypatch.context() as patch:
            recorded = _RecordedLaunches(patch, direct=direct)
            decode_plan_module.clear_plan_caches()  # plans made anew with the stand-ins
            plan = plan_for(batch, 300, **shape)
            plan.run(
                batch.query, batch.cache, batch.block_table, batch.seq_lens, 0.1,
                softcap=30.0, out=out, scratch=scratch,
            )  # fmt: skip
            cache_write(batch.cache, key, key, slots, validate=False)
        decode_plan_module.clear_plan_caches()
        return recorded.calls

    direct, jit = launches(direct=True), launches(direct=False)
    kernels = (
        ["decode_attention", "reduce_splits"] if num_splits > 1 else ["decode_attention_one_split"]
    )
    assert [(path, name) for path, name, _, _ in direct] == [
        ("direct", name) for name in [*kernels, "cache_write"]
    ]
    assert [call[1:] for call in direct] == [call[1:] for call in jit]
