"""The ``kvbench`` command line; each benchmark family registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

# Each module has `register(subparsers)`, adding subcommands whose `func(args) -> int` runs them.
_FAMILIES = ("kvbench.accuracy.cli", "kvbench.throughput.cli")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvbench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in _FAMILIES:
        register: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]
        register = importlib.import_module(name).register
        register(commands)
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    code: int = args.func(args)
    return code


def entrypoint() -> None:
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    entrypoint()
