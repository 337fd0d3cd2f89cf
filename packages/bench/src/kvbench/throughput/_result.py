"""What ``run_throughput`` returns: every cell, the capacity rows, the history's judgement, the
plots; and the throughput stage's record of it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from adrkit.schema import RecordParts, Scalar, Table, files_by_name

from ._regression import describe_history_check

# A cell as it ran: its parameters, status and error, the measured value with its unit and
# spread, what the measurement was (timed, or a functional check) and what the history said of
# it; JSON, as throughput.json and the history hold it.
Cell = dict[str, Any]

# Each row says what its figure is ("measurement": timed, or a functional check that is never a
# speed) and what the history said of it ("judgement", with "history_runs": earlier runs / needed).
KERNEL_COLUMNS = [
    "impl",
    "op",
    "heads",
    "cache_dtype",
    "batch",
    "context",
    "prefix",
    "measurement",
    "median_ms",
    "spread",
    "gbs",
    "copy_fraction",
    "bytes_vs_16bit",
    "speedup_vs_16bit",
    "speedup_vs_upstream_bf16",
    "speedup_vs_upstream_int8",
    "speedup_vs_sdpa",
    "baseline",
    "judgement",
    "history_runs",
    "verdict",
]
# An end-to-end row names the vLLM release that served it (as its engine logged it) and the
# model dtype it ran.
E2E_COLUMNS = [
    "bench",
    "vllm_version",
    "model_dtype",
    "kv_cache_dtype",
    "cache_dtype",
    "block_size",
    "compilation",
    "graphs",
    "input_len",
    "output_len",
    "batch",
    "measurement",
    "metric",
    "value",
    "unit",
    "spread",
    "engine_start_s",
    "judgement",
    "history_runs",
    "verdict",
]
SERVED_STEP_COLUMNS = [
    "impl",
    "step",
    "heads",
    "cache_dtype",
    "layers",
    "measurement",
    "eager_ms",
    "graph_ms",
    "eager_over_graph",
    "plan_ms",
    "issue_ms",
    "time_vs_16bit",
    "time_vs_upstream_bf16",
    "time_vs_upstream_int8",
    "baseline",
    "judgement",
    "history_runs",
    "verdict",
]
# Capacity rows name the cache they assume ("kv_cache_dtype" as the engine is given it, stored
# as "cache_dtype") and where they come from ("source": "computed" or "engine"), shown under
# the column "source_kind".
_CAPACITY_FIELDS = [
    "kv_cache_dtype",
    "cache_dtype",
    "block_size",
    "seq_len",
    "bytes_per_token",
    "max_tokens",
    "max_seqs",
    "source",
]
CAPACITY_COLUMNS = [*_CAPACITY_FIELDS[:-1], "source_kind"]


@dataclass(frozen=True)
class ThroughputResult:
    """One run of a matrix on one machine (``hardware``, its fingerprint; ``key`` names it).

    ``regressions`` are the timed cells worse than their history allows; ``history_check`` says
    how many cells were judged and how many had too short a history; ``summary`` holds the
    figures a decision reads. ``to_dict`` is throughput.json; ``results_file`` is where the run
    wrote it (None for a result read back from JSON).
    """

    matrix: str
    hardware: dict[str, Any]
    cells: list[Cell]
    capacity: list[dict[str, Any]]
    plots: list[str]
    regressions: list[dict[str, Any]]
    history_check: dict[str, Any]
    summary: dict[str, Scalar]
    elapsed_s: float
    results_file: str | None = field(default=None, compare=False)

    RECORD_TABLES: ClassVar[tuple[str, ...]] = ("kernels", "e2e", "capacity", "served_steps")

    @property
    def passed(self) -> bool:
        """Every cell ran (a baseline that cannot run here is not measured, not failed) and none
        regressed."""
        ok = ("ok", "not-measured")
        return all(cell["status"] in ok for cell in self.cells) and not self.regressions

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "results_file"}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ThroughputResult:
        """The result as ``to_dict`` wrote it."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name != "results_file"})

    def record_parts(self) -> RecordParts:
        """The throughput stage's record: the kernel, end-to-end and capacity tables, the counts
        the pipeline's gates judge, and the figures a decision reads; only timed cells were
        compared with each other and with the history."""
        cells, check = self.cells, self.history_check
        ok = sum(cell["status"] == "ok" for cell in cells)
        min_history = check["min_history"]
        tables = (
            _cells_table(KERNEL_COLUMNS, [c for c in cells if c["kind"] == "kernel"], min_history),
            _cells_table(E2E_COLUMNS, [c for c in cells if c["kind"] == "e2e"], min_history),
            Table(
                CAPACITY_COLUMNS,
                [[row.get(name) for name in _CAPACITY_FIELDS] for row in self.capacity],
            ),
            _cells_table(
                SERVED_STEP_COLUMNS,
                [c for c in cells if c["kind"] == "served_step"],
                min_history,
            ),
        )
        return RecordParts(
            summary=(
                f"matrix {self.matrix} on {self.hardware['key']}: {ok}/{len(cells)} cells "
                f"measured ({self.summary['cells_timed']} timed, "
                f"{self.summary['cells_functional_check']} functional check(s)); "
                f"{describe_history_check(len(self.regressions), check)}"
            ),
            metrics={
                "matrix": self.matrix,
                "hardware": self.hardware["key"],
                "cells": len(cells),
                "cells_measured": ok,
                "regressions": len(self.regressions),
                "cells_judged": check["cells_judged"],
                "cells_history_too_short": check["cells_history_too_short"],
                "min_history": min_history,
                **self.summary,
                "elapsed_s": round(self.elapsed_s, 1),
            },
            tables=dict(zip(self.RECORD_TABLES, tables, strict=True)),
            artifacts=files_by_name(self.results_file, *self.plots),
        )


def _cells_table(columns: list[str], cells: list[Cell], min_history: int) -> Table:
    """Every column but these is a field of the cell under the same name."""

    def row(cell: Cell) -> list[Scalar]:
        runs = cell.get("history_runs")
        computed = {
            "median_ms": cell["value"],
            "eager_ms": cell["value"],
            # Earlier runs compared with / the runs a judgement needs; None where none was read.
            "history_runs": None if runs is None else f"{runs}/{min_history}",
            "verdict": _verdict(cell),
        }
        return [computed[c] if c in computed else cell.get(c) for c in columns]

    return Table(columns, [row(cell) for cell in cells])


def _verdict(cell: Cell) -> str:
    """passed; a baseline's "not measured: why"; a failed cell's error."""
    if cell["status"] == "ok":
        return "passed"
    if cell["status"] == "not-measured":
        return f"not measured: {cell['error']}"
    return str(cell["error"] or "failed")
