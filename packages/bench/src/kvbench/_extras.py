"""The one-line error of a command whose optional dependencies are not installed."""

from __future__ import annotations

import sys


def missing_module_error(command: str, extra: str, error: ModuleNotFoundError) -> int:
    """Print ``error`` as ``kvbench <command>``'s one-line error, naming the extra; return 2."""
    print(
        f"kvbench {command}: error: {error.msg}; the {extra!r} extra installs what it needs: "
        f"pip install 'kvbench[{extra}]'",
        file=sys.stderr,
    )
    return 2
