"""The human-readable build report: per-target totals, resource table, gates and the diff."""

from __future__ import annotations

from typing import Any

from ._result import BuildResult


def _cell_name(entry: dict[str, Any]) -> str:
    constexprs = entry["specialization"]["constexprs"]
    shape = " ".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in constexprs.items())
    return f"{entry['kernel']} [{shape}]"


def format_report(result: BuildResult, *, table: bool = False) -> str:
    """Text for the CLI: totals, each failure with its message, gates, diff; all cells if table."""
    cells = result.cells
    lines = [f"kvquant build: {len(cells)} cells, {result.cached} from the cache, "
             f"{len(result.failures)} failed, {result.elapsed_s:.1f} s"]  # fmt: skip
    if table:
        lines.append(f"{'target':<7} {'vgpr':>4} {'agpr':>4} {'sgpr':>4} {'lds':>6} "
                     f"{'spill':>5} {'waves':>5}  cell")  # fmt: skip
        for e in sorted(cells, key=lambda e: (e["target"], _cell_name(e))):
            if e["status"] != "ok":
                continue
            vgprs = e.get("vgprs", e.get("registers"))
            lines.append(
                f"{e['target']:<7} {vgprs!s:>4} {e.get('agprs', '-')!s:>4} "
                f"{e.get('sgprs', '-')!s:>4} {e['lds_bytes']:>6} "
                f"{e.get('vgpr_spills', '-')!s:>5} {e.get('waves_per_simd', '-')!s:>5}  "
                f"{_cell_name(e)}"
            )
    for failure in result.failures:
        message = failure["error"].strip().splitlines()
        lines.append(f"FAILED {failure['target']} {_cell_name(failure)}: {message[-1]}")
    for gate in result.gates:
        verdict = "ok  " if gate.passed else "FAIL"
        breaking = "" if gate.passed else f" ({len(gate.failing_cells)} cells)"
        lines.append(
            f"gate {verdict} {gate.name}: worst {gate.value} {gate.op} {gate.threshold}{breaking}"
        )
    if result.diff:
        lines.append(f"changes against the previous manifest ({len(result.diff)}):")
        lines += [
            f"  {d['target']} {_cell_name(d)} {d['field']}: {d['old']} -> {d['new']}"
            for d in result.diff
        ]
    elif result.compared_with:
        lines.append(f"no resource use changed against {result.compared_with}")
    lines.append(f"manifest: {result.manifest}")
    return "\n".join(lines)
