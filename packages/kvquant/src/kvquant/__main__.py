"""The ``kvquant`` command line.

``kvquant check [--device cpu|cuda] [--full] [--json OUT]`` and
``kvquant build [--target gfx90a] [--target sm90] [--matrix FILE] --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ._errors import KVQuantError
from ._output import output_problem

if TYPE_CHECKING:
    from ._correctness import CorrectnessResult


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvquant", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "check", help="run the kernels against their fp32 references and the edge cases"
    )
    check.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="cpu runs Triton's interpreter; default: cuda when available, else cpu",
    )
    check.add_argument("--full", action="store_true", help="the full shape matrix (slow on cpu)")
    check.add_argument("--json", type=Path, default=None, metavar="OUT", help="write results")
    build = commands.add_parser(
        "build", help="compile every kernel ahead of time (gfx90a, sm90) and write a manifest"
    )
    build.add_argument(
        "--target", action="append", default=None, help="gfx90a (default) or sm90; repeatable"
    )
    build.add_argument("--matrix", type=Path, default=None, metavar="FILE", help="matrix TOML")
    build.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    build.add_argument(
        "--previous", type=Path, default=None, metavar="MANIFEST", help="diff against this"
    )
    build.add_argument("--jobs", type=int, default=None, help="compile processes (default: cores)")
    build.add_argument("--table", action="store_true", help="print every cell's resource use")
    build.add_argument("--json", type=Path, default=None, metavar="OUT", help="write the result")
    return parser


def _build(args: argparse.Namespace) -> int:
    """``kvquant build``: exit 1 when a cell fails or a gate fails, 2 on bad input."""
    from .build import build, format_report

    problem = output_problem(args.json, "--json", folder=False) if args.json is not None else None
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        result = build(
            args.target or ["gfx90a"],
            args.matrix,
            out=args.out,
            previous=args.previous,
            jobs=args.jobs,
        )
    except KVQuantError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_report(result, table=args.table))
    if args.json is not None and not _write_json(args.json, result.to_dict()):
        return 2
    return 0 if result.passed else 1


def _write_json(path: Path, data: object) -> bool:
    """Write ``data`` to ``path``; False, with the error on stderr, when it cannot be written
    (the report printed before still holds the results)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    except OSError as error:
        print(f"error: cannot write --json {path}: {error.strerror}", file=sys.stderr)
        return False
    return True


def _use_interpreter_if_cpu(device: str | None) -> None:
    """Select Triton's interpreter before the kernels are imported, when the run is on CPU."""
    if device == "cuda" or "kvquant.ops" in sys.modules:
        return
    if device is None:
        import torch

        if torch.cuda.is_available():
            return
    os.environ["TRITON_INTERPRET"] = "1"


def _table(result: CorrectnessResult) -> str:
    lines = [
        f"kvquant check on {result.device} (triton {result.triton})",
        f"{'kernel':<25} {'dtype':<26} {'head':>4} {'block':>5} {'gqa':>3} "
        f"{'rel_l2':>9} {'tol':>7} {'quant_l2':>9}  ok",
    ]
    for case in result.cases:
        lines.append(
            f"{case.kernel:<25} {case.dtype:<26} {case.head_size:>4} "
            f"{case.block_size:>5} {case.gqa:>3} {case.rel_l2:>9.2e} "
            f"{case.tolerance:>7.0e} {case.quant_rel_l2:>9.2e}  "
            f"{'yes' if case.passed else 'NO'}" + (f"  {case.error}" if case.error else "")
        )
    lines.append("")
    for edge in result.edge_cases:
        lines.append(f"{'yes' if edge.passed else 'NO ':<3} {edge.name:<26} {edge.detail}")
    lines.append(f"\n{'PASSED' if result.passed else 'FAILED'}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    if args.command == "build":
        return _build(args)
    problem = output_problem(args.json, "--json", folder=False) if args.json is not None else None
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    _use_interpreter_if_cpu(args.device)
    from ._check import run_correctness

    try:
        result = run_correctness(device=args.device, quick=not args.full)
    except KVQuantError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(_table(result))
    if args.json is not None and not _write_json(args.json, result.to_dict()):
        return 2
    return 0 if result.passed else 1


def entrypoint() -> None:
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    entrypoint()
