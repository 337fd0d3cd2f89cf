"""The blocks of the kernel build (ADR 0009): its resource use, one set of columns per Triton
release it was built with (the one the gfx90a target runs first, as the build names it), and the
launch shapes each target compiles. A line above each table names the target's release and where
that is stated, or why the build at it is missing; a check's own words are quoted as code.
"""

from __future__ import annotations

from adrkit._block_sources import BLOCK_SOURCES
from adrkit._labels import label
from adrkit._markdown import code_cell, markdown_text
from adrkit._stage_renderer import Records, StageRenderer, render_record_table
from adrkit.schema import Record, Scalar, Table

_STAGE = BLOCK_SOURCES["kvquant-resources"].stage
# Per Triton release, in this order: the figures a reader compares between releases.
_PER_RELEASE = ("failed", "vgprs", "agprs", "lds_bytes", "spill_bytes", "waves_per_simd")
_KEY = ("target", "kernel", "cache")
_NEEDED = frozenset({"triton", "triton_role", "cells", *_KEY, *_PER_RELEASE})


def _release_heading(lang: str, release: str, role: str) -> str:
    roles = [label(lang, f"triton-{r}") for r in role.split(",") if r]
    return label(
        lang, "triton-release", release=release, roles=label(lang, "list-separator").join(roles)
    )


def _pivot(table: Table, lang: str) -> tuple[list[str], list[list[Scalar]]]:
    """One row per (target, kernel, cache), with the cells' count and each release's figures
    under its own headings, releases in the order the build gave them (the target's first)."""
    rows = table.keyed_rows()
    releases: dict[str, str] = {}
    for row in rows:
        releases.setdefault(str(row["triton"]), str(row["triton_role"] or ""))
    by_key: dict[tuple[Scalar, ...], dict[str, dict[str, Scalar]]] = {}
    for row in rows:
        by_key.setdefault(tuple(row[k] for k in _KEY), {})[str(row["triton"])] = row
    columns = [*_KEY, "cells"]
    for release, role in releases.items():
        heading = _release_heading(lang, release, role)
        # Already in the ADR's words: a heading no label table knows shows as itself.
        columns += [f"{label(lang, field)} · {heading}" for field in _PER_RELEASE]
    body: list[list[Scalar]] = []
    for key, found in by_key.items():
        cells = max((int(r["cells"] or 0) for r in found.values()), default=0)
        line: list[Scalar] = [*key, cells]
        for release in releases:
            row = found.get(release, {})
            line += [row.get(field) for field in _PER_RELEASE]
        body.append(line)
    return columns, body


def _target_line(record: Record, lang: str) -> str | None:
    """Which Triton the gfx90a target runs and where that is stated; why its build is missing."""
    target, source = record.metrics.get("triton_target"), record.metrics.get("triton_target_source")
    missing = record.metrics.get("triton_target_not_built")
    if not isinstance(target, str):
        return None
    parts = [markdown_text(label(lang, "triton-target-line", release=target))]
    if isinstance(source, str):
        parts.append(code_cell(source))
    line = " ".join(parts)
    if isinstance(missing, str):
        line += " " + markdown_text(label(lang, "triton-not-built")) + " " + code_cell(missing)
    return f"_{line}_"


def _with_target_line(renderer: StageRenderer) -> StageRenderer:
    def render(records: Records, lang: str) -> str:
        body = renderer(records, lang)
        record = records.get(_STAGE)
        line = _target_line(record, lang) if record is not None else None
        return body if line is None else f"{line}\n\n{body}"

    return StageRenderer(renderer.stage, render)


KERNEL_BLOCKS = {
    "kvquant-resources": _with_target_line(
        render_record_table("kvquant-resources", "no-cases", present=(_pivot, _NEEDED))
    ),
    "kvquant-specializations": _with_target_line(
        render_record_table("kvquant-specializations", "no-cases", verbatim=frozenset({"launch"}))
    ),
}
