"""forkaudit: audit a vendor fork of vLLM against upstream.

It answers which files differ from an upstream release (exactly, as `git diff -M` would),
which of those changes are the vendor's and which are upstream drift (given the true base,
found by `find_base`), and whether any vendor change touches an area the plan depends on.
"""

from forkaudit._artifacts import LEFT_OUT_REASONS
from forkaudit._audit import DEFAULT_SCOPE, diff
from forkaudit._errors import (
    AuditError,
    BudgetError,
    FetchError,
    GitError,
    HooksError,
    HooksFileError,
    RulesFileError,
    ScopeError,
    SpecError,
)
from forkaudit._findbase import BaseSearch, Candidate, find_base
from forkaudit._hooks import (
    HOOK_ACTIONS,
    HOOK_PROBLEMS,
    HOOK_STATUSES,
    DeclaredHook,
    HookCheck,
    HookList,
    HookResult,
    load_hooks,
)
from forkaudit._questions import ANSWERS, EVIDENCE_KINDS, QUESTIONS, Answer, Evidence
from forkaudit._record import (
    RECORD_TABLES,
    record_parts,
    write_reports,
)
from forkaudit._report import CHANGE_KINDS, CONTENT_KINDS, AuditReport, FileReport, Finding
from forkaudit._rules import Rules, load_rules
from forkaudit._semantic import FACT_CHANGES, FACT_SUBJECTS, Fact
from forkaudit._snapshot import LARGE_FILE_BYTES
from forkaudit._symbols import SYMBOL_KINDS

__all__ = [
    "ANSWERS",
    "CHANGE_KINDS",
    "CONTENT_KINDS",
    "DEFAULT_SCOPE",
    "EVIDENCE_KINDS",
    "FACT_CHANGES",
    "FACT_SUBJECTS",
    "HOOK_ACTIONS",
    "HOOK_PROBLEMS",
    "HOOK_STATUSES",
    "LARGE_FILE_BYTES",
    "LEFT_OUT_REASONS",
    "QUESTIONS",
    "RECORD_TABLES",
    "SYMBOL_KINDS",
    "Answer",
    "AuditError",
    "AuditReport",
    "BaseSearch",
    "BudgetError",
    "Candidate",
    "DeclaredHook",
    "Evidence",
    "Fact",
    "FetchError",
    "FileReport",
    "Finding",
    "GitError",
    "HookCheck",
    "HookList",
    "HookResult",
    "HooksError",
    "HooksFileError",
    "Rules",
    "RulesFileError",
    "ScopeError",
    "SpecError",
    "diff",
    "find_base",
    "load_hooks",
    "load_rules",
    "record_parts",
    "write_reports",
]


def __dir__() -> list[str]:
    return __all__
