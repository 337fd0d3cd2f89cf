"""Kernel and end-to-end throughput of 16-bit against INT8 KV caches, with a history.

``run_throughput`` runs a declared matrix (TOML): kvquant's kernels through one driver, timed as
kvquant's benchmarks time them (``kvquant.timing``), and ``vllm bench throughput|latency`` cells
as subprocesses. It computes the KV capacity for a fixed budget, compares every timed cell with
its recent history on the same hardware, flags regressions beyond the history's noise, stores the
run (SQLite by default, any SQLAlchemy URL) and plots it. A cell that ran a reference path (the
kernels in Triton's CPU interpreter, vLLM's INT8 cache served by kvquant's fp32 torch reference)
is a functional check: reported, never compared for speed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import (
    EngineMissingError,
    HistoryError,
    MatrixError,
    OutputError,
    ThroughputError,
)
from ._matrix import Gates, Matrix, load_matrix
from ._regression import Verdict, describe_history_check, judge
from ._result import ThroughputResult

if TYPE_CHECKING:
    from ._history import History, default_history_url
    from ._run import run_throughput

# Names whose modules need the `throughput` extra (SQLAlchemy, Alembic, matplotlib) load on first
# use: `kvbench`'s command line imports every family to register it, and `kvbench accuracy` must
# run where only the `accuracy` extra is installed.
_NEEDS_EXTRA = {"History": "_history", "default_history_url": "_history", "run_throughput": "_run"}


def __getattr__(name: str) -> Any:
    if name not in _NEEDS_EXTRA:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_NEEDS_EXTRA[name]}", __name__), name)


__all__ = [
    "EngineMissingError",
    "Gates",
    "History",
    "HistoryError",
    "Matrix",
    "MatrixError",
    "OutputError",
    "ThroughputError",
    "ThroughputResult",
    "Verdict",
    "default_history_url",
    "describe_history_check",
    "judge",
    "load_matrix",
    "run_throughput",
]
