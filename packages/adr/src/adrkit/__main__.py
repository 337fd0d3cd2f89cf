"""adrkit's command line: ``adrkit update`` (``--help`` lists its options)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from adrkit._errors import AdrError
from adrkit._writer import update_adrs
from adrkit.schema import RecordError

DEFAULT_RESULTS = Path(".results")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="adrkit", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    update = commands.add_parser(
        "update", help="render every generated ADR block from the latest results records"
    )
    update.add_argument("--adr-dir", type=Path, default=Path("docs/adr"))
    update.add_argument(
        "--results",
        type=Path,
        default=None,
        help=(
            "a results root or one run's directory, read with the evidence store "
            f"(default: {DEFAULT_RESULTS} where it exists, else the evidence store alone)"
        ),
    )
    update.add_argument(
        "--store",
        type=Path,
        metavar="RESULTS",
        help=(
            "also keep RESULTS' newest record of each stage and hardware class in the evidence "
            "store (<adr dir>/evidence), unless it holds a newer one"
        ),
    )
    update.add_argument(
        "--check",
        action="store_true",
        help=(
            "write nothing; exit 1 if any ADR is stale against the results (or a figure no "
            "record names is still there)"
        ),
    )
    update.add_argument(
        "--commit-branch",
        metavar="BRANCH",
        help="commit the change with git on BRANCH (the checked-out branch; clean tree only)",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    results = args.results
    if results is None and DEFAULT_RESULTS.is_dir():
        results = DEFAULT_RESULTS
    try:
        result = update_adrs(
            args.adr_dir,
            results,
            check=args.check,
            commit_branch=args.commit_branch,
            store=args.store,
        )
    except (AdrError, RecordError) as exc:
        print(f"adrkit: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    for path in result.changed:
        done = "removed" if path in result.removed else "updated"
        print(f"{'stale' if args.check else done}: {path}")
    if result.commit:
        print(f"committed: {result.commit}")
    if args.check and result.stale:
        return 1
    if not result.changed:
        print("ADRs are up to date")
    return 0


def _one_line(message: str) -> str:
    """``message`` with every line break and unprintable character escaped: an error names
    paths and record values, which may hold either, and is one line all the same."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


def entrypoint() -> None:
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    entrypoint()
