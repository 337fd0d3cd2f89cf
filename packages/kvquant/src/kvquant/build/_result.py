"""What a build returns: the manifest's cells, the gate verdicts, the diff, and its record."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from adrkit.schema import Gate, RecordParts, Scalar, Table

# A manifest cell: its kernel, target and specialization, status and error, and the resource
# fields the compiler reported (`DIFF_FIELDS`); JSON, as manifest.json holds it.
ManifestCell = dict[str, Any]


@dataclass(frozen=True)
class BuildGate:
    """A gate of the matrix, judged on the worst value of its field over the cells that have
    it (None: no cell has the field, and nothing breaks the gate)."""

    name: str
    field: str
    value: float | None
    op: str
    threshold: float
    passed: bool
    failing_cells: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "field": self.field,
            "value": self.value,
            "op": self.op,
            "threshold": self.threshold,
            "passed": self.passed,
            "failing_cells": self.failing_cells,
        }


# The resources table: one row per (target, kernel, cache), each figure the worst of its cells.
RESOURCE_COLUMNS = [
    "target",
    "kernel",
    "cache",
    "cells",
    "failed",
    "vgprs",
    "agprs",
    "sgprs",
    "lds_bytes",
    "spill_bytes",
    "scratch_bytes",
    "waves_per_simd",
]
DIFF_COLUMNS = ["target", "kernel", "specialization", "field", "old", "new"]


@dataclass(frozen=True)
class BuildResult:
    """One build: every cell of the manifest (``cells``), the matrix's gates, the changes of
    resource use against ``compared_with`` (a manifest path; None when there was none), the
    seconds it took and how many cells came from the cache. ``to_dict`` is its JSON."""

    manifest: str
    cells: list[ManifestCell]
    gates: list[BuildGate]
    diff: list[dict[str, Any]]
    compared_with: str | None
    elapsed_s: float
    cached: int
    triton_version: str = ""

    RECORD_TABLES: ClassVar[tuple[str, ...]] = ("resources", "resource-diff")

    @property
    def failures(self) -> list[ManifestCell]:
        return [cell for cell in self.cells if cell["status"] == "failed"]

    @property
    def passed(self) -> bool:
        """Every cell built and every gate held."""
        return not self.failures and all(gate.passed for gate in self.gates)

    def to_dict(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest,
            "cells": self.cells,
            "failures": self.failures,
            "gates": [gate.to_dict() for gate in self.gates],
            "diff": self.diff,
            "compared_with": self.compared_with,
            "elapsed_s": self.elapsed_s,
            "cached": self.cached,
            "triton_version": self.triton_version,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BuildResult:
        """The result as ``to_dict`` wrote it."""
        return cls(
            manifest=data["manifest"],
            cells=data["cells"],
            gates=[BuildGate(**gate) for gate in data["gates"]],
            diff=data["diff"],
            compared_with=data["compared_with"],
            elapsed_s=data["elapsed_s"],
            cached=data["cached"],
            triton_version=data.get("triton_version", ""),
        )

    def record_parts(self) -> RecordParts:
        """The kernels stage's record: the worst resource use per kernel, the diff against the
        previous build (which says when there was none), and the matrix's gates."""
        compared = self.compared_with is not None
        changes = (
            f"{len(self.diff)} resource changes"
            if compared
            else "no previous build to compare resource use against"
        )
        built = len(self.cells) - len(self.failures)
        targets = ", ".join(sorted({cell["target"] for cell in self.cells}))
        diff_rows: list[list[Scalar]] = [
            [
                d["target"],
                d["kernel"],
                str(d["specialization"])[:120],
                d["field"],
                d["old"],
                d["new"],
            ]
            for d in self.diff
        ]
        tables = (
            Table(RESOURCE_COLUMNS, resource_rows(self.cells)),
            Table(DIFF_COLUMNS, diff_rows, baseline_found=compared),
        )
        return RecordParts(
            summary=(
                f"{built}/{len(self.cells)} kernel cells build for {targets} "
                f"({self.cached} from the cache, {self.elapsed_s:.0f} s); {changes}"
            ),
            metrics={
                "cells": len(self.cells),
                "cells_failed": len(self.failures),
                "cached": self.cached,
                "elapsed_s": round(self.elapsed_s, 1),
            },
            tables=dict(zip(self.RECORD_TABLES, tables, strict=True)),
            gates=[
                Gate(gate.name, gate.value, gate.op, gate.threshold, gate.passed)
                for gate in self.gates
                if gate.value is not None
            ],
            artifacts={"manifest": self.manifest},
        )


def resource_rows(cells: Iterable[ManifestCell]) -> list[list[Scalar]]:
    """One row per (target, kernel, cache): the worst cell of each, so the table stays short."""
    groups: dict[tuple[str, str, str], list[ManifestCell]] = defaultdict(list)
    for cell in cells:
        constexprs = cell["specialization"]["constexprs"]
        quantized = constexprs.get("QUANTIZED", constexprs.get("QUANTIZE"))
        cache = "int8" if quantized else ("16-bit" if quantized is not None else "—")
        groups[(cell["target"], cell["kernel"], cache)].append(cell)

    def worst(group: list[ManifestCell], name: str, pick: Callable[..., Any] = max) -> Scalar:
        values = [c[name] for c in group if c.get(name) is not None]
        return pick(values) if values else None

    def registers(group: list[ManifestCell]) -> Scalar:
        # gfx90a reports VGPRs; NVIDIA has one register file, reported as `registers`.
        return worst(group, "vgprs" if group[0]["target"] == "gfx90a" else "registers")

    return [
        [
            target,
            kernel,
            cache,
            len(group),
            sum(c["status"] != "ok" for c in group),
            registers(group),
            worst(group, "agprs"),
            worst(group, "sgprs"),
            worst(group, "lds_bytes"),
            worst(group, "spill_bytes"),
            worst(group, "scratch_bytes"),
            worst(group, "waves_per_simd", min),
        ]
        for (target, kernel, cache), group in sorted(groups.items())
    ]
