"""forkaudit: audit a vendor fork of vLLM against upstream.

It answers which files differ from an upstream release (exactly, as `git diff -M` would),
which of those changes are the vendor's and which are upstream drift (given the true base,
found by `find_base`), and whether any vendor change touches an area the plan depends on.
"""

from forkaudit._audit import DEFAULT_FORK, DEFAULT_SCOPE, DEFAULT_UPSTREAM, diff
from forkaudit._errors import (
    AuditError,
    FetchError,
    GitError,
    RulesFileError,
    ScopeError,
    SpecError,
)
from forkaudit._findbase import find_base
from forkaudit._report import AuditReport, FileReport
from forkaudit._rules import Rules, load_rules

__all__ = [
    "DEFAULT_FORK",
    "DEFAULT_SCOPE",
    "DEFAULT_UPSTREAM",
    "AuditError",
    "AuditReport",
    "FetchError",
    "FileReport",
    "GitError",
    "Rules",
    "RulesFileError",
    "ScopeError",
    "SpecError",
    "diff",
    "find_base",
    "load_rules",
]


def __dir__() -> list[str]:
    return __all__
