"""The parts of a results record that a kvquant or kvbench result gives its pipeline stage.

A result (the AOT build's, the correctness check's, kvbench's runs) builds its own summary,
metrics, tables and gate verdicts, in the shapes the pipeline's results record holds: JSON
scalars, tables of column ids and rows, gates kept with the threshold they were judged against.
The pipeline's flows only copy them into the record. Nothing here imports torch or Triton, and
kvquant does not depend on the record's package: the GPU nodes install kvquant alone.

`holds` is the one gate comparison of kvquant and kvbench; the record's package judges each gate
again when the record is built, and refuses a verdict that disagrees.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# A metric or table cell: a JSON scalar.
Scalar = str | int | float | bool | None

_COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
    "==": operator.eq,
}
COMPARISONS = tuple(_COMPARISONS)


def holds(value: float, op: str, threshold: float) -> bool:
    """``value op threshold``; a value or threshold that is not finite never holds (an infinite
    one would pass a ``<=`` or ``>=`` it cannot have met). Raises ValueError for an unknown op."""
    compare = _COMPARISONS.get(op)
    if compare is None:
        raise ValueError(f"gate op {op!r} is not one of {', '.join(COMPARISONS)}")
    return math.isfinite(value) and math.isfinite(threshold) and compare(value, threshold)


@dataclass(frozen=True)
class GateCheck:
    """A pass/fail verdict on one figure, kept with the threshold it was judged against."""

    name: str
    value: float
    op: str
    threshold: float
    passed: bool

    @classmethod
    def judge(cls, name: str, value: float, op: str, threshold: float) -> GateCheck:
        return cls(name, float(value), op, float(threshold), holds(value, op, threshold))


@dataclass(frozen=True)
class RecordTable:
    """A table of a record: column ids (the ADRs translate them) and rows of scalars.

    ``baseline_found`` belongs to a table of differences against an earlier result: False when
    there was none, so no rows means "nothing to compare against"; None for any other table.
    """

    columns: list[str]
    rows: list[list[Scalar]]
    baseline_found: bool | None = None


@dataclass(frozen=True)
class RecordParts:
    """What a result gives its stage's record: the summary line, the metrics, the tables, the
    verdicts of its own gates and the files it wrote (name -> path)."""

    summary: str
    metrics: dict[str, Scalar]
    tables: dict[str, RecordTable]
    gates: list[GateCheck] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)


def files_by_name(*paths: str | None) -> dict[str, str]:
    """A record's artifacts: each file (None: not written) under its file name."""
    return {Path(path).name: path for path in paths if path is not None}
