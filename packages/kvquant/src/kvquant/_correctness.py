"""What the correctness check returns, and the correctness stage's record of it.

Imports neither torch nor Triton: the pipeline reads a check's JSON back here, in a process whose
Triton must not be switched to the interpreter (the check runs in a process of its own).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from adrkit.schema import RecordParts, Table, files_by_name


@dataclass(frozen=True)
class CaseResult:
    """One kernel case: its relative L2 error against the fp32 reference beside its tolerance,
    and the quantization's own error; ``error`` is why a kernel that did not run failed."""

    kernel: str
    dtype: str
    head_size: int
    block_size: int
    gqa: int
    rel_l2: float
    tolerance: float
    quant_rel_l2: float
    passed: bool
    error: str | None = None


@dataclass(frozen=True)
class EdgeResult:
    """One edge case: whether it held, and what it saw."""

    name: str
    passed: bool
    detail: str


ERROR_COLUMNS = [
    "kernel",
    "dtype",
    "head_size",
    "block_size",
    "gqa",
    "rel_l2",
    "tolerance",
    "quant_rel_l2",
    "verdict",
]


@dataclass(frozen=True)
class CorrectnessResult:
    """Every kernel case against its fp32 reference, and every edge case, on one device.
    ``to_dict`` is the JSON of ``kvquant check --json``; ``read`` reads such a file back and
    keeps its path, ``results_file``."""

    device: str
    triton: str
    cases: list[CaseResult]
    edge_cases: list[EdgeResult]
    results_file: str | None = field(default=None, compare=False)

    RECORD_TABLES: ClassVar[tuple[str, ...]] = ("errors", "edge-cases")

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases) and all(e.passed for e in self.edge_cases)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "device": self.device,
            "triton": self.triton,
            "cases": [asdict(c) for c in self.cases],
            "edge_cases": [asdict(e) for e in self.edge_cases],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CorrectnessResult:
        return cls(
            device=data["device"],
            triton=data["triton"],
            cases=[CaseResult(**case) for case in data["cases"]],
            edge_cases=[EdgeResult(**edge) for edge in data["edge_cases"]],
        )

    @classmethod
    def read(cls, path: Path) -> CorrectnessResult:
        result = cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        return replace(result, results_file=str(path))

    def record_parts(self) -> RecordParts:
        """The correctness stage's record: each case's error beside its tolerance, each edge
        case's verdict, and the worst error as a fraction of its tolerance."""
        cases, edges = self.cases, self.edge_cases
        worst = max((_error_to_tolerance(c.rel_l2, c.tolerance) for c in cases), default=0.0)
        passed_cases = sum(c.passed for c in cases)
        passed_edges = sum(e.passed for e in edges)
        tables = (
            Table(
                ERROR_COLUMNS,
                [
                    [
                        c.kernel,
                        c.dtype,
                        c.head_size,
                        c.block_size,
                        c.gqa,
                        c.rel_l2,
                        c.tolerance,
                        c.quant_rel_l2,
                        "passed" if c.passed else c.error or "failed",
                    ]
                    for c in cases
                ],
            ),
            Table(
                ["case", "verdict", "detail"],
                [[e.name, "passed" if e.passed else "failed", e.detail] for e in edges],
            ),
        )
        return RecordParts(
            summary=(
                f"{passed_cases}/{len(cases)} kernel cases and {passed_edges}/{len(edges)} "
                f"edge cases pass on {self.device} (triton {self.triton})"
            ),
            metrics={
                "device": self.device,
                "triton": self.triton,
                "cases": len(cases),
                "cases_passed": passed_cases,
                "edge_cases": len(edges),
                "edge_cases_passed": passed_edges,
                "edge_cases_failed": len(edges) - passed_edges,
                "worst_error_to_tolerance": worst,
            },
            tables=dict(zip(self.RECORD_TABLES, tables, strict=True)),
            artifacts=files_by_name(self.results_file),
        )


def _error_to_tolerance(error: float, tolerance: float) -> float:
    """How much of its tolerance a case used; an exact case (tolerance 0) uses none or all."""
    if tolerance > 0:
        return error / tolerance
    return 0.0 if error == 0 else float("inf")
