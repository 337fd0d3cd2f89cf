"""``kvquant.timing``: imports on a CPU machine, times the interpreter path by the clock, and builds
the random inputs whose byte count every benchmark reports; on CUDA, the event and graph timers."""

from __future__ import annotations

import statistics
import subprocess
import sys

import pytest
import torch

from kvquant import decode_attention
from kvquant.timing import (
    copy_bandwidth,
    cpu_times_ms,
    event_times_ms,
    graph_ms,
    graph_times_ms,
    median_ms,
    paged_kv_bytes,
    random_sequences,
    read_clear,
    zero_clear,
)

from conftest import require_cuda


def test_importing_it_starts_no_cuda_work_and_leaves_the_interpreter_choice_open() -> None:
    # Triton picks compiled kernels or its interpreter when kvquant's kernels are first imported;
    # kvbench imports the timing first and chooses after, so the import must not pull the kernels.
    code = (
        "import sys, torch, kvquant.timing\n"
        "assert 'kvquant.ops' not in sys.modules, sorted(m for m in sys.modules if 'kvq' in m)\n"
        "assert not torch.cuda.is_available() or not torch.cuda.is_initialized()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_cpu_times_are_one_per_run_after_an_untimed_first_call() -> None:
    calls: list[int] = []
    times = cpu_times_ms(lambda: calls.append(1), runs=4)
    assert len(times) == 4 and len(calls) == 5
    assert all(t >= 0 for t in times)


def test_cpu_copy_bandwidth_is_a_finite_positive_rate() -> None:
    gbs = copy_bandwidth(8 * 2**20, device="cpu", cpu_runs=2)
    assert 0 < gbs < 10_000


@pytest.mark.parametrize("cache_dtype", [torch.int8, torch.bfloat16])
def test_random_sequences_fill_every_page_and_count_its_bytes(cache_dtype: torch.dtype) -> None:
    # 40 tokens in pages of 16: three pages per sequence, the last one partly used.
    sequences = random_sequences(
        2, 40, num_kv_heads=2, head_size=64, block_size=16, cache_dtype=cache_dtype, device="cpu"
    )
    cache = sequences.cache
    assert sequences.block_table.shape == (2, 3)
    assert sorted(sequences.block_table.flatten().tolist()) == list(range(6))
    assert sequences.seq_lens.tolist() == [40, 40]
    nbytes = paged_kv_bytes(
        2, 40, num_kv_heads=2, head_size=64, block_size=16, cache_dtype=cache_dtype
    )
    assert nbytes == cache.pages.numel() * cache.pages.element_size()
    # Non-zero data: zeros would let the memory system or a kernel take shortcuts.
    assert (cache.k != 0).float().mean() > 0.9 and (cache.v != 0).float().mean() > 0.9
    if cache.k_scale is not None and cache.v_scale is not None:
        assert cache.k.min() < -100 and cache.k.max() > 100
        assert cache.k_scale.min() >= 0.005 and cache.v_scale.max() <= 0.02


@pytest.mark.gpu
@require_cuda()
def test_event_and_graph_timers_time_a_real_decode() -> None:
    sequences = random_sequences(
        4, 1024, num_kv_heads=8, head_size=128, block_size=16, cache_dtype=torch.int8, device="cuda"
    )
    query = torch.randn(4, 32, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(query)

    def decode() -> None:
        decode_attention(
            query,
            sequences.cache,
            sequences.block_table,
            sequences.seq_lens,
            128**-0.5,
            out=out,
            max_seq_len=1024,
            validate=False,
        )

    eager = event_times_ms(decode, repeat_ms=20)
    replays = graph_times_ms(decode, decode, repeat_ms=20)
    assert len(eager) > 1 and len(replays) > 1
    assert all(t > 0 for t in (*eager, *replays))
    assert median_ms(decode, repeat_ms=20) > statistics.median(replays)  # launch path included
    # The read leaves no dirty lines behind, the zeroing does: it is never the slower clear.
    assert graph_ms(decode, clear=read_clear) <= 1.1 * graph_ms(decode, clear=zero_clear)
    assert copy_bandwidth(256 * 2**20) > 100
