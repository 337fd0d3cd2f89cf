"""The exceptions forkaudit raises; only the CLI turns them into exit codes."""


class AuditError(Exception):
    """Raised when an audit cannot proceed; the message is one line."""


class SpecError(AuditError):
    """Raised when a SPEC names a missing, unreadable or unusable source."""


class GitError(AuditError):
    """Raised when git rejects a repository, a ref or an object (unknown ref, corrupt object)."""


class ScopeError(AuditError):
    """Raised when `--scope` names a prefix that no compared file lies under."""


class FetchError(AuditError):
    """Raised when a file cannot be fetched from the configured package index."""


class RulesFileError(AuditError):
    """Raised when the rules file is invalid."""

    def __str__(self) -> str:
        return f"invalid rules file: {self.args[0]}"
