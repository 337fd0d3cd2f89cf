"""The served step's timing harness (`kvquant.served`): its geometry argument, the rows' batches,
and one step through the plugin's kernel path, timed by the clock in the interpreter (a figure
that says the path runs, never how fast)."""

from __future__ import annotations

import pytest
import torch

from kvquant import InvalidInputError
from kvquant.served import CPU_STEP, STEPS, Batch, ours, parse_geometry, step_times


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


def test_each_row_lays_out_its_batch() -> None:
    geometry = parse_geometry("4/2/64/16/fp16")
    for step in (*STEPS[:2], CPU_STEP):
        small = type(step)(step.name, min(step.decodes, 3), min(step.decode_context, 100),
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
