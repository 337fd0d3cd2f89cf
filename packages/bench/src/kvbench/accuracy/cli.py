"""``kvbench accuracy``: run the paired 16-bit vs INT8 comparison and print its table."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .._extras import missing_module_error
from .._output import output_problem


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``accuracy`` subcommand to the ``kvbench`` parser."""
    parser = subparsers.add_parser(
        "accuracy",
        help="paired lm-eval comparison of a 16-bit against an INT8 KV cache",
        description=__doc__,
    )
    parser.add_argument(
        "--config", type=Path, help="TOML config (default: the embedded CPU nightly config)"
    )
    parser.add_argument("--model", help="HF model folder or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: from the config)")
    parser.add_argument("--limit", type=int, help="documents per task, overriding the config")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("kvbench-accuracy"),
        help="output folder: results, plot and the resumable request cache",
    )
    parser.add_argument("--json", type=Path, dest="json_out", help="also write the result here")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(func=_run)


def format_table(result: dict[str, Any]) -> str:
    """The result's rows as a fixed-width text table, then the gate's verdict."""
    header = (
        "task",
        "metric",
        "mode",
        "base",
        "int8",
        "delta",
        "95% CI",
        "n",
        "+/-",
        "McNemar",
        "gate",
    )
    lines = [header]
    for row in result["rows"]:
        flips = "" if row["flips_up"] is None else f"{row['flips_up']}/{row['flips_down']}"
        p = "" if row["mcnemar_p"] is None else f"{row['mcnemar_p']:.3f}"
        lines.append(
            (
                row["task"],
                row["metric"],
                row["mode"],
                f"{row['baseline']:.4f}",
                f"{row['int8']:.4f}",
                f"{row['delta']:+.4f}",
                f"[{row['ci_low']:+.4f}, {row['ci_high']:+.4f}]",
                str(row["n"]),
                flips,
                p,
                "pass" if row["gate_passed"] else "FAIL",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    gate = result["gate"]
    verdict = "passed" if gate["passed"] else "FAILED"
    text.append(
        f"gate (|delta| <= max({gate['tolerance']:g}, 2 stderr)): {verdict}; "
        f"{result['elapsed_s']:.0f} s; plot: {result['plot']}"
    )
    return "\n".join(text)


def _error(message: str) -> int:
    print(f"kvbench accuracy: error: {message}", file=sys.stderr)
    return 2


def _run(args: argparse.Namespace) -> int:
    from ._config import check_device, load_config
    from ._errors import AccuracyError
    from ._run import RESULT_NAME, run_accuracy

    if args.limit is not None and args.limit < 1:
        return _error(f"`--limit` is {args.limit}; expected >= 1")
    if args.json_out is not None:
        problem = output_problem(args.json_out, "`--json`", folder=False)
        if problem is not None:
            return _error(problem)
    try:
        if args.device is not None:
            # run_accuracy checks it too, as its `device` argument; here it is the option typed.
            check_device(args.device, load_config(args.config).backend, "--device")
        result = run_accuracy(
            args.config,
            model=args.model,
            device=args.device,
            limit=args.limit,
            out_dir=args.out,
            progress=not args.quiet,
        )
    except AccuracyError as error:
        return _error(str(error))
    except ModuleNotFoundError as error:
        return missing_module_error("accuracy", "accuracy", error)
    print(format_table(result))
    if args.json_out is not None:
        try:
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            args.json_out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        except OSError as error:
            saved = args.out / RESULT_NAME
            return _error(
                f"`--json` {args.json_out} cannot be written: {error.strerror}; "
                f"the result is in {saved}"
            )
    return 0 if result["gate"]["passed"] else 1
