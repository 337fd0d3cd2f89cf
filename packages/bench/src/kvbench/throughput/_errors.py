"""Exceptions raised by kvbench.throughput. Only the CLI turns them into exit codes."""


class ThroughputError(Exception):
    """Base class of every error the throughput benchmarks raise on purpose."""


class MatrixError(ThroughputError, ValueError):
    """The matrix file is missing, unreadable or declares an unknown key or a bad value.

    The message is one line that names the file, the key, the value seen and what was expected.
    """


class EngineMissingError(ThroughputError, RuntimeError):
    """vLLM, which the end-to-end cells run, is not installed in this interpreter."""


class HistoryError(ThroughputError, RuntimeError):
    """The history database cannot be opened, migrated, read or written.

    Raised before anything is changed in it: a corrupt or locked database is left as it was.
    """


class OutputError(ThroughputError, OSError):
    """The output folder or the ``--json`` file cannot be written; checked before any cell runs."""


class BaselineUnavailableError(ThroughputError, RuntimeError):
    """A baseline kernel cannot run here (no upstream vLLM to import, no CUDA for SDPA flash):
    its cell is "not measured", and the message says why. Never a failure of the run."""
