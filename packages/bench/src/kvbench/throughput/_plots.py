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


def trend_plot(
    trends: dict[str, list[tuple[dt.datetime, float]]], out_dir: Path, nights: int
) -> Path | None:
    """Every cell's last ``nights`` values over its own median, on one chart; None if too few."""
    trends = {name: points for name, points in trends.items() if len(points) > 1}
    if not trends:
        return None
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(9, 5))
    for name, points in sorted(trends.items()):
        values = sorted(v for _, v in points)
        median = values[len(values) // 2]
        ax.plot([t for t, _ in points], [v / median for _, v in points], marker=".", label=name)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(ylabel="value / the cell's median", title=f"Throughput matrix, last {nights} runs")
    ax.legend(fontsize="xx-small")
    figure.autofmt_xdate()
    path = out_dir / "throughput-trend.png"
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path
