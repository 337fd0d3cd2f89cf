"""The questions the team asked of the fork, answered from the semantic diff.

Did the vendor add or change an FP8 or an INT8 KV cache, add or change an attention backend,
change the KV-cache dtypes a backend accepts, add, remove or re-default an env var? Each answer
carries the evidence: the facts of the semantic diff and the vendor's changed files that show
it, each with its file. Changes judged upstream drift (with a base) are not the vendor's and are
no evidence.
"""

import re
from dataclasses import dataclass
from typing import Literal, get_args

from forkaudit._rules import SemanticRules
from forkaudit._semantic import Fact

QuestionId = Literal[
    "fp8_kv_cache", "int8_kv_cache", "attention_backend", "backend_kv_cache_dtypes", "env_vars"
]
QUESTIONS: tuple[QuestionId, ...] = get_args(QuestionId)

#: yes: the semantic diff shows it; unknown: no fact shows it, but a changed Python file that
#: could hold one was not read (it does not parse, or it is large); mentioned: no fact shows
#: it, but the vendor's changed lines in a risk area name the dtype; no: none of these.
AnswerKind = Literal["yes", "unknown", "mentioned", "no"]
ANSWERS: tuple[AnswerKind, ...] = get_args(AnswerKind)

#: fact: one `Fact` of the semantic diff; file: a vendor change to a file of an attention
#: backend area (the rules' `[semantic] backend_areas`); mention: a vendor change in a risk
#: area whose added lines name the dtype more or fewer times than its removed lines; unread: a
#: changed Python file that was not parsed.
EvidenceKind = Literal["fact", "file", "mention", "unread"]
EVIDENCE_KINDS: tuple[EvidenceKind, ...] = get_args(EvidenceKind)

# The dtype each dtype question asks about, named at the start of a word: "int8" in `int8_t`,
# not in `uint8`.
_DTYPES: dict[QuestionId, str] = {"fp8_kv_cache": "fp8", "int8_kv_cache": "int8"}
# Matched in lowercased bytes: the same as a case-insensitive match, and a dtype the text does
# not hold at all costs one substring search instead of a regular expression's scan.
_DTYPE_NAMES: dict[QuestionId, tuple[bytes, re.Pattern[bytes]]] = {
    question: (dtype.encode(), re.compile(rb"(?<![a-z0-9])" + dtype.encode()))
    for question, dtype in _DTYPES.items()
}


@dataclass(frozen=True)
class ChangedFile:
    """What the questions need to know of one vendor change."""

    path: str
    status: str
    area: str
    risk: bool
    vendor: bool
    #: The dtype questions whose dtype the file's changed lines name (see `dtype_mentions`).
    mentions: tuple[QuestionId, ...]


def dtype_mentions(lines: list[bytes]) -> tuple[QuestionId, ...]:
    """The dtype questions whose dtype the changed LINES (`+` or `-` first) name more often in
    the added lines than in the removed ones, or less often: a line that lists a dtype beside
    a new one, or that only moves, names it as often before as after."""
    added = b"\n".join(line[1:] for line in lines if line[:1] == b"+").lower()
    removed = b"\n".join(line[1:] for line in lines if line[:1] == b"-").lower()

    def count(text: bytes, name: bytes, pattern: re.Pattern[bytes]) -> int:
        return len(pattern.findall(text)) if name in text else 0

    return tuple(
        question
        for question, (name, pattern) in _DTYPE_NAMES.items()
        if count(added, name, pattern) != count(removed, name, pattern)
    )


@dataclass(frozen=True)
class Evidence:
    """One reason for an answer, with the file that shows it.

    For a fact, the `Fact`'s subject, change, name, old and new; for a file, a mention or an
    unread file, SUBJECT is None, CHANGE is the file's status (A, M, D, R) or None, and NAME
    is the dtype family a mention names.
    """

    kind: EvidenceKind
    path: str
    subject: str | None = None
    change: str | None = None
    name: str | None = None
    old: str | None = None
    new: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "path": self.path,
            "subject": self.subject,
            "change": self.change,
            "name": self.name,
            "old": self.old,
            "new": self.new,
        }


@dataclass(frozen=True)
class Answer:
    """One question's answer and its evidence."""

    question: QuestionId
    answer: AnswerKind
    evidence: tuple[Evidence, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "question": self.question,
            "answer": self.answer,
            "evidence": [e.to_dict() for e in self.evidence],
        }


def answer_questions(
    facts: list[Fact], files: list[ChangedFile], unread_python: list[str], rules: SemanticRules
) -> list[Answer]:
    """Answer every question from the semantic diff's FACTS and the changed FILES.

    UNREAD_PYTHON lists the changed Python files that were not parsed.
    """
    drift = {f.path for f in files if not f.vendor}
    vendor_facts = [fact for fact in facts if fact.path not in drift]
    answers = []
    for question in QUESTIONS:
        proof = [_fact_evidence(f) for f in vendor_facts if _answers(question, f)]
        if question == "attention_backend":
            proof += [
                Evidence("file", f.path, change=f.status)
                for f in files
                if f.vendor and f.area in rules.backend_areas
            ]
        # Env vars are read from the envs files only; any Python file may define the others.
        unread = [
            Evidence("unread", path)
            for path in unread_python
            if question != "env_vars" or path in rules.envs_files
        ]
        mentions = [
            Evidence("mention", f.path, change=f.status, name=_DTYPES[question])
            for f in files
            if f.vendor and f.risk and question in f.mentions
        ]
        if proof:
            answers.append(Answer(question, "yes", tuple(proof)))
        elif unread:
            answers.append(Answer(question, "unknown", tuple(unread + mentions)))
        elif mentions:
            answers.append(Answer(question, "mentioned", tuple(mentions)))
        else:
            answers.append(Answer(question, "no", ()))
    return answers


def _answers(question: QuestionId, fact: Fact) -> bool:
    """Whether FACT is evidence for QUESTION."""
    if question in _DTYPE_NAMES:
        _name, pattern = _DTYPE_NAMES[question]
        if fact.subject == "cache_dtype":
            named = fact.name
        elif fact.subject == "backend_kv_cache_dtype":
            named = fact.new or fact.old or ""
        else:
            return False
        return bool(pattern.search(named.lower().encode()))
    subject = {
        "attention_backend": "attention_backend",
        "backend_kv_cache_dtypes": "backend_kv_cache_dtype",
        "env_vars": "env_var",
    }[question]
    return fact.subject == subject


def _fact_evidence(fact: Fact) -> Evidence:
    return Evidence(
        "fact",
        fact.path,
        subject=fact.subject,
        change=fact.change,
        name=fact.name,
        old=fact.old,
        new=fact.new,
    )
