"""Kernel and end-to-end throughput of 16-bit against INT8 KV caches, with a history.

``run_throughput`` runs a declared matrix (TOML): kvquant's kernels through one driver, and
``vllm bench throughput|latency`` cells as subprocesses. It computes the KV capacity for a fixed
budget, compares every cell with its recent history on the same hardware, flags regressions
beyond the history's noise, stores the run (SQLite by default, any SQLAlchemy URL) and plots it.
"""

from __future__ import annotations

from ._errors import EngineMissingError, HistoryError, MatrixError, ThroughputError
from ._history import History, default_history_url
from ._matrix import Gates, Matrix, load_matrix
from ._regression import Verdict, judge
from ._run import run_throughput

__all__ = [
    "EngineMissingError",
    "Gates",
    "History",
    "HistoryError",
    "Matrix",
    "MatrixError",
    "ThroughputError",
    "Verdict",
    "default_history_url",
    "judge",
    "load_matrix",
    "run_throughput",
]
