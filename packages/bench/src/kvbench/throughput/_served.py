"""The served-step driver: whole engine steps as kvquant's vLLM plugin serves them, beside upstream
vLLM's Triton backend on the same batch (`kvquant.served` builds and times both).

A cell's value is the eager step's wall clock (ms, the median of its synced steps: the host's
planning and launch issue included, as an engine pays them between its piecewise graphs); beside
it the same layers' launches replayed in a CUDA graph, which is the device's time alone, and
their ratio, which says how much of the host's work the device does not hide. Each of kvquant's
cells gets its time over its baselines' of the same step and geometry: the INT8 step over our
16-bit step's, and over upstream's bf16 and INT8 steps' (below 1: ours is faster).

On the CPU the kernels run in Triton's interpreter: one of our cells shows that the path runs
(one step, no warm-up, no graph), never how fast; upstream's cells are not measured there.
"""

from __future__ import annotations

from typing import Any

from ._errors import BaselineUnavailableError
from ._matrix import ServedStepCell
from ._measurement import INTERPRETER_CHECK, TIMED
from ._upstream import baseline_name, upstream

# Upstream's step is a speed baseline: in the interpreter it would show nothing of ours.
CPU_UPSTREAM = "upstream's served step is a speed baseline, timed on a GPU only"
# A kvquant cell's time over a baseline's: its field, and the baseline's (impl, cache).
SERVED_RATIOS = {
    "time_vs_16bit": ("kvquant", "16-bit"),
    "time_vs_upstream_bf16": ("vllm", "16-bit"),
    "time_vs_upstream_int8": ("vllm", "int8"),
}


def run_served_step_cell(cell: ServedStepCell, device: str) -> dict[str, Any]:
    """Time one served-step cell; returns its result fields (status "ok", or "not-measured" with
    why for an upstream cell where upstream's kernels cannot be imported)."""
    import torch

    from kvquant import AttentionGeometry
    from kvquant.served import Batch, ours, parse_step, step_times, time_ours, time_upstream

    s = cell.shape
    model_dtype = getattr(torch, s.model_dtype)
    geometry = AttentionGeometry(
        s.num_q_heads, s.num_kv_heads, s.head_size, s.block_size, model_dtype, torch.int8
    )
    geometry.check()
    cache_dtype = getattr(torch, cell.cache_dtype)
    baseline = None
    kernels = None
    if cell.impl == "vllm":
        try:
            if device != "cuda":
                raise BaselineUnavailableError(CPU_UPSTREAM)
            kernels = upstream()
        except BaselineUnavailableError as why:
            return {"status": "not-measured", "error": str(why), "device": device}
        baseline = baseline_name(kernels)
    batch = Batch(parse_step(cell.step), geometry, torch.device(device))
    if device != "cuda":
        times = step_times(*ours(batch, geometry, cache_dtype, cell.layers), 1, batch.out.device,
                           warmups=0)  # fmt: skip
    elif kernels is not None:
        int8 = cache_dtype == torch.int8
        times = time_upstream(batch, geometry, kernels, int8, cell.layers, cell.steps)
    else:
        times = time_ours(batch, geometry, cache_dtype, cell.layers, cell.steps)
    measurement = TIMED if device == "cuda" else INTERPRETER_CHECK
    return {
        "status": "ok",
        "value": times.eager,
        "graph_ms": times.graph,
        "eager_over_graph": times.eager / times.graph if times.graph else None,
        "plan_ms": times.plan,
        "issue_ms": times.issue,
        "device": device,
        "timing_method": "wall-clock, one sync per step" + (", cuda-graph" if times.graph else ""),
        "measurement": measurement,
        "functional_check": measurement != TIMED,
        "baseline": baseline,
    }


def add_served_ratios(cells: list[dict[str, Any]]) -> None:
    """Give each of kvquant's timed served-step cells `SERVED_RATIOS`: its eager time over the
    baseline's of the same step, geometry and layers, where both were timed (None otherwise). A
    16-bit cell has no ratio over itself nor over an INT8 baseline."""

    def key(cell: dict[str, Any]) -> tuple[Any, ...]:
        return cell["step"], cell["heads"], cell["layers"]

    def kind(cell: dict[str, Any]) -> tuple[str, str]:
        return cell["impl"], "int8" if cell["cache_dtype"] == "int8" else "16-bit"

    ok = [c for c in cells if c["kind"] == "served_step" and c["status"] == "ok"]
    timed = {(kind(c), key(c)): c for c in ok if not c["functional_check"]}
    for cell in ok:
        impl, cache = kind(cell)
        if impl != "kvquant":
            continue
        for field, wanted in SERVED_RATIOS.items():
            cell[field] = None
            if cache == "16-bit" and (wanted == ("kvquant", "16-bit") or wanted[1] == "int8"):
                continue
            baseline = timed.get((wanted, key(cell)))
            if baseline is not None and not cell["functional_check"]:
                cell[field] = cell["value"] / baseline["value"]


def summarize_served(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The INT8 served step's figures a decision reads: for each ratio over a baseline and for
    its eager time over its graph's, the highest (worst) over the timed steps and that step
    (None where nothing was timed); and which upstream the baselines ran, or why not."""
    ok = [c for c in cells if c["kind"] == "served_step" and c["status"] == "ok"]
    int8 = [c for c in ok if c["impl"] == "kvquant" and c["cache_dtype"] == "int8"]
    summary: dict[str, Any] = {}
    for field in (*SERVED_RATIOS, "eager_over_graph"):
        found = [c for c in int8 if not c["functional_check"] and c.get(field)]
        worst = max(found, key=lambda c: c[field], default=None)
        summary[f"served_int8_{field}_max"] = worst[field] if worst else None
        summary[f"served_int8_{field}_min"] = min((c[field] for c in found), default=None)
        summary[f"served_int8_{field}_worst"] = worst["step"] if worst else None
    ran = [c for c in ok if c["impl"] == "vllm"]
    missing = [
        c for c in cells
        if c["kind"] == "served_step" and c["impl"] == "vllm" and c["status"] == "not-measured"
    ]  # fmt: skip
    summary["served_baseline_vllm"] = ran[0]["baseline"] if ran else None
    summary["served_baseline_vllm_not_measured"] = missing[0]["error"] if missing else None
    return summary
