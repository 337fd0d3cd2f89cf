"""What ``run_accuracy`` returns: the gated task rows and the divergence runs; their gates; and
the accuracy stage's record of them. Imports nothing heavy: a result is read back from JSON
where neither torch nor lm-eval is loaded."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from adrkit.schema import Gate, RecordParts, Scalar, Table, files_by_name

from ._config import DivergenceGate

# A task row: the task, metric and scoring mode, the paired statistics of the two caches on the
# same items (`PairedStats`), whether the gate passed and the verdict; JSON, as accuracy.json
# holds it.
DeltaRow = dict[str, Any]
# A divergence row: one arm (candidate, degraded or trap) through one attention path, its
# `DivergenceStats`, its checks, what it must show and what it showed.
DivergenceRow = dict[str, Any]


def delta_gate(name: str, delta: float, stderr: float, tolerance: float) -> Gate:
    """The accuracy gate: ``|delta| <= max(tolerance, 2 * stderr)``.

    A delta inside twice its standard error cannot be told from noise, so the gate only fails
    on a difference that is both larger than the tolerance and statistically visible.
    """
    return Gate.judge(name, abs(delta), "<=", max(tolerance, 2.0 * stderr))


def divergence_gates(
    where: str, mean_kld: float, same_top1: float, ppl_ratio: float, gate: DivergenceGate
) -> dict[str, Gate]:
    """The divergence gate's three checks of one row (named after ``where``); a row passes when
    all hold."""
    return {
        "mean_kld": Gate.judge(f"{where} mean KLD", mean_kld, "<=", gate.max_mean_kld),
        "same_top1": Gate.judge(f"{where} same top-1", same_top1, ">=", gate.min_same_top1),
        "ppl_ratio": Gate.judge(f"{where} PPL ratio", ppl_ratio, "<=", gate.max_ppl_ratio),
    }


def agreement_gate(candidate: str, difference: float, allowed: float) -> Gate:
    """The two attention paths agree: their candidate mean KLDs differ by at most ``allowed``."""
    name = f"divergence {candidate} mean KLD, kernels - reference |difference|"
    return Gate.judge(name, abs(difference), "<=", allowed)


@dataclass(frozen=True)
class DivergenceResult:
    """One divergence run: its corpus and chunks, the attention paths it ran, a row per path and
    arm, and the paths' agreement (None for one path). ``plot``: the KLD histograms (None
    without matplotlib)."""

    corpus: str
    chunk_length: int
    chunks: int
    control_chunks: int
    attention: list[str]
    baseline: str
    candidate: str
    gate: DivergenceGate
    rows: list[DivergenceRow]
    agreement: dict[str, Any] | None
    plot: str | None
    elapsed_s: float
    # Which kvquant kernel read the caches at the scored positions. A decode run's texts,
    # windows and context buckets (`DivergenceSpec`), what its texts are, and its 16-bit
    # baseline's seconds; a prefill run leaves them empty.
    kernel: str = "prefill"
    texts: int = 0
    text_length: int = 0
    windows: list[list[int]] = field(default_factory=list)
    control_windows: list[list[int]] = field(default_factory=list)
    buckets: list[int] = field(default_factory=list)
    documents: str = "concatenated passages"
    baseline_seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """Every row showed what it must, and the paths agree."""
        agree = self.agreement is None or self.agreement["agree"]
        return all(row["behaved"] for row in self.rows) and bool(agree)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DivergenceResult:
        fields = {k: v for k, v in data.items() if k not in ("gate", "passed")}
        return cls(gate=DivergenceGate(**data["gate"]), **fields)

    def gates(self) -> list[Gate]:
        """The divergence gate on each candidate row, and the attention paths' agreement."""
        checks: list[Gate] = []
        for row in self.rows:
            if row["control"]:
                continue
            where = f"divergence {row['kv_cache_dtype']} ({row['attention']})"
            if self.kernel == "decode":
                where = (
                    f"decode divergence {row['kv_cache_dtype']} ({row['attention']}, context "
                    f"{row['context']})"
                )
            found = divergence_gates(
                where, row["mean_kld"], row["same_top1"], row["ppl_ratio"], self.gate
            )
            checks += found.values()
        if self.agreement is not None:
            difference, allowed = self.agreement["difference"], self.agreement["allowed"]
            checks.append(agreement_gate(self.candidate, difference, allowed))
        return checks


DELTA_COLUMNS = [
    "task",
    "metric",
    "mode",
    "n",
    "baseline",
    "int8",
    "delta",
    "stderr",
    "ci95",
    "flips",
    "mcnemar_p",
    "detectable_delta",
    "verdict",
]
DIVERGENCE_COLUMNS = [
    "arm",
    "cache",
    "prefill",
    "attention",
    "positions",
    "mean_kld",
    "median_kld",
    "p99_kld",
    "p999_kld",
    "max_kld",
    "same_top1",
    "ppl_ratio",
    "rms_dp",
    "kernel",
    "context",
    "expected",
    "verdict",
]


@dataclass(frozen=True)
class AccuracyResult:
    """The task rows of every configured run (``tolerance``: the config's gate) and the
    divergence runs, on one model and device. ``to_dict`` is accuracy.json (divergence.json for
    a divergence-only run); ``results_file`` is where the run wrote it (None for a result read
    back from JSON elsewhere)."""

    backend: str
    model: str
    device: str
    tasks: list[str]
    rows: list[DeltaRow]
    divergence: list[DivergenceResult]
    tolerance: float
    plot: str | None
    timings: list[dict[str, Any]]
    elapsed_s: float
    results_file: str | None = field(default=None, compare=False)
    # Where the model's weights came from (e.g. ``Q4_1 GGUF``) and the dtype it ran in.
    weights: str = ""
    model_dtype: str = ""

    RECORD_TABLES: ClassVar[tuple[str, ...]] = ("deltas", "divergence")

    @property
    def passed(self) -> bool:
        rows_pass = all(row["gate_passed"] for row in self.rows)
        return rows_pass and all(run.passed for run in self.divergence)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "model": self.model,
            "device": self.device,
            "weights": self.weights,
            "model_dtype": self.model_dtype,
            "tasks": self.tasks,
            "rows": self.rows,
            "divergence": [run.to_dict() for run in self.divergence],
            "gate": {"tolerance": self.tolerance, "passed": self.passed},
            "plot": self.plot,
            "timings": self.timings,
            "elapsed_s": self.elapsed_s,
        }

    @classmethod
    def read(cls, path: Path) -> AccuracyResult:
        """The result in a file ``to_dict`` wrote, with the file's path."""
        result = cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        return replace(result, results_file=str(path))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AccuracyResult:
        """The result as ``to_dict`` wrote it."""
        return cls(
            backend=data["backend"],
            model=data["model"],
            device=data["device"],
            tasks=data["tasks"],
            rows=data["rows"],
            divergence=[DivergenceResult.from_dict(run) for run in data["divergence"]],
            tolerance=data["gate"]["tolerance"],
            plot=data["plot"],
            timings=data["timings"],
            elapsed_s=data["elapsed_s"],
            weights=data.get("weights", ""),
            model_dtype=data.get("model_dtype", ""),
        )

    def record_parts(self) -> RecordParts:
        """The accuracy stage's record.

        - table `deltas`: one row per task metric, its verdict passed, inconclusive (the smallest
          delta it could detect exceeds the tolerance) or failed; one gate per row, |delta|
          within max(tolerance, 2 x stderr of the paired delta);
        - table `divergence`: the candidate cache, the degraded control and the prefill trap,
          with llama.cpp's --kl-divergence statistics, what each must show and what it showed
          (no rows when no divergence run was configured); gates on the candidate's mean KLD,
          same top-1 and perplexity ratio, and on the paths' agreement; the controls' count,
          `divergence_controls_failed`, is for the pipeline's own gate.
        """
        rows, tolerance = self.rows, self.tolerance
        verdicts = [row["verdict"] for row in rows]
        counts = {v: verdicts.count(v) for v in ("passed", "inconclusive", "failed")}
        summary = (
            f"INT8 against the 16-bit cache on {self.model} ({self.device}): "
            f"{len(rows)} task metrics, {counts['passed']} passed, {counts['inconclusive']} "
            f"inconclusive, {counts['failed']} failed (|delta| within max({tolerance:g}, 2 "
            "stderr))"
        )
        divergence = _divergence_metrics(self.divergence)
        if "divergence_mean_kld" in divergence:
            summary += (
                f"; divergence on {divergence['divergence_positions']} positions: mean KLD "
                f"{divergence['divergence_mean_kld']:.3g}, same top-1 "
                f"{divergence['divergence_same_top1']:.4f}, PPL ratio "
                f"{divergence['divergence_ppl_ratio']:.4f} ({divergence['divergence_gate']}); "
                f"controls not as expected: {divergence['divergence_controls_failed']}"
            )
        if "decode_worst_mean_kld" in divergence:
            summary += (
                f"; through the decode kernel on {divergence['decode_positions']} positions to "
                f"context {divergence['decode_context_max']}: worst bucket "
                f"{divergence['decode_worst_context']} mean KLD "
                f"{divergence['decode_worst_mean_kld']:.3g} ({divergence['decode_gate']})"
            )
        tables = (
            Table(DELTA_COLUMNS, [_delta_row(row) for row in rows]),
            Table(
                DIVERGENCE_COLUMNS,
                [_divergence_row(row) for run in self.divergence for row in run.rows],
            ),
        )
        row_gates = [
            delta_gate(
                f"{row['task']} {row['metric']} ({row['mode']}) |delta|",
                row["delta"],
                row["stderr"],
                tolerance,
            )
            for row in rows
        ]
        plots = [self.plot, *(run.plot for run in self.divergence)]
        return RecordParts(
            summary=summary,
            metrics={
                "model": self.model,
                "model_weights": self.weights,
                "model_dtype": self.model_dtype,
                "device": self.device,
                "rows": len(rows),
                "rows_passed": counts["passed"],
                "rows_inconclusive": counts["inconclusive"],
                "rows_failed": counts["failed"],
                "tolerance": tolerance,
                **divergence,
                "elapsed_s": round(self.elapsed_s, 1),
            },
            tables=dict(zip(self.RECORD_TABLES, tables, strict=True)),
            gates=row_gates + [gate for run in self.divergence for gate in run.gates()],
            artifacts=files_by_name(self.results_file, *plots),
        )


def _delta_row(row: DeltaRow) -> list[Scalar]:
    # Items that flipped apply to per-item pass/fail metrics only.
    flips = None if row["flips_up"] is None else f"+{row['flips_up']} / -{row['flips_down']}"
    return [
        row["task"],
        row["metric"],
        row["mode"],
        row["n"],
        row["baseline"],
        row["int8"],
        row["delta"],
        row["stderr"],
        f"[{row['ci_low']:.4g}, {row['ci_high']:.4g}]",
        flips,
        row["mcnemar_p"],
        row["detectable_delta"],
        row["verdict"],
    ]


def _with_error(value: float, stderr: float) -> str:
    return f"{value:.4g} ± {stderr:.2g}"


def _divergence_row(row: DivergenceRow) -> list[Scalar]:
    return [
        row["arm"],
        row["kv_cache_dtype"],
        "reads-cache" if row["prefill_reads_cache"] else "skips-cache",
        row["attention"],
        row["tokens"],
        _with_error(row["mean_kld"], row["mean_kld_stderr"]),
        row["median_kld"],
        row["p99_kld"],
        row["p999_kld"],
        row["max_kld"],
        _with_error(row["same_top1"], row["same_top1_stderr"]),
        _with_error(row["ppl_ratio"], row["ppl_ratio_stderr"]),
        _with_error(row["rms_dp"], row["rms_dp_stderr"]),
        row.get("kernel", "prefill"),
        row.get("context"),
        row["expected"],
        row["verdict"],
    ]


def _divergence_metrics(divergence: list[DivergenceResult]) -> dict[str, Scalar]:
    """The first divergence run's candidate, on its first attention path, and its controls."""
    rows = [row for run in divergence for row in run.rows]
    controls = [row for row in rows if row["control"]]
    metrics: dict[str, Scalar] = {
        "divergence_controls_run": len(controls),
        "divergence_controls_failed": sum(not row["behaved"] for row in controls),
    }
    decode = [run for run in divergence if run.kernel == "decode"]
    if decode:
        metrics |= _decode_metrics(decode[0])
    divergence = [run for run in divergence if run.kernel != "decode"]
    if not divergence:
        return metrics
    run = divergence[0]
    first = {row["arm"]: row for row in reversed(run.rows)}  # each arm's first path
    candidate = first["candidate"]
    metrics |= {
        "divergence_candidate": candidate["kv_cache_dtype"],
        "divergence_attention": candidate["attention"],
        "divergence_kernel": run.kernel,
        "divergence_context": f"≤{run.chunk_length}",
        "divergence_corpus": run.corpus,
        "divergence_positions": candidate["tokens"],
        "divergence_mean_kld": candidate["mean_kld"],
        "divergence_mean_kld_stderr": candidate["mean_kld_stderr"],
        "divergence_p99_kld": candidate["p99_kld"],
        "divergence_max_kld": candidate["max_kld"],
        "divergence_same_top1": candidate["same_top1"],
        "divergence_same_top1_stderr": candidate["same_top1_stderr"],
        "divergence_ppl_ratio": candidate["ppl_ratio"],
        "divergence_ppl_ratio_stderr": candidate["ppl_ratio_stderr"],
        "divergence_rms_dp": candidate["rms_dp"],
        "divergence_gate": candidate["verdict"],
    }
    if "degraded" in first:
        metrics |= {
            "degraded_mean_kld": first["degraded"]["mean_kld"],
            "degraded_gate": first["degraded"]["verdict"],
        }
    if "trap" in first:
        metrics |= {
            "trap_max_kld": first["trap"]["max_kld"],
            "trap_verdict": first["trap"]["verdict"],
        }
    if run.agreement is not None:
        metrics["divergence_paths_agree"] = run.agreement["agree"]
    return metrics


def _decode_metrics(run: DivergenceResult) -> dict[str, Scalar]:
    """A decode run's figures: the candidate's worst bucket (highest mean KLD) and whether every
    bucket passed; each control's figures over its buckets."""
    by_arm: dict[str, list[DivergenceRow]] = {}
    for row in run.rows:
        by_arm.setdefault(row["arm"], []).append(row)
    candidate = by_arm.get("candidate", [])
    if not candidate:
        return {}
    worst = max(candidate, key=lambda row: row["mean_kld"])
    metrics: dict[str, Scalar] = {
        "decode_candidate": worst["kv_cache_dtype"],
        "decode_attention": worst["attention"],
        "decode_corpus": run.corpus,
        "decode_documents": run.documents,
        "decode_texts": run.texts,
        "decode_contexts": ", ".join(row["context"] for row in candidate),
        "decode_context_max": max(row["context_keys"][1] for row in candidate),
        "decode_positions": sum(row["tokens"] for row in candidate),
        "decode_worst_context": worst["context"],
        "decode_worst_mean_kld": worst["mean_kld"],
        "decode_worst_mean_kld_stderr": worst["mean_kld_stderr"],
        "decode_worst_p99_kld": worst["p99_kld"],
        "decode_min_same_top1": min(row["same_top1"] for row in candidate),
        "decode_max_ppl_ratio": max(row["ppl_ratio"] for row in candidate),
        "decode_gate": "passed" if all(r["verdict"] == "passed" for r in candidate) else "failed",
        "decode_seconds": round(run.elapsed_s, 1),
    }
    degraded = by_arm.get("degraded", [])
    if degraded:
        metrics |= {
            "decode_degraded_min_mean_kld": min(row["mean_kld"] for row in degraded),
            "decode_degraded_gate": (
                "failed" if all(row["verdict"] == "failed" for row in degraded) else "passed"
            ),
        }
    near = by_arm.get("near-gate", [])
    if near:
        metrics |= {
            "decode_near_gate": near[0]["kv_cache_dtype"],
            "decode_near_gate_mean_kld": max(row["mean_kld"] for row in near),
            "decode_near_gate_min_mean_kld": min(row["mean_kld"] for row in near),
            "decode_near_gate_verdict": (
                "passed" if all(row["verdict"] == "passed" for row in near) else "failed"
            ),
        }
    trap = by_arm.get("twin-trap", [])
    if trap:
        metrics |= {
            "decode_trap_max_kld": max(row["max_kld"] for row in trap),
            "decode_trap_verdict": (
                "exactly-0" if all(row["verdict"] == "exactly-0" for row in trap) else "not-0"
            ),
        }
    return metrics
