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

from adrkit._answers import compiled_for
from adrkit._block_sources import BLOCK_SOURCES
from adrkit._blocks import BLOCKS
from adrkit._errors import RenderError
from adrkit._evidence import Evidence, HardwareClasses
from adrkit._freshness import Sources, stale, stale_note
from adrkit._labels import label
from adrkit._markdown import Markdown, code_cell, markdown_table, markdown_text, source_line
from adrkit._stage_renderer import StageRenderer
from adrkit._summary import SUMMARY_KEYS, Decisions, render_summary
from adrkit._summary_words import summary_label
from adrkit.schema import Record, Scalar


@dataclass(frozen=True)
class Shown:
    """What the blocks of an update show: the evidence, the hardware classes the team expects,
    and the decision summaries' rows."""

    evidence: Evidence
    hardware: HardwareClasses = field(default_factory=HardwareClasses)
    decisions: Decisions = field(default_factory=Decisions)
    sources: Sources = field(default_factory=Sources)

    def stale_line(self, record: Record | None, lang: str) -> str | None:
        """The italic line a block shows under a record whose sources changed since it ran."""
        found = stale(record, self.sources) if record is not None else None
        return None if found is None else f"_{stale_note(found, self.sources, lang)}_"


EvidenceRenderer = Callable[[Shown, str], str]


def render_pipeline_status(shown: Shown, lang: str) -> str:
    """Every stage's newest status on each hardware class, with the run and the commit that
    produced it (and, when its sources changed since, which); then each hardware class that
    `hardware.toml` expects to run the stage and that has no record of it, as not yet run. The
    detail is the failed gates' names, or the stage's own message where it did not finish: both
    quoted as written, since no record sentence is in the ADR's language."""
    evidence, hardware = shown.evidence, shown.hardware
    rows: list[list[Scalar]] = []
    records: list[Record] = []
    expected_stages = {stage for c in hardware.classes for stage in c.stages}
    for stage in sorted(evidence.files.keys() | expected_stages):
        # A stage's name, never a cell word to translate ("kernels" is one).
        name = Markdown(markdown_text(stage))
        ran = dict(evidence.by_class(stage))
        for class_id, found in ran.items():
            r = found.record
            failed = [code_cell(g.name) for g in r.gates if not g.passed]
            if failed:
                detail: Scalar = Markdown(", ".join(failed))
            elif r.status != "passed" and r.reason:
                detail = code_cell(r.reason)
            else:
                detail = None
            passed = sum(g.passed for g in r.gates)
            gates = f"{passed}/{len(r.gates)}"
            label = hardware.label(class_id, lang, r)
            commit = _commit_cell(shown, r, lang)
            rows.append([name, label, r.status, detail, gates, r.provenance.run_id, commit])
            records.append(r)
        for missing in hardware.expected(stage):
            if missing.id not in ran:
                key = "compiled-not-run" if compiled_for(evidence, missing.id) else "not-run"
                rows.append([name, hardware.label(missing.id, lang), key, None, None, None, None])
    columns = ["stage", "hardware", "status", "detail", "gates", "run", "evidence_commit"]
    table = markdown_table(lang, columns, rows)
    return "\n\n".join([table, *(source_line(record, lang) for record in records)])


def _commit_cell(shown: Shown, record: Record, lang: str) -> Markdown:
    """The record's commit, and its stale note when its sources changed since."""
    commit = code_cell((record.provenance.repo_commit or "unknown")[:12])
    found = stale(record, shown.sources)
    if found is None:
        return commit
    note = stale_note(found, shown.sources, lang)
    return Markdown(label(lang, "with-note", text=commit, note=note))


def render_evidence_sources(shown: Shown, lang: str) -> str:
    """The source files each stage's records carry the hashes of (sources.toml), by stage."""
    sets = shown.sources.sets
    if not sets:
        return markdown_text(label(lang, "no-sources"))
    rows: list[list[Scalar]] = [
        [
            Markdown(markdown_text(stage)),
            shown.sources.what(stage, lang),
            Markdown("<br>".join(code_cell(pattern) for pattern in found.patterns)),
        ]
        for stage, found in sets.items()
    ]
    return markdown_table(lang, ["stage", "source_set", "source_files"], rows)


def _summary(block: str) -> EvidenceRenderer:
    def render(shown: Shown, lang: str) -> str:
        return render_summary(
            block, shown.evidence, shown.hardware, shown.decisions, lang, shown.sources
        )

    return render


EVIDENCE_BLOCKS: dict[str, EvidenceRenderer] = {
    "pipeline-status": render_pipeline_status,
    "evidence-sources": render_evidence_sources,
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
        return _per_hardware(renderer, shown, lang, latest)
    source = BLOCK_SOURCES.get(key)
    note = shown.stale_line(latest.get(source.stage), lang) if source is not None else None
    return "\n\n".join([renderer(latest, lang), *([note] if note else [])])


def _per_hardware(
    renderer: StageRenderer, shown: Shown, lang: str, latest: dict[str, Record]
) -> str:
    evidence, hardware, stage = shown.evidence, shown.hardware, renderer.stage
    sections = []
    present = set()
    for class_id, found in evidence.by_class(stage):
        present.add(class_id)
        heading = f"**{markdown_text(hardware.label(class_id, lang, found.record))}**"
        body = renderer({**latest, stage: found.record}, lang)
        note = shown.stale_line(found.record, lang)
        sections.append("\n\n".join([heading, body, *([note] if note else [])]))
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
