"""The served step's timing harness (`kvquant.served`): its geometry argument, the rows' batches,
and one step through the plugin's kernel path, timed by the clock in the interpreter (a figure
that says the path runs, never how fast)."""

from __future__ import annotations

import pytest
import torch

from kvquant import InvalidInputError
from kvquant.served import (
    CPU_STEP,
    STEPS,
    Batch,
    ours,
    parse_geometry,
    parse_step,
    step_times,
)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("32/8/128/16", "expected q/kv/head/block/dtype"),
        ("32/8/128/16/fp32", "expected q/kv/head/block/dtype"),
        ("32/x/128/16/bf16", "expected q/kv/head/block/dtype"),
        ("30/8/128/16/bf16", "`num_q_heads` is 30"),
        ("32/8/100/16/bf16", "`head_size` is 100"),
    ],
)
def test_a_geometry_it_cannot_serve_is_one_line(text: str, problem: str) -> None:
    with pytest.raises(InvalidInputError) as error:
        parse_geometry(text)
    assert problem in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "expected decodes DxC"),
        ("64", "expected decodes DxC"),
        ("2x(1+1) + 4x100", "expected decodes DxC"),  # decodes come first
        ("64x4096 - 1x(0+8)", "expected decodes DxC"),
        ("1x(16+0)", "a prefill with no new token"),
        ("0x4096", "no request"),
        ("4x0 + 1x(0+8)", "decodes of no key"),
    ],
)
def test_a_step_spec_it_cannot_read_is_one_line(text: str, problem: str) -> None:
    with pytest.raises(InvalidInputError) as error:
        parse_step(text)
    assert problem in str(error.value) and "\n" not in str(error.value)


def test_a_step_reads_back_from_its_spec_and_names_itself() -> None:
    for step in (*STEPS, CPU_STEP):
        assert parse_step(step.spec) == step
    step = parse_step(" 64x4096 +2x( 1024 + 256 )")
    assert step.seq_lens == [4096] * 64 + [1280, 1280]
    assert step.query_lens == [1] * 64 + [256, 256]
    assert step.name == "64 decodes x 4k + 2 chunks (1k + 256)"
    assert parse_step("4x(0+2048)").name == "4 prefills (0 + 2k)"


def test_each_row_lays_out_its_batch() -> None:
    geometry = parse_geometry("4/2/64/16/fp16")
    for step in (*STEPS[:2], CPU_STEP):
        small = type(step)(min(step.decodes, 3), min(step.decode_context, 100),
                           tuple((min(c, 70), min(n, 40)) for c, n in step.chunks))  # fmt: skip
        batch = Batch(small, geometry, torch.device("cpu"))
        assert batch.query.shape[0] == sum(small.query_lens) == batch.slot_mapping.shape[0]
        assert batch.seq_lens_host.tolist() == small.seq_lens
        # Every new token's slot is in its sequence's pages, none twice.
        assert batch.slot_mapping.unique().numel() == batch.slot_mapping.numel()
        assert int(batch.slot_mapping.max()) < batch.num_blocks * 16


def test_one_step_runs_through_the_plugins_kernel_path(device: torch.device) -> None:
    geometry = parse_geometry("4/2/64/16/fp16")
    batch = Batch(CPU_STEP, geometry, device)
    times = step_times(*ours(batch, geometry, torch.int8, 2), 1, device, warmups=0)
    assert times.eager > 0 and times.plan > 0 and times.issue > 0
    assert not batch.out.isnan().any()
