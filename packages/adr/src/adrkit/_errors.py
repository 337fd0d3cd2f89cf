"""adrkit's exceptions: every one carries a one-line message meant for the user. A record that
does not fit the schema is `adrkit.schema`'s `RecordError`, which the command line reports the
same way."""


class AdrError(Exception):
    """Raised when the ADRs cannot be updated; nothing has been written."""


class ResultsError(AdrError):
    """Raised when a results directory is missing, empty or holds a corrupt record."""


class MarkerError(AdrError):
    """Raised when an ADR's generated-block markers are malformed."""


class RenderError(AdrError):
    """Raised when a generated block cannot be rendered, e.g. its key has no renderer."""


class CommitError(AdrError):
    """Raised when committing the ADR change is asked for but cannot be done safely."""
