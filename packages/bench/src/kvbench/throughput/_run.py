"""``run_throughput``: the whole matrix, its comparison with the history, capacity and plots."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

from .._output import output_problem
from ._capacity import computed_capacity
from ._e2e import VLLMEnvironment, check_vllm, run_e2e_cell
from ._errors import OutputError
from ._hardware import fingerprint
from ._history import History, check_history_url, default_history_url
from ._kernels import add_speedups, copy_bandwidth_gbs, run_kernel_cell, select_device
from ._matrix import Cell, E2ECell, KernelCell, Matrix, load_matrix
from ._model import model_shape, resolve_model
from ._plots import scaling_plots, trend_plot
from ._regression import judge

# Whether a larger value of a metric is an improvement.
HIGHER_IS_BETTER = {"tokens_per_s": True, "time_ms": False, "latency_s": False}
RESULTS_FILE = "throughput.json"


def run_throughput(
    matrix: Path | None = None,
    *,
    history_url: str | None = None,
    out_dir: Path,
    progress: bool = True,
) -> dict[str, Any]:
    """Run a throughput matrix, compare it with its history, record it and plot it.

    Args:
        matrix: a matrix TOML file; None runs the embedded CPU nightly matrix.
        history_url: a SQLAlchemy URL; None means ``kvbench-history.sqlite3`` in out_dir's parent.
        out_dir: receives ``throughput.json``, the PNG plots and each end-to-end cell's log.
        progress: show a progress bar over the cells (on stderr).

    Returns:
        A JSON-able dict: ``hardware``, ``cells``, ``capacity``, ``plots``, ``regressions``,
        ``elapsed_s`` (see the package README). The same dict is in ``out_dir/throughput.json``,
        written before the history, so a history failure loses nothing.

    Raises:
        MatrixError, OutputError, EngineMissingError, HistoryError, ThroughputError: before any
            cell runs (before out_dir or the history is created, but for a history database that
            cannot be opened), except a HistoryError from recording the finished run.
    """
    spec = load_matrix(matrix)
    problem = output_problem(out_dir, "output folder", folder=True)
    if problem is not None:
        raise OutputError(problem)
    if history_url is not None:
        out = out_dir.resolve()
        check_history_url(history_url, made_folders={out, *out.parents})
    # Everything a run needs is checked before the output folder or the history is made, so a
    # refused run leaves no trace.
    engine = _engine(spec)
    out_dir.mkdir(parents=True, exist_ok=True)
    started_at = dt.datetime.now(dt.UTC)
    start = time.perf_counter()
    history = History(history_url or default_history_url(out_dir))
    try:
        hardware = fingerprint()
        cells = _run_cells(spec, engine, out_dir, progress)
        capacity = _capacity(spec, cells, engine[0] if engine else None)
        regressions = _judge(spec, cells, history, hardware["key"])
        result: dict[str, Any] = {
            "matrix": spec.name,
            "hardware": hardware,
            "cells": cells,
            "capacity": capacity,
            "plots": [],
            "regressions": regressions,
            "elapsed_s": time.perf_counter() - start,
        }
        results_file = out_dir / RESULTS_FILE
        results_file.write_text(json.dumps(result, indent=2) + "\n")
        history.record(result, matrix=spec.name, started_at=started_at)
        trends = {
            cell["name"]: history.recent_values(
                hardware["key"], cell["name"], cell["metric"], spec.gates.history_runs
            )
            for cell in cells
        }
        plots = scaling_plots(cells, out_dir)
        trend = trend_plot(trends, out_dir, spec.gates.history_runs)
        result["plots"] = [str(p) for p in (*plots, *([trend] if trend else []))]
        result["elapsed_s"] = time.perf_counter() - start
        results_file.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        history.close()
    return result


def _engine(spec: Matrix) -> tuple[str, VLLMEnvironment] | None:
    """The end-to-end cells' model folder and vLLM environment, once vLLM is known to be there;
    None without such cells."""
    if not any(isinstance(c, E2ECell) for c in spec.cells):
        return None
    environment = check_vllm()
    return resolve_model(spec.engine.model), environment


def _run_cells(
    spec: Matrix, engine: tuple[str, VLLMEnvironment] | None, out_dir: Path, progress: bool
) -> list[dict[str, Any]]:
    """Every cell in declared order.

    A cell that raises is recorded as failed with the error's first line; the rest still run.
    """
    from tqdm import tqdm  # type: ignore[import-untyped]

    kernel_cells = [c for c in spec.cells if isinstance(c, KernelCell)]
    device, copy_gbs = "", 0.0
    if kernel_cells:
        device = select_device()
        copy_gbs = copy_bandwidth_gbs(device, kernel_cells[0].shape)
    results = []
    for cell in tqdm(spec.cells, desc=spec.name, unit="cell", disable=not progress):
        try:
            if isinstance(cell, KernelCell):
                measured = run_kernel_cell(cell, device, copy_gbs)
            else:
                assert engine is not None
                model_path, environment = engine
                measured = run_e2e_cell(cell, model_path, spec.engine, out_dir, environment)
        except Exception as error:
            measured = {"status": "failed", "error": _one_line(error)}
        results.append({**_blank(cell), **measured})
    add_speedups(results)
    return results


def _blank(cell: Cell) -> dict[str, Any]:
    return {
        "kind": cell.kind,
        "name": cell.name,
        **cell.params(),
        "status": "failed",
        "error": None,
        "metric": cell.metric,
        "value": None,
        "unit": cell.unit,
        "spread": None,
        "engine_start_s": None,
        "regression": False,
        "baseline_median": None,
    }


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _capacity(
    spec: Matrix, cells: list[dict[str, Any]], model_path: str | None
) -> list[dict[str, Any]]:
    """Computed rows for the matrix's model, then one engine row per (dtype, block size)."""
    rows: list[dict[str, Any]] = []
    if model_path is not None:
        rows += computed_capacity(model_shape(model_path), spec.capacity)
    seen = set()
    for cell in cells:
        engine = cell.get("capacity")
        key = (cell.get("kv_cache_dtype"), cell.get("block_size"))
        if engine is None or key in seen:
            continue
        seen.add(key)
        rows.append({"kv_cache_dtype": key[0], "block_size": key[1], **engine, "source": "engine"})
    return rows


def _judge(
    spec: Matrix, cells: list[dict[str, Any]], history: History, hardware_key: str
) -> list[dict[str, Any]]:
    """Mark each successful cell against its history; returns the regressions."""
    regressions = []
    for cell in cells:
        if cell["status"] != "ok":
            continue
        earlier = history.recent_values(
            hardware_key, cell["name"], cell["metric"], spec.gates.history_runs
        )
        verdict = judge(
            cell["value"],
            [value for _, value in earlier],
            higher_is_better=HIGHER_IS_BETTER[cell["metric"]],
            gates=spec.gates,
        )
        cell.update(
            regression=verdict.regression,
            baseline_median=verdict.baseline_median,
            noise=verdict.noise,
            change=verdict.change,
        )
        if verdict.regression:
            regressions.append(
                {
                    key: cell[key]
                    for key in ("name", "metric", "value", "unit", "baseline_median", "change")
                }
            )
    return regressions
