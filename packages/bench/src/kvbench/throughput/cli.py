"""``kvbench throughput`` and ``kvbench history``; registered by ``kvbench.__main__``.

Heavy imports wait inside the commands, so ``kvbench --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kvquant import output_problem

from .._extras import missing_module_error

if TYPE_CHECKING:
    from ._result import ThroughputResult

DEFAULT_OUT = Path("kvbench-throughput")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = subparsers.add_parser(
        "throughput",
        help="run the kernel and vLLM throughput matrix, compare with the history, plot",
        description="Run a throughput matrix; exit 1 when a cell failed or regressed.",
    )
    run.add_argument(
        "--matrix", type=Path, default=None, metavar="FILE",
        help="matrix TOML (default: the embedded CPU nightly matrix)",
    )  # fmt: skip
    _history_option(run)
    run.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
        help=f"folder for results, logs and plots (default: {DEFAULT_OUT})",
    )  # fmt: skip
    run.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write results")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.set_defaults(func=_throughput)

    history = subparsers.add_parser("history", help="list the recent throughput runs")
    _history_option(history)
    history.add_argument("--limit", type=int, default=20, help="how many runs (default: 20)")
    history.set_defaults(func=_history)


def _history_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--history", default=None, metavar="URL",
        help="SQLAlchemy URL of the history database "
        f"(default: SQLite kvbench-history.sqlite3 beside {DEFAULT_OUT})",
    )  # fmt: skip


# What the table's first column shows for a cell that ran, by its judgement.
_STATUS = {
    "regression": "REGR",
    "within-noise": "ok",
    "history-too-short": "new",
    "not-judged": "check",
}


def _table(result: ThroughputResult) -> str:
    from . import describe_history_check

    lines = [
        f"{'status':<6} {'value':>12} {'unit':<6} {'spread':>9} {'start s':>7} {'vs base':>7}  cell"
    ]
    for cell in result.cells:
        if cell["status"] != "ok":
            status = "n/m" if cell["status"] == "not-measured" else "FAILED"
            lines.append(f"{status:<6} {'':>12} {'':<6} {'':>9} {'':>7} {'':>7}  {cell['name']}")
            lines.append(f"{'':>8}{cell['error']}")
            continue
        change = cell.get("change")
        spread = float("nan") if cell["spread"] is None else cell["spread"]
        start_s = float("nan") if cell["engine_start_s"] is None else cell["engine_start_s"]
        lines.append(
            f"{_STATUS[cell['judgement']]:<6} {cell['value']:>12.4g} {cell['unit']:<6} "
            f"{spread:>9.3g} {start_s:>7.1f} "
            f"{'' if change is None else f'{change:+.1%}':>7}  {cell['name']}"
        )
    lines.append(
        "\nstatus: ok = within its history's noise, REGR = regressed, new = history too short to "
        "judge, check = a functional check (a reference path: its time is no speed) or a "
        "baseline (never judged), n/m = a baseline not measured here, and why"
    )
    if result.capacity:
        lines.append(
            "\nKV capacity: KV cache dtype, stored as, block, max tokens, max sequences, source"
        )
        for row in result.capacity:
            lines.append(
                f"  {row['kv_cache_dtype']:<22} {row['cache_dtype']:<9} {row['block_size']:>5} "
                f"{row['max_tokens']:>9} {row['max_seqs']:>6}  {row['source']}"
            )
    check = describe_history_check(len(result.regressions), result.history_check)
    lines.append(f"\n{check}; {result.elapsed_s:.0f} s")
    return "\n".join(lines)


def _throughput(args: argparse.Namespace) -> int:
    from . import ThroughputError

    if args.json is not None:
        problem = output_problem(args.json, "`--json`", folder=False)
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    try:
        from . import run_throughput

        result = run_throughput(
            args.matrix, history_url=args.history, out_dir=args.out, progress=not args.no_progress
        )
    except ThroughputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        return missing_module_error("throughput", "throughput", error)
    print(_table(result))
    if args.json is not None:
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        except OSError as error:
            from ._run import RESULTS_FILE  # already imported by the run

            print(
                f"error: `--json` {args.json} cannot be written: {error.strerror}; "
                f"the results are in {args.out / RESULTS_FILE}",
                file=sys.stderr,
            )
            return 2
    return 0 if result.passed else 1


def _history(args: argparse.Namespace) -> int:
    from . import ThroughputError

    if args.limit < 1:
        print(f"error: `--limit` is {args.limit}; expected >= 1", file=sys.stderr)
        return 2
    try:
        from . import History, default_history_url

        # Only `kvbench throughput` creates the database; a typo here must not make an empty one.
        history = History(args.history or default_history_url(DEFAULT_OUT), create=False)
        try:
            runs = history.runs(args.limit)
        finally:
            history.close()
    except ThroughputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        return missing_module_error("history", "throughput", error)
    for run in runs:
        print(
            f"{run['id']:>5} {run['started_at']} {run['matrix']:<20} {run['hardware_key']} "
            f"{run['cells']:>3} cells {run['failed']:>3} failed {run['elapsed_s']:>7.0f} s"
        )
    return 0
