"""The exceptions forkaudit raises; only the CLI turns them into exit codes."""


class AuditError(Exception):
    """Raised when an audit cannot proceed; the message is one line."""


class SpecError(AuditError):
    """Raised when a SPEC names a missing, unreadable or unusable source."""


class GitError(AuditError):
    """Raised when git rejects a repository, a ref or an object (unknown ref, corrupt object)."""


class ScopeError(AuditError):
    """Raised when `--scope` names a prefix that no compared file lies under."""


class BudgetError(AuditError):
    """Raised when an audit would read more bytes than its budget (`MAX_READ_BYTES`)."""


class FetchError(AuditError):
    """Raised when a file cannot be fetched from the configured package index."""


class RulesFileError(AuditError):
    """Raised when the rules file is invalid."""

    def __str__(self) -> str:
        return f"invalid rules file: {self.args[0]}"


class HooksFileError(AuditError):
    """Raised when the plugin hooks file is invalid."""

    def __str__(self) -> str:
        return f"invalid hooks file: {self.args[0]}"


class HooksError(AuditError):
    """Raised when the declared hooks cannot be checked against these sides: no release applies
    to the fork, or the upstream lacks a hook (the file and the upstream do not match)."""
