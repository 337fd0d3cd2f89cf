"""PNG plots for the ADRs: scaling with context length and batch size, and the nightly trend."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from pathlib import Path
from typing import Any

# Parameters that tell series apart in the scaling plots; the x axis is excluded from the label.
_SERIES_KEYS = {
    "kernel": ("op", "heads", "cache_dtype", "batch", "context", "prefix"),
    "e2e": ("bench", "kv_cache_dtype", "block_size", "compilation", "graphs", "input_len", "batch"),
}
_AXES = (("context", "input_len", "context length (tokens)"), ("batch", "batch", "batch size"))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    return plt


def scaling_plots(cells: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """For each kind and axis with at least two points on one line, a PNG of value against it."""
    plt = _pyplot()
    written = []
    for kind in ("kernel", "e2e"):
        ok = [c for c in cells if c["kind"] == kind and c["status"] == "ok"]
        for kernel_axis, e2e_axis, label in _AXES:
            axis = kernel_axis if kind == "kernel" else e2e_axis
            lines: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
            for cell in ok:
                rest = [f"{k}={cell[k]}" for k in _SERIES_KEYS[kind] if k != axis]
                lines[(cell["metric"], " ".join(rest))].append((cell[axis], cell["value"]))
            lines = {key: sorted(points) for key, points in lines.items() if len(points) > 1}
            if not lines:
                continue
            figure, ax = plt.subplots(figsize=(8, 5))
            for (_, series), points in sorted(lines.items()):
                ax.plot(*zip(*points, strict=True), marker="o", label=series)
            metrics = sorted({metric for metric, _ in lines})
            ax.set(xlabel=label, ylabel=", ".join(metrics), title=f"{kind}: {' / '.join(metrics)}")
            ax.set_xscale("log", base=2)
            ax.legend(fontsize="x-small")
            path = out_dir / f"throughput-{kind}-vs-{axis}.png"
            figure.savefig(path, dpi=100, bbox_inches="tight")
            plt.close(figure)
            written.append(path)
    return written


def trend_group(cell: dict[str, Any]) -> str:
    """The line of the trend chart a cell is drawn in: its kernel and cache, or its benchmark and
    KV cache dtype; a chart of a line per cell (one per shape and geometry) is unreadable."""
    if cell["kind"] == "kernel":
        return f"{cell['op']} {cell['cache_dtype']}"
    if cell["kind"] == "served_step":
        return f"served step {cell['cache_dtype']}"
    return f"{cell['bench']} {cell['kv_cache_dtype']}"


def trend_plot(
    trends: dict[str, list[tuple[dt.datetime, float]]],
    groups: dict[str, str],
    out_dir: Path,
    nights: int,
) -> Path | None:
    """Each cell's last ``nights`` values over its own median, one line per group of cells
    (``groups``: cell name -> group, `trend_group`): the median of its cells at each run, with
    the band from their lowest to their highest; the legend beside the chart. None if no cell
    has two values."""
    trends = {name: points for name, points in trends.items() if len(points) > 1}
    if not trends:
        return None
    by_group: dict[str, dict[dt.datetime, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name, points in trends.items():
        values = sorted(v for _, v in points)
        median = values[len(values) // 2]
        for when, value in points:
            by_group[groups.get(name, name)][when].append(value / median)
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(9, 5))
    for group, runs in sorted(by_group.items()):
        times = sorted(runs)
        ratios = [sorted(runs[t]) for t in times]
        middle = [r[len(r) // 2] for r in ratios]
        count = max(len(r) for r in ratios)
        (line,) = ax.plot(times, middle, marker="o", label=f"{group} ({count} cells)")
        ax.fill_between(
            times,
            [r[0] for r in ratios],
            [r[-1] for r in ratios],
            color=line.get_color(),
            alpha=0.15,
        )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(
        ylabel="value / the cell's own median",
        title=f"Throughput matrix, last {nights} runs (line: a group's median cell; band: range)",
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    figure.autofmt_xdate()
    path = out_dir / "throughput-trend.png"
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path
