"""The decision summaries: one row per question a decision rests on, answered from the evidence.

``<adr dir>/decisions.toml`` declares, per summary block (``decision-0009``, ``decision-0010``,
``decision-0012``), its rows in order: which answer (one of `ANSWERS`, each reading named tables
and metrics of one stage's records), the question in each language, an optional gate on the
row's figure, and whether a milestone needs the row. A row shows its answer, figure, hardware,
date and verdict; a row nothing measured says "not measured" and why. `milestone_problems` is
what a strict milestone run checks: every row it needs measured, passing and fresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from adrkit._answers import ANSWERS
from adrkit._errors import AdrError
from adrkit._evidence import (
    Evidence,
    HardwareClasses,
    collect,
    hardware_class,
    load_hardware,
    read_source,
    read_store,
)
from adrkit._files import is_language_table, read_declarations
from adrkit._freshness import Sources, load_sources, stale, stale_note
from adrkit._labels import label
from adrkit._markdown import Markdown, code_cell, markdown_table, markdown_text
from adrkit._summary_words import (
    STATUS_WORDS,
    Measured,
    NotMeasured,
    Result,
    summary_label,
)
from adrkit.schema import Gate, Record, RecordError, Scalar, gate_rule

DECISIONS_FILE = "decisions.toml"
_MAX_DECISIONS_BYTES = 256 * 2**10


@dataclass(frozen=True)
class RowSpec:
    id: str
    answer: str
    question: dict[str, str]
    gate: tuple[str, float] | None = None
    milestone: bool = False


@dataclass(frozen=True)
class Decisions:
    blocks: dict[str, tuple[RowSpec, ...]] = field(default_factory=dict)
    max_age_days: float | None = None


@dataclass(frozen=True)
class DecisionRow:
    """One rendered row: the question, and what the evidence says, with its verdict."""

    spec: RowSpec
    result: Measured | NotMeasured
    verdict: str  # passed | failed | inconclusive | no-gate | not-measured

    @property
    def record(self) -> Record | None:
        return self.result.record if isinstance(self.result, Measured) else None


# ---- the declarations, the rows and the blocks ----


def load_decisions(adr_dir: Path) -> Decisions:
    """``<adr dir>/decisions.toml``, checked whole; no file means no summaries."""
    path = adr_dir / DECISIONS_FILE
    data = read_declarations(path, _MAX_DECISIONS_BYTES)
    if data is None:
        return Decisions()
    max_age = None
    blocks: dict[str, tuple[RowSpec, ...]] = {}
    for key, value in data.items():
        if key == "milestone":
            max_age = _max_age(path, value)
        elif key in SUMMARY_KEYS and isinstance(value, list):
            blocks[key] = tuple(_row_spec(path, key, i, entry) for i, entry in enumerate(value))
        else:
            msg = f"{path}: `{key}` is not one of milestone, {', '.join(SUMMARY_KEYS)} ([[...]])"
            raise AdrError(msg)
    return Decisions(blocks, max_age)


def _max_age(path: Path, value: object) -> float:
    age = value.get("max_age_days") if isinstance(value, dict) else None
    if not isinstance(value, dict) or set(value) != {"max_age_days"} or not _positive(age):
        msg = f"{path}: [milestone] must hold exactly `max_age_days`, a positive number"
        raise AdrError(msg)
    return float(age)  # type: ignore[arg-type]


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _row_spec(path: Path, block: str, index: int, entry: object) -> RowSpec:
    where = f"{path}: {block}[{index}]"
    known = {"answer", "question", "gate", "milestone"}
    if not isinstance(entry, dict) or not {"answer", "question"} <= set(entry) <= known:
        msg = f"{where} must be a table of `answer`, `question` and optional `gate`, `milestone`"
        raise AdrError(msg)
    answer, question = entry["answer"], entry["question"]
    if answer not in ANSWERS:
        msg = f"{where}: answer {answer!r} is not one of {', '.join(ANSWERS)}"
        raise AdrError(msg)
    if not is_language_table(question):
        msg = f"{where}: `question` must be a table of language = text"
        raise AdrError(msg)
    gate = entry.get("gate")
    parsed_gate = None
    if gate is not None:
        try:
            parsed_gate = gate_rule(answer, gate)
        except RecordError as exc:
            raise AdrError(f"{where}: `gate` {exc}") from None
    milestone = entry.get("milestone", False)
    if not isinstance(milestone, bool):
        msg = f"{where}: `milestone` must be true or false"
        raise AdrError(msg)
    return RowSpec(answer, answer, dict(question), parsed_gate, milestone)


def decision_rows(
    block: str, decisions: Decisions, evidence: Evidence, hardware: HardwareClasses, lang: str
) -> list[DecisionRow]:
    rows = []
    for spec in decisions.blocks.get(block, ()):
        result = ANSWERS[spec.answer](evidence, hardware, lang)
        rows.append(DecisionRow(spec, result, _verdict(spec, result)))
    return rows


def _verdict(spec: RowSpec, result: Result) -> str:
    if isinstance(result, NotMeasured):
        return "not-measured"
    if spec.gate is not None and result.value is not None:
        op, threshold = spec.gate
        gate_verdict = (
            "passed" if Gate.judge(spec.id, result.value, op, threshold).passed else "failed"
        )
        if result.verdict == "failed":
            return "failed"
        return gate_verdict
    return result.verdict or "no-gate"


def render_summary(
    block: str,
    evidence: Evidence,
    hardware: HardwareClasses,
    decisions: Decisions,
    lang: str,
    sources: Sources | None = None,
) -> str:
    """The decision summary ``block``: a table of its rows, in the ADR's language; each row
    names the commit its evidence came from, and says so when the sources it measured changed
    since (``sources``: none judged when None)."""
    rows = decision_rows(block, decisions, evidence, hardware, lang)
    if not rows:
        return markdown_text(summary_label(lang, "no-decisions", file=DECISIONS_FILE))
    judged = sources or Sources()
    return markdown_table(lang, _COLUMNS, [_cells(row, hardware, lang, judged) for row in rows])


_COLUMNS = [
    "question",
    "answer",
    "evidence_figure",
    "hardware",
    "date",
    "evidence_commit",
    "verdict",
]


def _cells(
    row: DecisionRow, hardware: HardwareClasses, lang: str, sources: Sources
) -> list[Scalar]:
    question = row.spec.question.get(lang) or row.spec.question.get("en") or row.spec.id
    verdict = Markdown(markdown_text(_verdict_word(row.verdict, lang)))
    if isinstance(row.result, NotMeasured):
        missing = Markdown(markdown_text(summary_label(lang, "not-measured")))
        return [question, Markdown(row.result.why), missing, None, None, None, verdict]
    record = row.result.record
    name = hardware.label(hardware_class(record), lang, record)
    date = record.provenance.ended.strftime("%Y-%m-%d")
    commit = code_cell((record.provenance.repo_commit or "unknown")[:12])
    found = stale(record, sources)
    if found is not None:
        note = stale_note(found, sources, lang)
        commit = Markdown(label(lang, "with-note", text=commit, note=note))
    return [
        question,
        Markdown(row.result.answer),
        Markdown(markdown_text(row.result.figure)),
        name,
        date,
        commit,
        verdict,
    ]


def _verdict_word(verdict: str, lang: str) -> str:
    if verdict in STATUS_WORDS[lang]:
        return STATUS_WORDS[lang][verdict]
    key = {"not-measured": "not-measured", "no-gate": "no-gate", "inconclusive": "inconclusive"}
    return summary_label(lang, key[verdict])


def milestone_problems(
    adr_dir: Path, results: Path | None, now: datetime | None = None
) -> list[str]:
    """One line per decision-summary row a milestone needs (``milestone = true``) that is not
    measured, failed, older than ``max_age_days``, or stale (its sources changed since it ran,
    `adrkit._freshness`), from the evidence of ``results`` and the store; empty when the
    milestone's evidence stands."""
    decisions, hardware = load_decisions(adr_dir), load_hardware(adr_dir)
    declared = load_sources(adr_dir)
    read = [*(read_source(results) if results is not None else []), *read_store(adr_dir)]
    evidence = collect(read)
    now = now or datetime.now(UTC)
    problems = []
    for block in decisions.blocks:
        for row in decision_rows(block, decisions, evidence, hardware, "en"):
            if not row.spec.milestone:
                continue
            where = f"{block} row `{row.spec.id}`"
            if isinstance(row.result, NotMeasured):
                problems.append(f"{where}: not measured ({row.result.why})")
                continue
            if row.verdict == "failed":
                problems.append(f"{where}: failed ({row.result.figure})")
            found = stale(row.result.record, declared)
            if found is not None:
                problems.append(f"{where}: {_plain(stale_note(found, declared, 'en'))}")
            age = now - row.result.record.provenance.ended
            if decisions.max_age_days is not None and age > timedelta(days=decisions.max_age_days):
                problems.append(
                    f"{where}: its evidence is {age.days} days old, over the "
                    f"{decisions.max_age_days:g} a milestone accepts"
                )
    return problems


def _plain(markdown: str) -> str:
    """A stale note as a line of a message: its code spans' backticks dropped."""
    return markdown.replace("`", "")


SUMMARY_KEYS = ("decision-0009", "decision-0010", "decision-0012")
