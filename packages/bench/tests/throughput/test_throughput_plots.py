"""The trend chart stays readable however many cells a matrix has: one line per kernel and cache
(or benchmark and KV cache dtype), drawn as the median of its cells with their range."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from PIL import Image

from kvbench.throughput._plots import trend_group, trend_plot

RUNS = [dt.datetime(2026, 12, 3, hour, tzinfo=dt.UTC) for hour in (15, 16, 18)]


def test_fifty_cells_are_drawn_as_one_line_per_kernel_and_cache(tmp_path: Path) -> None:
    cells = [
        {"kind": "kernel", "op": op, "cache_dtype": cache, "name": f"{op} {cache} {i}"}
        for op, count in (("decode", 21), ("prefill", 4))
        for cache in ("int8", "bfloat16")
        for i in range(count)
    ]
    cells.append({"kind": "e2e", "bench": "throughput", "kv_cache_dtype": "auto", "name": "e2e"})
    groups = {cell["name"]: trend_group(cell) for cell in cells}
    assert sorted(set(groups.values())) == [
        "decode bfloat16", "decode int8", "prefill bfloat16", "prefill int8", "throughput auto",
    ]  # fmt: skip
    trends = {name: [(t, 1.0 + i / 100) for i, t in enumerate(RUNS)] for name in groups}
    path = trend_plot(trends, groups, tmp_path, 10)
    assert path == tmp_path / "throughput-trend.png"
    with Image.open(path) as image:  # the legend beside the chart, not over it
        width, height = image.size
    assert width > height


def test_no_trend_without_two_values_of_a_cell(tmp_path: Path) -> None:
    assert trend_plot({"decode int8 0": [(RUNS[0], 1.0)]}, {}, tmp_path, 10) is None
