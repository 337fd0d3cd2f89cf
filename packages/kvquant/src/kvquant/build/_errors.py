"""Errors of the ahead-of-time build; all are KVQuantError, so the CLI maps them to exit 2."""

from .._errors import KVQuantError


class BuildError(KVQuantError):
    """The build cannot start or cannot finish (a failing cell is not an error: it is reported)."""


class UnknownTargetError(BuildError, ValueError):
    """A `--target` that is not one of the supported targets; the message lists them."""


class MatrixFileError(BuildError, ValueError):
    """The matrix TOML is unreadable, or a key or value is unknown or of the wrong type."""


class ArtifactError(BuildError):
    """A compiled artifact is not what its target needs (wrong ELF, arch, metadata or symbol)."""
