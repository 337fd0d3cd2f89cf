"""The ``kvquant`` command line: ``kvquant check [--device cpu|cuda] [--full] [--json OUT]``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._errors import KVQuantError


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
    return parser


def _use_interpreter_if_cpu(device: str | None) -> None:
    """Select Triton's interpreter before the kernels are imported, when the run is on CPU."""
    if device == "cuda" or "kvquant.ops" in sys.modules:
        return
    if device is None:
        import torch

        if torch.cuda.is_available():
            return
    os.environ["TRITON_INTERPRET"] = "1"


def _table(result: dict[str, Any]) -> str:
    lines = [
        f"kvquant check on {result['device']} (triton {result['triton']})",
        f"{'kernel':<18} {'dtype':<26} {'head':>4} {'block':>5} {'gqa':>3} "
        f"{'rel_l2':>9} {'tol':>7} {'quant_l2':>9}  ok",
    ]
    for case in result["cases"]:
        lines.append(
            f"{case['kernel']:<18} {case['dtype']:<26} {case['head_size']:>4} "
            f"{case['block_size']:>5} {case['gqa']:>3} {case['rel_l2']:>9.2e} "
            f"{case['tolerance']:>7.0e} {case['quant_rel_l2']:>9.2e}  "
            f"{'yes' if case['passed'] else 'NO'}"
        )
    lines.append("")
    for edge in result["edge_cases"]:
        lines.append(f"{'yes' if edge['passed'] else 'NO ':<3} {edge['name']:<26} {edge['detail']}")
    lines.append(f"\n{'PASSED' if result['passed'] else 'FAILED'}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    _use_interpreter_if_cpu(args.device)
    from ._check import run_correctness

    try:
        result = run_correctness(device=args.device, quick=not args.full)
    except KVQuantError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(_table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["passed"] else 1


def entrypoint() -> None:
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    entrypoint()
