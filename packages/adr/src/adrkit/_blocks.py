"""Renderers for generated blocks, one per block key, in English and Chinese.

A renderer turns the latest results records into Markdown. It reads records only, never a
package, so a block shows exactly what a stage recorded. Every block ends with the run id and the
commit of each record it used, so each figure can be traced to the run that produced it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from adrkit._errors import RenderError
from adrkit._record import Record, Scalar, Table

Records = Mapping[str, Record]
Renderer = Callable[[Records, str], str]

# Labels for record fields, metric ids and table column ids. An id with no label shows as-is.
_LABELS: dict[str, dict[str, str]] = {
    "en": {
        "stage": "Stage",
        "status": "Status",
        "detail": "Detail",
        "gates": "Gates passed",
        "run": "Run",
        "passed": "passed",
        "failed": "failed",
        "skipped": "skipped",
        "no-results": "No results yet: stage `{stage}` has not run.",
        "source": (
            "Source: stage `{stage}`, run `{run}`{flow}, commit `{commit}`, finished {ended}."
        ),
        "flow-run": " (flow run `{id}`)",
        "gate": "Gate",
        "value": "Value",
        "threshold": "Threshold",
        "verdict": "Verdict",
        "fork": "Fork",
        "upstream": "Upstream",
        "scope": "Scope",
        "fork_commit": "Fork commit",
        "fork_tree": "Fork tree",
        "files_total": "Files differing",
        "files_added": "Added",
        "files_modified": "Modified",
        "files_deleted": "Deleted",
        "files_renamed": "Renamed",
        "files_binary": "Binary",
        "files_left_out": "Left out (build outputs)",
        "vendor_risk_changes": "Vendor changes in risk areas",
        "env_vars_added": "Env vars added",
        "env_vars_removed": "Env vars removed",
        "env_vars_default_changed": "Env var defaults changed",
        "path": "Path",
        "stream": "Stream",
        "area": "Area",
        "origin": "Origin (vendor / upstream drift)",
        "streams": "Streams",
        "reason": "Reason",
        "lines": "Lines +/-",
        "no-findings": "No vendor change falls in a risk area.",
        "no-changes": "No file differs.",
        "nothing-left-out": "Nothing was left out.",
        "side": "Side",
        "kernel": "Kernel",
        "dtype": "Cache, model dtype",
        "head_size": "Head size",
        "block_size": "Block size",
        "gqa": "GQA",
        "rel_l2": "Rel. L2 vs reference",
        "tolerance": "Tolerance",
        "quant_rel_l2": "Quantization rel. L2",
        "case": "Case",
        "no-cases": "No cases were run.",
        "target": "Target",
        "cache": "Cache",
        "cells": "Cells",
        "vgprs": "VGPRs, NVIDIA: registers (max)",
        "agprs": "AGPRs (max)",
        "sgprs": "SGPRs (max)",
        "lds_bytes": "LDS bytes (max)",
        "spill_bytes": "Spill bytes (max)",
        "scratch_bytes": "Scratch bytes (max)",
        "waves_per_simd": "Waves per SIMD (min)",
        "specialization": "Specialization",
        "field": "Field",
        "old": "Before",
        "new": "Now",
        "no-diff": "No resource use changed since the previous build.",
        "no-previous-build": (
            "No previous build under this results root: nothing to compare against."
        ),
        "no-rows": "No rows were measured.",
        "figure": "Figure",
        "task": "Task",
        "metric": "Metric",
        "mode": "Scoring mode",
        "n": "Items",
        "baseline": "16-bit",
        "int8": "INT8",
        "delta": "Delta",
        "stderr": "Std. error of delta",
        "ci95": "95% CI",
        "flips": "Items flipped (+ / -)",
        "mcnemar_p": "McNemar p",
        "detectable_delta": "Smallest detectable delta (80% power)",
        "inconclusive": "inconclusive",
        "arm": "Row",
        "attention": "Attention path",
        "positions": "Positions",
        "mean_kld": "Mean KLD ± s.e.",
        "median_kld": "Median KLD",
        "p99_kld": "99% KLD",
        "p999_kld": "99.9% KLD",
        "max_kld": "Max KLD",
        "same_top1": "Same top-1 ± s.e.",
        "ppl_ratio": "PPL ratio ± s.e.",
        "rms_dp": "RMS Δp ± s.e.",
        "expected": "Must be",
        "exactly-0": "exactly 0",
        "not-0": "not 0",
        "op": "Kernel",
        "cache_dtype": "Cache dtype",
        "batch": "Batch",
        "context": "Context",
        "median_ms": "Median ms",
        "spread": "Spread",
        "gbs": "GB/s",
        "copy_fraction": "Of copy bandwidth",
        "speedup_vs_16bit": "Speed-up vs 16-bit",
        "regression": "Regression",
        "bench": "Benchmark",
        "kv_cache_dtype": "KV cache dtype",
        "compilation": "Compilation level",
        "graphs": "CUDA/HIP graphs",
        "input_len": "Input len",
        "output_len": "Output len",
        "unit": "Unit",
        "engine_start_s": "Engine start s",
        "seq_len": "Sequence len",
        "max_tokens": "Max tokens",
        "max_seqs": "Max sequences",
        "source_kind": "Source",
    },
    "zh": {
        "stage": "阶段",
        "status": "状态",
        "detail": "说明",
        "gates": "通过的门限",
        "run": "运行",
        "passed": "通过",
        "failed": "失败",
        "skipped": "跳过",
        "no-results": "暂无结果：阶段 `{stage}` 尚未运行。",
        "source": "来源：阶段 `{stage}`，运行 `{run}`{flow}，提交 `{commit}`，完成于 {ended}。",
        "flow-run": "（流程运行 `{id}`）",
        "gate": "门限",
        "value": "数值",
        "threshold": "阈值",
        "verdict": "结论",
        "fork": "厂商分支",
        "upstream": "上游",
        "scope": "范围",
        "fork_commit": "分支提交",
        "fork_tree": "分支树",
        "files_total": "差异文件数",
        "files_added": "新增",
        "files_modified": "修改",
        "files_deleted": "删除",
        "files_renamed": "重命名",
        "files_binary": "二进制",
        "files_left_out": "排除（构建产物）",
        "vendor_risk_changes": "风险区域内的厂商改动",
        "env_vars_added": "新增环境变量",
        "env_vars_removed": "删除环境变量",
        "env_vars_default_changed": "默认值改变的环境变量",
        "path": "路径",
        "stream": "计划流",
        "area": "区域",
        "origin": "归属（厂商 / 上游演进）",
        "streams": "计划流",
        "reason": "原因",
        "lines": "行数 +/-",
        "no-findings": "没有厂商改动落在风险区域内。",
        "no-changes": "没有文件不同。",
        "nothing-left-out": "没有排除任何文件。",
        "side": "所在一侧",
        "kernel": "内核",
        "dtype": "缓存、模型数据类型",
        "head_size": "头维度",
        "block_size": "块大小",
        "gqa": "GQA 比",
        "rel_l2": "相对参考的 L2 误差",
        "tolerance": "容差",
        "quant_rel_l2": "量化本身的 L2 误差",
        "case": "用例",
        "no-cases": "没有运行任何用例。",
        "target": "目标",
        "cache": "缓存",
        "cells": "单元数",
        "vgprs": "VGPR，NVIDIA 为寄存器（最大）",
        "agprs": "AGPR（最大）",
        "sgprs": "SGPR（最大）",
        "lds_bytes": "LDS 字节（最大）",
        "spill_bytes": "溢出字节（最大）",
        "scratch_bytes": "scratch 字节（最大）",
        "waves_per_simd": "每 SIMD 波数（最小）",
        "specialization": "特化",
        "field": "字段",
        "old": "之前",
        "new": "现在",
        "no-diff": "与上一次构建相比，资源占用没有变化。",
        "no-previous-build": "此结果目录下没有之前的构建：没有可比较的对象。",
        "no-rows": "没有测得任何结果。",
        "figure": "图",
        "task": "任务",
        "metric": "指标",
        "mode": "评分方式",
        "n": "题数",
        "baseline": "16 位",
        "int8": "INT8",
        "delta": "差值",
        "stderr": "差值标准误",
        "ci95": "95% 置信区间",
        "flips": "翻转题数（+ / -）",
        "mcnemar_p": "McNemar p 值",
        "detectable_delta": "可检出的最小差值（80% 功效）",
        "inconclusive": "无定论",
        "arm": "行",
        "attention": "注意力路径",
        "positions": "位置数",
        "mean_kld": "平均 KLD ± 标准误",
        "median_kld": "KLD 中位数",
        "p99_kld": "KLD 99% 分位",
        "p999_kld": "KLD 99.9% 分位",
        "max_kld": "KLD 最大值",
        "same_top1": "top-1 不变比例 ± 标准误",
        "ppl_ratio": "困惑度比 ± 标准误",
        "rms_dp": "Δp 均方根 ± 标准误",
        "expected": "应为",
        "exactly-0": "恰为 0",
        "not-0": "不为 0",
        "op": "内核",
        "cache_dtype": "缓存数据类型",
        "batch": "批大小",
        "context": "上下文长度",
        "median_ms": "中位数 ms",
        "spread": "离散度",
        "gbs": "GB/s",
        "copy_fraction": "占拷贝带宽",
        "speedup_vs_16bit": "相对 16 位加速比",
        "regression": "性能回退",
        "bench": "基准",
        "kv_cache_dtype": "KV 缓存数据类型",
        "compilation": "编译级别",
        "graphs": "CUDA/HIP graphs",
        "input_len": "输入长度",
        "output_len": "输出长度",
        "unit": "单位",
        "engine_start_s": "引擎启动 s",
        "seq_len": "序列长度",
        "max_tokens": "最大 token 数",
        "max_seqs": "最大序列数",
        "source_kind": "来源",
    },
}


def label(lang: str, key: str, **fields: str) -> str:
    text = _LABELS[lang].get(key, key)
    return text.format(**fields) if fields else text


# Cell values that are words of the record schema, shown in the ADR's language.
_TRANSLATED_CELLS = frozenset({"passed", "failed", "skipped", "inconclusive", "exactly-0", "not-0"})


def _cell(lang: str, value: Scalar) -> str:
    if isinstance(value, str) and value in _TRANSLATED_CELLS:
        return label(lang, value)
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(lang: str, columns: Sequence[str], rows: Sequence[Sequence[Scalar]]) -> str:
    header = "| " + " | ".join(label(lang, c) for c in columns) + " |"
    rule = "|" + "---|" * len(columns)
    body = ["| " + " | ".join(_cell(lang, v) for v in row) + " |" for row in rows]
    return "\n".join([header, rule, *body])


def source_line(record: Record, lang: str) -> str:
    p = record.provenance
    flow = label(lang, "flow-run", id=p.flow_run_id) if p.flow_run_id else ""
    commit = (p.repo_commit or "unknown")[:12]
    return (
        "_"
        + label(
            lang,
            "source",
            stage=record.stage,
            run=p.run_id,
            flow=flow,
            commit=commit,
            ended=p.ended_at,
        )
        + "_"
    )


def _require(records: Records, stage: str, lang: str) -> Record | str:
    """The stage's record, or the localized note that it has not run yet."""
    record = records.get(stage)
    return record if record is not None else "_" + label(lang, "no-results", stage=stage) + "_"


def _gate_table(record: Record, lang: str) -> str:
    rows: list[list[Scalar]] = [
        [
            g.name,
            g.value,
            f"{g.op} {g.threshold:g}",
            label(lang, "passed" if g.passed else "failed"),
        ]
        for g in record.gates
    ]
    return markdown_table(lang, ["gate", "value", "threshold", "verdict"], rows)


def render_pipeline_status(records: Records, lang: str) -> str:
    """Every stage's latest status, with the run that produced it."""
    rows: list[list[Scalar]] = []
    for stage in sorted(records):
        r = records[stage]
        passed = sum(g.passed for g in r.gates)
        rows.append(
            [
                stage,
                label(lang, r.status),
                r.reason or r.summary,
                f"{passed}/{len(r.gates)}",
                r.provenance.run_id,
            ]
        )
    table = markdown_table(lang, ["stage", "status", "detail", "gates", "run"], rows)
    return "\n\n".join([table, *(source_line(records[s], lang) for s in sorted(records))])


def _metrics_table(record: Record, lang: str, keys: Sequence[str]) -> str:
    rows: list[list[Scalar]] = [[label(lang, k), record.metrics.get(k)] for k in keys]
    return markdown_table(lang, ["detail", "value"], rows)


_AUDIT_SUMMARY_METRICS = (
    "fork",
    "upstream",
    "scope",
    "fork_commit",
    "fork_tree",
    "files_total",
    "files_added",
    "files_modified",
    "files_deleted",
    "files_renamed",
    "files_binary",
    "files_left_out",
    "env_vars_added",
    "env_vars_removed",
    "env_vars_default_changed",
    "vendor_risk_changes",
)


def render_audit_summary(records: Records, lang: str) -> str:
    """ADR 0012: what differs between the fork and upstream, in counts, and the verdict."""
    record = _require(records, "audit", lang)
    if isinstance(record, str):
        return record
    parts = [f"**{label(lang, 'verdict')}:** {record.summary}"]
    if record.status != "skipped" and record.metrics:
        parts += [_metrics_table(record, lang, _AUDIT_SUMMARY_METRICS), _gate_table(record, lang)]
    elif record.reason:
        parts.append(record.reason)
    parts.append(source_line(record, lang))
    return "\n\n".join(parts)


ASSETS_DIR = "assets"


def asset_name(stage: str, artifact: str) -> str:
    """Where a record's figure is copied beside the ADRs, relative to the ADR directory."""
    return f"{ASSETS_DIR}/{stage}-{artifact}"


def is_figure(artifact: str) -> bool:
    return artifact.endswith(".png")


def render_record_table(
    stage: str,
    table: str,
    empty_key: str,
    figures: Sequence[str] = (),
    no_baseline_key: str | None = None,
) -> Renderer:
    """A renderer that shows one named table of one stage's record, then the named figures
    the record has (PNG artifacts, which the writer copies beside the ADRs).

    A table without rows shows the label `empty_key`, or `no_baseline_key` when the table says
    there was no earlier result to compare against (`Table.baseline_found` is False). A record
    without the table (its stage crashed first) shows its reason instead.
    """

    def render(records: Records, lang: str) -> str:
        record = _require(records, stage, lang)
        if isinstance(record, str):
            return record
        if record.status == "skipped":
            return "\n\n".join([record.reason or record.summary, source_line(record, lang)])
        found: Table | None = record.tables.get(table)
        if found is None and record.reason:  # the stage ended (crashed) before the table
            body = record.reason
        elif found is not None and found.rows:
            body = markdown_table(lang, found.columns, found.rows)
        elif found is not None and found.baseline_found is False and no_baseline_key:
            body = label(lang, no_baseline_key)
        else:
            body = label(lang, empty_key)
        shown = [
            f"![{label(lang, 'figure')}: {name}]({asset_name(stage, name)})"
            for name in figures
            if name in record.artifacts
        ]
        return "\n\n".join([body, *shown, source_line(record, lang)])

    return render


BLOCKS: dict[str, Renderer] = {
    "pipeline-status": render_pipeline_status,
    "audit-summary": render_audit_summary,
    "audit-findings": render_record_table("audit", "findings", "no-findings"),
    "audit-changes": render_record_table("audit", "changes", "no-changes"),
    "audit-left-out": render_record_table("audit", "left-out", "nothing-left-out"),
    "kvquant-correctness": render_record_table("correctness", "errors", "no-cases"),
    "kvquant-edge-cases": render_record_table("correctness", "edge-cases", "no-cases"),
    "kvquant-resources": render_record_table("kernels", "resources", "no-cases"),
    "kvquant-resource-diff": render_record_table(
        "kernels", "resource-diff", "no-diff", no_baseline_key="no-previous-build"
    ),
    "kvbench-accuracy": render_record_table(
        "accuracy", "deltas", "no-rows", figures=("accuracy_deltas.png",)
    ),
    "kvbench-divergence": render_record_table(
        "accuracy", "divergence", "no-rows", figures=("divergence_kld.png",)
    ),
    "kvbench-kernel-throughput": render_record_table(
        "throughput",
        "kernels",
        "no-rows",
        figures=("throughput-kernel-vs-context.png", "throughput-kernel-vs-batch.png"),
    ),
    "kvbench-capacity": render_record_table("throughput", "capacity", "no-rows"),
    "kvbench-e2e": render_record_table(
        "throughput",
        "e2e",
        "no-rows",
        figures=(
            "throughput-e2e-vs-batch.png",
            "throughput-e2e-vs-input_len.png",
            "throughput-trend.png",
        ),
    ),
}


def render_block(key: str, records: Records, lang: str) -> str:
    renderer = BLOCKS.get(key)
    if renderer is None:
        msg = f"no renderer knows block key {key!r}; known keys: {', '.join(sorted(BLOCKS))}"
        raise RenderError(msg)
    return renderer(records, lang)
