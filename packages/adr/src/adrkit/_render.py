"""Rendering a block from the evidence: per hardware class where a stage runs on several.

A block of a stage that `hardware.toml` expects on several hardware classes shows one section
per class that has a record, newest first, each headed by the class's name and ending with the
record's run, commit and date; then one line for every expected class that has none ("not yet
run", or for a GPU architecture the nightly kernel build targets, "compiled, not yet run"). Other
blocks show the newest record of their stage, whatever its class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from adrkit._blocks import BLOCKS
from adrkit._errors import RenderError
from adrkit._evidence import Evidence, HardwareClasses
from adrkit._markdown import Markdown, code_cell, markdown_table, markdown_text, source_line
from adrkit._record import Record, Scalar
from adrkit._stage_renderer import StageRenderer
from adrkit._summary import (
    SUMMARY_KEYS,
    Decisions,
    compiled_for,
    render_summary,
    summary_label,
)


@dataclass(frozen=True)
class Shown:
    """What the blocks of an update show: the evidence, the hardware classes the team expects,
    and the decision summaries' rows."""

    evidence: Evidence
    hardware: HardwareClasses = field(default_factory=HardwareClasses)
    decisions: Decisions = field(default_factory=Decisions)


EvidenceRenderer = Callable[[Shown, str], str]


def render_pipeline_status(shown: Shown, lang: str) -> str:
    """Every stage's newest status on each hardware class, with the run that produced it. The
    detail is the failed gates' names, or the stage's own message where it did not finish: both
    quoted as written, since no record sentence is in the ADR's language."""
    evidence, hardware = shown.evidence, shown.hardware
    rows: list[list[Scalar]] = []
    records: list[Record] = []
    for stage in sorted(evidence.files):
        for class_id, found in evidence.by_class(stage):
            r = found.record
            failed = [code_cell(g.name) for g in r.gates if not g.passed]
            if failed:
                detail: Scalar = Markdown(", ".join(failed))
            elif r.status != "passed" and r.reason:
                detail = code_cell(r.reason)
            else:
                detail = None
            passed = sum(g.passed for g in r.gates)
            rows.append(
                [
                    # A stage's name, never a cell word to translate ("kernels" is one).
                    Markdown(markdown_text(stage)),
                    hardware.label(class_id, lang, r),
                    r.status,
                    detail,
                    f"{passed}/{len(r.gates)}",
                    r.provenance.run_id,
                ]
            )
            records.append(r)
    columns = ["stage", "hardware", "status", "detail", "gates", "run"]
    table = markdown_table(lang, columns, rows)
    return "\n\n".join([table, *(source_line(record, lang) for record in records)])


def _summary(block: str) -> EvidenceRenderer:
    def render(shown: Shown, lang: str) -> str:
        return render_summary(block, shown.evidence, shown.hardware, shown.decisions, lang)

    return render


EVIDENCE_BLOCKS: dict[str, EvidenceRenderer] = {
    "pipeline-status": render_pipeline_status,
    **{key: _summary(key) for key in SUMMARY_KEYS},
}


def block_keys() -> list[str]:
    return sorted({*BLOCKS, *EVIDENCE_BLOCKS})


def render_block(key: str, shown: Shown | Mapping[str, Record], lang: str) -> str:
    """The body of block ``key`` in the ADR language ``lang``, from ``shown`` or from records
    held in memory (stage -> record: one hardware class each, no expected classes)."""
    if not isinstance(shown, Shown):
        shown = Shown(Evidence.of(shown.values()))
    evidence, hardware = shown.evidence, shown.hardware
    if key in EVIDENCE_BLOCKS:
        return EVIDENCE_BLOCKS[key](shown, lang)
    renderer = BLOCKS.get(key)
    if renderer is None:
        msg = f"no renderer knows block key {key!r}; known keys: {', '.join(block_keys())}"
        raise RenderError(msg)
    latest = {stage: found.record for stage, found in evidence.latest_by_stage().items()}
    if isinstance(renderer, StageRenderer) and renderer.stage in hardware.per_hardware_stages:
        return _per_hardware(renderer, evidence, hardware, lang, latest)
    return renderer(latest, lang)


def _per_hardware(
    renderer: StageRenderer,
    evidence: Evidence,
    hardware: HardwareClasses,
    lang: str,
    latest: dict[str, Record],
) -> str:
    stage = renderer.stage
    sections = []
    present = set()
    for class_id, found in evidence.by_class(stage):
        present.add(class_id)
        heading = f"**{markdown_text(hardware.label(class_id, lang, found.record))}**"
        sections.append(heading + "\n\n" + renderer({**latest, stage: found.record}, lang))
    for expected in hardware.expected(stage):
        if expected.id in present:
            continue
        key = "compiled-not-yet-run" if compiled_for(evidence, expected.id) else "not-yet-run"
        name = hardware.label(expected.id, lang)
        sections.append("_" + markdown_text(summary_label(lang, key, hardware=name)) + "_")
    if not present and not sections:
        return renderer(latest, lang)
    if not present:  # no class ran the stage: say so once, then which classes are expected
        sections.insert(0, renderer(latest, lang))
    return "\n\n".join(sections)
