"""``run_throughput``: the whole matrix, its comparison with the history, capacity and plots.

Only timed cells are compared: with each other (speed-ups), with their history on the same
hardware (regression flags) and over the nights (trend and scaling plots). Functional checks
(``_measurement``) report what they ran and hold, never a speed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

from kvquant import output_problem

from ._capacity import cell_dtypes, computed_capacity
from ._e2e import VLLMEnvironment, check_vllm, run_e2e_cell
from ._errors import OutputError
from ._hardware import fingerprint
from ._history import History, check_history_url, default_history_url
from ._kernels import SPEEDUPS, add_ratios, copy_bandwidth_gbs, run_kernel_cell, select_device
from ._matrix import Cell, E2ECell, KernelCell, Matrix, ServedStepCell, load_matrix
from ._model import ModelShape, model_shape, resolve_model
from ._plots import scaling_plots, trend_group, trend_plot
from ._regression import HISTORY_TOO_SHORT, NOT_JUDGED, judge
from ._result import ThroughputResult
from ._served import add_served_ratios, run_served_step_cell, summarize_served

# Whether a larger value of a metric is an improvement.
HIGHER_IS_BETTER = {"tokens_per_s": True, "time_ms": False, "latency_s": False}
RESULTS_FILE = "throughput.json"
# The 16-bit cache INT8's capacity is compared with.
SIXTEEN_BIT_CACHE = "bfloat16"


def run_throughput(
    matrix: Path | None = None,
    *,
    history_url: str | None = None,
    out_dir: Path,
    progress: bool = True,
) -> ThroughputResult:
    """Run a throughput matrix, compare it with its history, record it and plot it.

    Args:
        matrix: a matrix TOML file; None runs the embedded CPU nightly matrix.
        history_url: a SQLAlchemy URL; None means ``kvbench-history.sqlite3`` in out_dir's parent.
        out_dir: receives ``throughput.json``, the PNG plots and each end-to-end cell's log.
        progress: show a progress bar over the cells (on stderr).

    Returns:
        The run (see the package README); its ``to_dict()`` is in ``out_dir/throughput.json``,
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
        shape = model_shape(engine[0]) if engine is not None else None
        cells = _run_cells(spec, engine, shape, out_dir, progress)
        capacity = _capacity(spec, cells, shape)
        regressions, history_check = _judge(spec, cells, history, hardware["key"])
        results_file = out_dir / RESULTS_FILE
        result = ThroughputResult(
            matrix=spec.name,
            hardware=hardware,
            cells=cells,
            capacity=capacity,
            plots=[],
            regressions=regressions,
            history_check=history_check,
            summary=summarize(cells),
            elapsed_s=time.perf_counter() - start,
            results_file=str(results_file),
        )
        results_file.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        history.record(result.to_dict(), matrix=spec.name, started_at=started_at)
        # kvquant's own timed cells (and the end-to-end ones): the baselines are no trend of ours.
        timed = [
            cell
            for cell in cells
            if cell["status"] == "ok"
            and not cell["functional_check"]
            and cell.get("impl", "kvquant") == "kvquant"
        ]
        trends = {
            cell["name"]: history.recent_values(
                hardware["key"], cell["name"], cell["metric"], spec.gates.history_runs
            )
            for cell in timed
        }
        plots = scaling_plots(timed, out_dir)
        groups = {cell["name"]: trend_group(cell) for cell in timed}
        trend = trend_plot(trends, groups, out_dir, spec.gates.history_runs)
        result = dataclasses.replace(
            result,
            plots=[str(p) for p in (*plots, *([trend] if trend else []))],
            elapsed_s=time.perf_counter() - start,
        )
        results_file.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
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
    spec: Matrix,
    engine: tuple[str, VLLMEnvironment] | None,
    shape: ModelShape | None,
    out_dir: Path,
    progress: bool,
) -> list[dict[str, Any]]:
    """Every cell in declared order.

    A cell that raises is recorded as failed with the error's first line; the rest still run.
    """
    from tqdm import tqdm  # type: ignore[import-untyped]

    config_dtype = shape.config_dtype if shape is not None else None

    kernel_cells = [c for c in spec.cells if isinstance(c, KernelCell)]
    device, copy_gbs = "", 0.0
    if kernel_cells or any(isinstance(c, ServedStepCell) for c in spec.cells):
        device = select_device()
    if kernel_cells:
        copy_gbs = copy_bandwidth_gbs(device, kernel_cells[0].shape)
    results = []
    for cell in tqdm(spec.cells, desc=spec.name, unit="cell", disable=not progress):
        try:
            if isinstance(cell, KernelCell):
                measured = run_kernel_cell(cell, device, copy_gbs)
            elif isinstance(cell, ServedStepCell):
                measured = run_served_step_cell(cell, device)
            else:
                assert engine is not None
                model_path, environment = engine
                measured = run_e2e_cell(cell, model_path, spec.engine, out_dir, environment)
        except Exception as error:
            measured = {"status": "failed", "error": _one_line(error)}
        if isinstance(cell, E2ECell):
            model_dtype, cache_dtype = cell_dtypes(cell, spec.engine, config_dtype)
            stored = {"model_dtype": model_dtype, "cache_dtype": cache_dtype}
            # Its history is that of the same model dtype on the same vLLM release: the name the
            # history knows a cell by says both.
            version = measured.get("vllm_version")
            stored["name"] = f"{cell.name} model={model_dtype}" + (
                f" vllm={version}" if version else ""
            )
        else:
            stored = {"model_dtype": cell.shape.model_dtype}
        results.append({**_blank(cell), **stored, **measured})
    add_ratios(results)
    add_served_ratios(results)
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
        # Set by the cell once it has run: "timed", or which functional check it was.
        "measurement": None,
        "functional_check": False,
        "regression": False,
        "judgement": None,
        "history_runs": None,
        "baseline_median": None,
    }


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _capacity(
    spec: Matrix, cells: list[dict[str, Any]], shape: ModelShape | None
) -> list[dict[str, Any]]:
    """Computed rows for each cache the end-to-end cells run, in the dtype the engine stores it
    in (and a bfloat16 cache's, beside an INT8 one), then one engine row per (KV cache dtype,
    stored dtype, block size) the engine logged."""
    e2e = [cell for cell in cells if cell["kind"] == "e2e"]
    rows: list[dict[str, Any]] = []
    if shape is not None:
        caches = {(c["kv_cache_dtype"], c["cache_dtype"]): None for c in e2e if c["cache_dtype"]}
        if any(cache == "int8" for _, cache in caches):
            # What INT8 replaces is a 16-bit cache, whatever the engine's own stores: its row is
            # computed for the comparison a decision reads.
            caches.setdefault((SIXTEEN_BIT_CACHE, SIXTEEN_BIT_CACHE), None)
        rows += computed_capacity(shape, spec.capacity, list(caches))
    seen = set()
    for cell in e2e:
        engine = cell.get("capacity")
        key = (cell["kv_cache_dtype"], cell["cache_dtype"], cell["block_size"])
        if engine is None or key in seen:
            continue
        seen.add(key)
        rows.append(
            {
                "kv_cache_dtype": key[0],
                "cache_dtype": key[1],
                "block_size": key[2],
                **engine,
                "bytes_per_token": None,
                "source": "engine",
            }
        )
    return rows


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures a decision reads, over the cells that ran: how many were timed and how many
    were functional checks; for the INT8 decode and prefill, the range of each timed speed-up over
    a baseline (`SPEEDUPS`: its 16-bit twin, upstream's bf16 and INT8 kernels, SDPA flash) and
    the cell where it is lowest (None where no such pair was timed); which upstream the baselines
    ran, or why they were not measured; and the INT8 decode's bytes over the 16-bit one's, which is
    what a token costs in cache (a fact of the layout: functional checks count)."""
    ok = [cell for cell in cells if cell["status"] == "ok"]
    int8 = [
        cell
        for cell in ok
        if cell["kind"] == "kernel"
        and cell["cache_dtype"] == "int8"
        and cell.get("impl", "kvquant") == "kvquant"
    ]
    summary: dict[str, Any] = {
        "cells_timed": sum(not cell["functional_check"] for cell in ok),
        "cells_functional_check": sum(cell["functional_check"] for cell in ok),
    }
    for op in ("decode", "prefill"):
        for field in SPEEDUPS:
            if field == "speedup_vs_sdpa" and op != "prefill":
                continue  # SDPA flash is a prefill baseline only
            found = [c for c in int8 if c["op"] == op and c.get(field)]
            weakest = min(found, key=lambda c: c[field], default=None)
            summary[f"{op}_{field}_min"] = weakest[field] if weakest else None
            summary[f"{op}_{field}_max"] = max((c[field] for c in found), default=None)
            summary[f"{op}_{field}_weakest"] = shape_label(weakest) if weakest else None
    for impl in ("vllm", "sdpa"):
        ran = [c for c in ok if c["kind"] == "kernel" and c.get("impl") == impl]
        missing = [c for c in cells if c.get("impl") == impl and c["status"] == "not-measured"]
        summary[f"baseline_{impl}"] = ran[0]["baseline"] if ran else None
        summary[f"baseline_{impl}_not_measured"] = missing[0]["error"] if missing else None
    ratios = [c["bytes_vs_16bit"] for c in int8 if c["op"] == "decode" and c["bytes_vs_16bit"]]
    summary["int8_bytes_per_token_vs_16bit"] = max(ratios, default=None)
    return summary | summarize_served(cells)


def shape_label(cell: dict[str, Any]) -> str:
    """A kernel cell's shape in a few words: heads, then batch x context, or for a chunked
    prefill batch x (cached + new tokens)."""
    tokens = cell["context"]
    if cell["op"] == "prefill":
        tokens = f"({cell['prefix']} + {cell['context'] - cell['prefix']})"
    return f"{cell['heads']} {cell['batch']} x {tokens}"


def _judge(
    spec: Matrix, cells: list[dict[str, Any]], history: History, hardware_key: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Mark each successful cell against its history on this hardware (the fingerprint's key;
    another machine's runs are never read); returns the regressions and ``history_check``.

    Functional checks are marked ``not-judged``; a timed cell with fewer than ``min_history``
    earlier values ``history-too-short``: neither can be a regression.
    """
    regressions = []
    judged = too_short = 0
    fewest: int | None = None
    for cell in cells:
        if cell["status"] != "ok":
            continue
        if cell["functional_check"] or cell.get("impl", "kvquant") != "kvquant":
            cell["judgement"] = NOT_JUDGED  # a reference path, or a baseline: never ours to flag
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
            judgement=verdict.judgement,
            history_runs=verdict.history_runs,
            baseline_median=verdict.baseline_median,
            noise=verdict.noise,
            change=verdict.change,
        )
        if verdict.judgement == HISTORY_TOO_SHORT:
            too_short += 1
            fewest = verdict.history_runs if fewest is None else min(fewest, verdict.history_runs)
        else:
            judged += 1
        if verdict.regression:
            regressions.append(
                {
                    key: cell[key]
                    for key in ("name", "metric", "value", "unit", "baseline_median", "change")
                }
            )
    history_check = {
        "min_history": spec.gates.min_history,
        "cells_judged": judged,
        "cells_history_too_short": too_short,
        "fewest_history_runs": fewest,
    }
    return regressions, history_check
