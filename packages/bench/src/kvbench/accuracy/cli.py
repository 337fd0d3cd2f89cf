"""``kvbench accuracy``: run the paired 16-bit vs INT8 comparison and print its tables;
``kvbench divergence``: only the config's divergence runs, which need no lm-eval."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvquant import output_problem

from .._extras import missing_module_error

if TYPE_CHECKING:
    from ._result import AccuracyResult, DivergenceResult


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``accuracy`` and ``divergence`` subcommands to the ``kvbench`` parser."""
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
    parser.set_defaults(func=_run, divergence_only=False)

    divergence = subparsers.add_parser(
        "divergence",
        help="next-token KL divergence of the INT8 against the 16-bit KV cache on running text",
        description=(
            "Only the config's divergence runs: the candidate cache, the degraded control and "
            "the prefill trap against the baseline on the same tokens (llama.cpp's "
            "--kl-divergence statistics). Needs torch, transformers and the model; no lm-eval."
        ),
    )
    divergence.add_argument(
        "--config", type=Path, help="TOML config (default: the embedded CPU nightly config)"
    )
    divergence.add_argument("--model", help="HF model folder or .gguf (default: SmolLM2-135M)")
    divergence.add_argument("--device", help="cpu, cuda or cuda:N (default: from the config)")
    divergence.add_argument("--corpus", help="running text, overriding the config's")
    divergence.add_argument("--tokens", type=int, help="tokens per cache, overriding the config")
    divergence.add_argument("--chunk-length", type=int, help="tokens per forward (chunk)")
    divergence.add_argument(
        "--control-tokens", type=int, help="tokens the two controls score (0: no controls)"
    )
    divergence.add_argument(
        "--attention",
        type=lambda text: text.split(","),
        help="kernels, reference or kernels,reference (default: kernels on a GPU)",
    )
    divergence.add_argument(
        "--out",
        type=Path,
        default=Path("kvbench-divergence"),
        help="output folder: divergence.json and the KLD plot",
    )
    divergence.add_argument("--json", type=Path, dest="json_out", help="also write the result")
    divergence.add_argument("--quiet", action="store_true", help="no progress bars")
    divergence.set_defaults(func=_run, divergence_only=True, limit=None)


def _columns(lines: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]


def _error_of(value: float, stderr: float) -> str:
    return f"{value:.6g} ± {stderr:.2g}"


def format_divergence(divergence: DivergenceResult, chunks: bool = False) -> str:
    """One divergence run's rows (and with ``chunks``, the candidate's per-chunk figures)."""
    positions = divergence.chunks * (divergence.chunk_length - 1)
    text = [
        f"divergence of {divergence.candidate} from {divergence.baseline}: corpus "
        f"{divergence.corpus}, {divergence.chunks} chunks of {divergence.chunk_length} "
        f"tokens ({positions} positions), controls on {divergence.control_chunks} chunks"
    ]
    if divergence.kernel == "decode":
        text = [
            f"divergence of {divergence.candidate} from {divergence.baseline} through the decode "
            f"kernel: corpus {divergence.corpus}, {divergence.texts} texts of "
            f"{divergence.text_length} tokens ({divergence.documents}) decoded together, windows "
            f"{divergence.windows}, controls on {divergence.control_windows}"
        ]
    lines: list[tuple[str, ...]] = [
        (
            "context",
            "arm",
            "attention",
            "cache",
            "prefill",
            "positions",
            "mean KLD",
            "median",
            "99%",
            "99.9%",
            "max",
            "same top-1",
            "PPL ratio",
            "RMS dp",
            "expected",
            "verdict",
        )
    ]
    for row in divergence.rows:
        lines.append(
            (
                str(row.get("context")),
                row["arm"],
                row["attention"],
                row["kv_cache_dtype"],
                "reads cache" if row["prefill_reads_cache"] else "skips cache",
                str(row["tokens"]),
                _error_of(row["mean_kld"], row["mean_kld_stderr"]),
                f"{row['median_kld']:.4g}",
                f"{row['p99_kld']:.4g}",
                f"{row['p999_kld']:.4g}",
                f"{row['max_kld']:.4g}",
                _error_of(row["same_top1"], row["same_top1_stderr"]),
                _error_of(row["ppl_ratio"], row["ppl_ratio_stderr"]),
                _error_of(row["rms_dp"], row["rms_dp_stderr"]),
                row["expected"],
                row["verdict"] if row["behaved"] else f"{row['verdict']} (UNEXPECTED)",
            )
        )
    text += _columns(lines)
    if chunks:
        for row in divergence.rows:
            if row["arm"] != "candidate":
                continue
            text.append(f"per chunk, {row['kv_cache_dtype']} through the {row['attention']}:")
            chunk_lines: list[tuple[str, ...]] = [
                ("chunk", "mean KLD", "max KLD", "same top-1", "PPL ratio", "RMS dp")
            ]
            for index, chunk in enumerate(row["chunks"]):
                chunk_lines.append(
                    (
                        str(index + 1),
                        _error_of(chunk["mean_kld"], chunk["mean_kld_stderr"]),
                        f"{chunk['max_kld']:.4g}",
                        _error_of(chunk["same_top1"], chunk["same_top1_stderr"]),
                        _error_of(chunk["ppl_ratio"], chunk["ppl_ratio_stderr"]),
                        _error_of(chunk["rms_dp"], chunk["rms_dp_stderr"]),
                    )
                )
            text += ["  " + line for line in _columns(chunk_lines)]
    agreement = divergence.agreement
    if agreement is not None:
        base = agreement["baseline_kernels_vs_reference"]
        base_kld = _error_of(base["mean_kld"], base["mean_kld_stderr"])
        text.append(
            f"kernels vs reference: 16-bit mean KLD {base_kld}"
            f" (max {base['max_kld']:.4g}, same top-1 {base['same_top1']:.4f}); "
            f"{divergence.candidate} mean KLD {agreement['candidate_mean_kld_kernels']:.6g} "
            f"(kernels) vs {agreement['candidate_mean_kld_reference']:.6g} (reference), "
            f"difference {_error_of(agreement['difference'], agreement['difference_stderr'])}, "
            f"allowed {agreement['allowed']:.4g}: {'agree' if agreement['agree'] else 'DISAGREE'}"
        )
    gate = divergence.gate
    plot = divergence.plot or "not drawn (no matplotlib)"
    text.append(
        f"divergence gate (mean KLD <= {gate.max_mean_kld:g}, same top-1 >= "
        f"{gate.min_same_top1:g}, PPL ratio <= {gate.max_ppl_ratio:g}) and controls: "
        f"{'as expected' if divergence.passed else 'FAILED'}; "
        f"{divergence.elapsed_s:.0f} s; plot: {plot}"
    )
    return "\n".join(text)


def format_table(result: AccuracyResult) -> str:
    """The result's task rows as a fixed-width text table, its divergence runs, the verdict."""
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
        "detectable",
        "verdict",
    )
    lines = [header]
    for row in result.rows:
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
                f"{row['detectable_delta']:.4f}",
                row["verdict"] if row["verdict"] != "failed" else "FAILED",
            )
        )
    text = _columns(lines) if result.rows else []
    tolerance = result.tolerance
    if result.rows:
        inconclusive = sum(row["verdict"] == "inconclusive" for row in result.rows)
        text.append(
            f"gate (|delta| <= max({tolerance:g}, 2 stderr)); inconclusive: the smallest "
            f"delta it could detect (80% power) exceeds {tolerance:g}: {inconclusive} of "
            f"{len(result.rows)} rows; plot: {result.plot}"
        )
    chunks = not result.rows
    text += [format_divergence(divergence, chunks) for divergence in result.divergence]
    verdict = "passed" if result.passed else "FAILED"
    text.append(f"{verdict}; {result.elapsed_s:.0f} s")
    return "\n".join(text)


def _error(command: str, message: str) -> int:
    print(f"kvbench {command}: error: {message}", file=sys.stderr)
    return 2


def _divergence_overrides(args: argparse.Namespace) -> dict[str, Any]:
    from ._config import DIVERGENCE_OPTIONS

    if not args.divergence_only:
        return {}
    return {key: getattr(args, key) for key in DIVERGENCE_OPTIONS if getattr(args, key) is not None}


def _run(args: argparse.Namespace) -> int:
    from ._config import check_device, load_config
    from ._errors import AccuracyError
    from ._run import DIVERGENCE_RESULT_NAME, RESULT_NAME, run_accuracy

    command = "divergence" if args.divergence_only else "accuracy"
    if args.limit is not None and args.limit < 1:
        return _error(command, f"`--limit` is {args.limit}; expected >= 1")
    if args.json_out is not None:
        problem = output_problem(args.json_out, "`--json`", folder=False)
        if problem is not None:
            return _error(command, problem)
    try:
        overrides = _divergence_overrides(args)
        if args.device is not None:
            # run_accuracy checks it too, as its `device` argument; here it is the option typed.
            check_device(args.device, load_config(args.config, overrides).backend, "--device")
        result = run_accuracy(
            args.config,
            model=args.model,
            device=args.device,
            limit=args.limit,
            out_dir=args.out,
            progress=not args.quiet,
            divergence_only=args.divergence_only,
            divergence_overrides=overrides,
        )
    except AccuracyError as error:
        return _error(command, str(error))
    except ModuleNotFoundError as error:
        return missing_module_error(command, "accuracy", error)
    print(format_table(result))
    if args.json_out is not None:
        try:
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps(result.to_dict(), indent=2) + "\n"
            args.json_out.write_text(text, encoding="utf-8")
        except OSError as error:
            saved = args.out / (DIVERGENCE_RESULT_NAME if args.divergence_only else RESULT_NAME)
            return _error(
                command,
                f"`--json` {args.json_out} cannot be written: {error.strerror}; "
                f"the result is in {saved}",
            )
    return 0 if result.passed else 1
