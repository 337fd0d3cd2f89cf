"""The decision summaries: one row per question a decision rests on, answered from the evidence.

``<adr dir>/decisions.toml`` declares, per summary block (``decision-0009``, ``decision-0010``,
``decision-0012``), its rows in order: which answer (one of `ANSWERS`, each reading named tables
and metrics of one stage's records), the question in each language, an optional gate on the
row's figure, and whether a milestone needs the row. A row shows its answer, figure, hardware,
date and verdict; a row nothing measured says "not measured" and why. `milestone_problems` is
what a strict milestone run checks: every row it needs measured, passing and fresh.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from adrkit._block_sources import BLOCK_SOURCES, BlockSource
from adrkit._errors import AdrError
from adrkit._evidence import (
    Evidence,
    HardwareClasses,
    collect,
    hardware_class,
    load_hardware,
    read_source,
    read_store,
)
from adrkit._files import is_language_table, read_declarations
from adrkit._freshness import Sources, load_sources, stale, stale_note
from adrkit._labels import label
from adrkit._markdown import Markdown, code_cell, markdown_table, markdown_text
from adrkit.schema import Gate, Record, RecordError, Scalar, Table

DECISIONS_FILE = "decisions.toml"
_MAX_DECISIONS_BYTES = 256 * 2**10

# Words of the summaries, in each ADR language. Fields are filled with Markdown-escaped text.
_LABELS: dict[str, dict[str, str]] = {
    "en": {
        "not-measured": "not measured",
        "no-gate": "no gate",
        "inconclusive": "inconclusive",
        "not-yet-run": "{hardware}: not yet run",
        "compiled-not-yet-run": "{hardware}: compiled, not yet run",
        "why-no-record": "stage {stage} has no record",
        "why-no-timed": "no timed cell (functional checks only, or none ran)",
        "why-no-metric": "the record has no {metric}",
        "why-not-a-number": "the record's {metric} is not a finite number",
        "why-no-column": "the record's table {table} has no column {column}",
        "why-no-rows": "no rows of the kind it needs",
        "no-decisions": "No rows: {file} declares none for this block.",
        "kv-memory": "INT8 stores a token's K and V in {ratio} the bytes of the 16-bit cache",
        "speedup": "INT8 is faster by (the baseline's time over INT8's, lowest to highest over "
        "the timed cells): {parts}",
        "speedup-over": "{span} {baseline}{cell}",
        "speedup-missing": "{baseline} not measured: {why}",
        "weakest-cell": " (lowest: {cell})",
        "figure-over": "≥ {low} {baseline}",
        "vs-16bit": "our 16-bit",
        "vs-upstream_bf16": "upstream bf16",
        "vs-upstream_int8": "upstream INT8",
        "vs-sdpa": "SDPA flash",
        "upstream-was": "upstream: {version}",
        "why-no-pair": "no such pair was timed",
        "parts-separator": "; ",
        "figures-separator": ", ",
        "divergence": (
            "mean KLD {kld}, same top-1 {top1}, perplexity ratio {ppl}, on {positions} positions"
        ),
        "corpus": ", of the corpus",
        "measured-by": "; {kernel} kernel{context}{model}{weights}",
        "model": "; model {model}",
        "weights": "({weights} weights, run in {dtype})",
        "weights-gap": " ",
        "context": ", context {context} tokens",
        "kernel-prefill": "prefill",
        "kernel-decode": "decode",
        "divergence-decode": (
            "every position one decode step, {positions} positions in buckets of context "
            "{contexts} tokens (up to {longest}): worst bucket {worst}, mean KLD {kld}, lowest "
            "same top-1 {top1}, highest perplexity ratio {ppl}; the 4-bit control {degraded} "
            "(mean KLD ≥ {degraded_kld}); near-gate control {near}; trap {trap}; {texts} "
            "texts ({documents})"
        ),
        "near-gate": "{dtype} at mean KLD {low} to {high}, {verdict} the gate (not gated)",
        "no-near-gate": "not run",
        "whole documents": "whole documents",
        "concatenated passages": "concatenated passages",
        "exactly-0": "exactly 0",
        "not-0": "not 0",
        "tasks": "{passed} passed, {inconclusive} inconclusive, {failed} failed of {rows}",
        "correct": "worst error {worst} of its tolerance; {edge} edge cases failed",
        "build": "{cells} cells, {failed} failed; at least {waves} waves per SIMD; {spills} spills",
        "weakest": " (fewest: {cell})",
        "at-triton": "at Triton {release} ({roles}): ",
        "the-target": "the target's",
        "other-triton": "; at Triton {release}: at least {waves} ({cell})",
        "why-no-target-build": "no gfx90a build at the target's Triton {release}:",
        "runs": "correctness on {hardware}: {status}",
        "block-size": "block {best} is fastest: {figures}",
        "compile": "fastest: {best}; {figures}",
        "int8-e2e": "INT8 end to end at {ratio} the 16-bit throughput ({cells} cells)",
        "capacity": (
            "INT8 holds {ratio} the tokens of a 16-bit ({dtype}) cache in the same budget "
            "(computed: {tokens})"
        ),
        "capacity-engine": "; the engine's own auto cache ({dtype} here): {ratio}",
        "why-no-sixteen-bit-row": "no record computes both an INT8 and a 16-bit cache's capacity",
        "fork-same": "yes: {total} files differ, none a vendor change in a risk area",
        "fork-differs": "no: {risk} of {total} differing files are vendor changes in risk areas",
        "stream": "{count} vendor change(s) in stream {stream}",
        "kv-dtypes": "FP8 KV cache: {fp8}; INT8 KV cache: {int8}; backends: {backend}",
        "hooks-kept": "yes: all {checked} hooks of vLLM {release} unchanged",
        "hooks-broken": (
            "no: of {checked} hooks of vLLM {release}, {changed} changed, {missing} missing"
        ),
        "hooks-unchecked": "not checked: the audit was given no hooks file",
        "why-no-timed-step": "no timed served step (they are timed on a GPU)",
        "served-step": "INT8's step takes {span} of upstream vLLM's bf16 step's time (highest: "
        "{step}) and {sixteen} of our 16-bit step's (highest: {sixteen_step}); upstream: "
        "{upstream}",
        "served-host": "an eager step takes {span} the time of the same launches replayed in a "
        "graph (highest: {step})",
    },
    "zh": {
        "not-measured": "未测量",
        "no-gate": "无门限",
        "inconclusive": "无定论",
        "not-yet-run": "{hardware}：尚未运行",
        "compiled-not-yet-run": "{hardware}：已编译，尚未运行",
        "why-no-record": "阶段 {stage} 没有记录",
        "why-no-timed": "没有计时的单元（只有功能检查，或没有运行）",
        "why-no-metric": "记录中没有 {metric}",
        "why-not-a-number": "记录中的 {metric} 不是有限数值",
        "why-no-column": "记录的表 {table} 没有 {column} 列",
        "why-no-rows": "没有所需类型的行",
        "no-decisions": "没有行：{file} 没有为此块声明任何行。",
        "kv-memory": "INT8 存储一个 token 的 K 和 V 所需字节为 16 位缓存的 {ratio}",
        "speedup": (
            "INT8 更快的倍数（基线耗时与 INT8 耗时之比，所有计时单元中的最低至最高）：{parts}"
        ),
        "speedup-over": "相对{baseline} {span}{cell}",
        "speedup-missing": "相对{baseline} 未测量：{why}",
        "weakest-cell": "（最低：{cell}）",
        "figure-over": "相对{baseline} ≥ {low}",
        "vs-16bit": "我们的 16 位",
        "vs-upstream_bf16": "上游 bf16",
        "vs-upstream_int8": "上游 INT8",
        "vs-sdpa": " SDPA flash",
        "upstream-was": "上游：{version}",
        "why-no-pair": "没有计时的这类单元对",
        "parts-separator": "；",
        "figures-separator": "，",
        "divergence": "平均 KLD {kld}，top-1 相同 {top1}，困惑度比 {ppl}，共 {positions} 个位置",
        "corpus": "，语料",
        "measured-by": "；{kernel}内核{context}{model}{weights}",
        "model": "；模型 {model}",
        "weights": "（{weights} 权重，以 {dtype} 运行）",
        "weights-gap": "",
        "context": "，上下文 {context} 个 token",
        "kernel-prefill": "预填充",
        "kernel-decode": "解码",
        "divergence-decode": (
            "每个位置都是一次解码步，共 {positions} 个位置，按上下文长度 {contexts} 个 token "
            "分桶（最长 {longest}）：最差的桶 {worst}，平均 KLD {kld}，top-1 相同最低 {top1}，"
            "困惑度比最高 {ppl}；4 位对照{degraded}（平均 KLD ≥ {degraded_kld}）；"
            "近门限对照 {near}；陷阱 {trap}；{texts} 篇文本（{documents}）"
        ),
        "near-gate": "{dtype} 的平均 KLD 为 {low} 至 {high}，按门限判为{verdict}（不设门限）",
        "no-near-gate": "未运行",
        "whole documents": "完整文档",
        "concatenated passages": "拼接的段落",
        "exactly-0": "恰为 0",
        "not-0": "不为 0",
        "tasks": "共 {rows} 项：{passed} 项通过，{inconclusive} 项无定论，{failed} 项失败",
        "correct": "最大误差为容差的 {worst}；{edge} 个边界用例失败",
        "build": "{cells} 个单元，{failed} 个失败；每 SIMD 至少 {waves} 个波；溢出 {spills}",
        "weakest": "（最少的是 {cell}）",
        "at-triton": "Triton {release}（{roles}）：",
        "the-target": "目标所用",
        "other-triton": "；Triton {release}：至少 {waves} 个波（{cell}）",
        "why-no-target-build": "没有用目标所用的 Triton {release} 构建 gfx90a：",
        "runs": "{hardware} 上的正确性检查：{status}",
        "block-size": "块大小 {best} 最快：{figures}",
        "compile": "最快：{best}；{figures}",
        "int8-e2e": "INT8 端到端吞吐为 16 位的 {ratio}（{cells} 个单元）",
        "capacity": (
            "同一预算下 INT8 容纳的 token 数为 16 位（{dtype}）缓存的 {ratio}（计算值：{tokens}）"
        ),
        "capacity-engine": "；相对引擎自身的 auto 缓存（此处为 {dtype}）：{ratio}",
        "why-no-sixteen-bit-row": "没有记录同时计算 INT8 与 16 位缓存的容量",
        "fork-same": "是：{total} 个文件不同，其中没有落入风险区域的厂商改动",
        "fork-differs": "否：{total} 个不同文件中有 {risk} 个是风险区域内的厂商改动",
        "stream": "计划流 {stream} 中有 {count} 个厂商改动",
        "kv-dtypes": "FP8 KV 缓存：{fp8}；INT8 KV 缓存：{int8}；注意力后端：{backend}",
        "hooks-kept": "是：vLLM {release} 的 {checked} 个挂钩均未改变",
        "hooks-broken": (
            "否：vLLM {release} 的 {checked} 个挂钩中 {changed} 个已改变，{missing} 个缺失"
        ),
        "hooks-unchecked": "未检查：审计没有得到挂钩文件",
        "why-no-timed-step": "没有计时的引擎步（它们在 GPU 上计时）",
        "served-step": "INT8 引擎步耗时为上游 vLLM bf16 引擎步的 {span}（最高：{step}），"
        "为我们 16 位引擎步的 {sixteen}（最高：{sixteen_step}）；上游：{upstream}",
        "served-host": "eager 引擎步耗时为同一组发射在图中重放的 {span}（最高：{step}）",
    },
}
_STATUS = {
    "en": {"passed": "passed", "failed": "failed", "skipped": "skipped"},
    "zh": {"passed": "通过", "failed": "失败", "skipped": "跳过"},
}
_ANSWER_WORDS = {
    "en": {"yes": "yes", "no": "no", "unknown": "unknown", "mentioned": "mentioned"},
    "zh": {"yes": "是", "no": "否", "unknown": "未知", "mentioned": "被提及"},
}


def summary_label(lang: str, key: str, **fields: str) -> str:
    """A summary word or sentence in ``lang``; the caller escapes it."""
    text = _LABELS[lang][key]
    return text.format(**fields) if fields else text


@dataclass(frozen=True)
class Measured:
    """What an answer found: its sentence (Markdown), figure, the record it read, and the value
    a row's gate judges (None: the row takes the record's own verdict)."""

    answer: str
    figure: str
    record: Record
    value: float | None = None
    verdict: str | None = None  # passed | failed | inconclusive, when the record decides


@dataclass(frozen=True)
class NotMeasured:
    """Why nothing answers a row, as Markdown."""

    why: str


Result = Measured | NotMeasured
Answer = Callable[[Evidence, HardwareClasses, str], Result]


@dataclass(frozen=True)
class RowSpec:
    id: str
    answer: str
    question: dict[str, str]
    gate: tuple[str, float] | None = None
    milestone: bool = False


@dataclass(frozen=True)
class Decisions:
    blocks: dict[str, tuple[RowSpec, ...]] = field(default_factory=dict)
    max_age_days: float | None = None


@dataclass(frozen=True)
class DecisionRow:
    """One rendered row: the question, and what the evidence says, with its verdict."""

    spec: RowSpec
    result: Measured | NotMeasured
    verdict: str  # passed | failed | inconclusive | no-gate | not-measured

    @property
    def record(self) -> Record | None:
        return self.result.record if isinstance(self.result, Measured) else None


# ---- the answers: each reads the newest record of one stage that has what it needs ----

# The stage and table each answer reads, from the block that shows the same evidence: the
# pipeline holds `BLOCK_SOURCES` to every stage's tables before any stage runs, so a table a
# stage renames fails there, naming the block, instead of turning summary rows "not measured".
_KERNEL_BUILD = BLOCK_SOURCES["kvquant-resources"]
_CORRECTNESS = BLOCK_SOURCES["kvquant-correctness"]
_TASKS = BLOCK_SOURCES["kvbench-accuracy"]
_DIVERGENCE = BLOCK_SOURCES["kvbench-divergence"]
_KERNEL_SPEED = BLOCK_SOURCES["kvbench-kernel-throughput"]
_CAPACITY = BLOCK_SOURCES["kvbench-capacity"]
_E2E = BLOCK_SOURCES["kvbench-e2e"]
_AUDIT = BLOCK_SOURCES["audit-summary"]
_FINDINGS = BLOCK_SOURCES["audit-findings"]
_QUESTIONS = BLOCK_SOURCES["audit-questions"]
_HOOKS = BLOCK_SOURCES["audit-hooks"]
_SERVED = BLOCK_SOURCES["kvbench-served-step"]


def _newest(evidence: Evidence, stage: str, wanted: Callable[[Record], bool]) -> Record | None:
    return next((f.record for _, f in evidence.by_class(stage) if wanted(f.record)), None)


def _float(value: Scalar) -> float | None:
    """VALUE as a finite number; None for anything else, an integer too large for a float (a
    record may hold one of 400 digits) among it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _number(record: Record, metric: str) -> float | None:
    return _float(record.metrics.get(metric))


def _count(record: Record, metric: str) -> str:
    return str(int(_number(record, metric) or 0))


def _rows(table: Table | None, **where: Scalar) -> list[dict[str, Scalar]]:
    if table is None:
        return []
    return [row for row in table.keyed_rows() if all(row.get(k) == v for k, v in where.items())]


def _gates_verdict(record: Record, prefix: str = "") -> str:
    gates = [g for g in record.gates if g.name.startswith(prefix)]
    if not gates:
        return "passed" if record.status == "passed" else "failed"
    return "passed" if all(g.passed for g in gates) else "failed"


def _x(value: float) -> str:
    return f"{value:.3g}×"


def _missing(evidence: Evidence, stage: str, metric: str, lang: str) -> NotMeasured:
    latest = evidence.latest(stage)
    if latest is None:
        return NotMeasured(summary_label(lang, "why-no-record", stage=code_cell(stage)))
    key = "why-not-a-number" if metric in latest.record.metrics else "why-no-metric"
    return NotMeasured(summary_label(lang, key, metric=code_cell(metric)))


def _column_gap(
    evidence: Evidence, source: BlockSource, columns: tuple[str, ...], lang: str
) -> NotMeasured | None:
    """Why the answer reading ``columns`` of ``source``'s table is not measured, when the newest
    record of its stage holds that table without one of them (a record of another layout)."""
    latest = evidence.latest(source.stage)
    table = latest.record.tables.get(source.table) if latest is not None else None
    absent = [c for c in columns if table is not None and c not in table.columns]
    if not absent:
        return None
    fields = {"table": code_cell(source.table), "column": code_cell(absent[0])}
    return NotMeasured(summary_label(lang, "why-no-column", **fields))


def _measured(lang: str, key: str, figure: str, record: Record, **fields: str) -> Measured:
    return Measured(markdown_text(summary_label(lang, key, **fields)), figure, record)


def _kv_memory(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
    metric = "int8_bytes_per_token_vs_16bit"
    record = _newest(evidence, _CAPACITY.stage, lambda r: _number(r, metric) is not None)
    if record is None:
        return _missing(evidence, _CAPACITY.stage, metric, lang)
    ratio = _number(record, metric) or 0.0
    found = _measured(lang, "kv-memory", _x(ratio), record, ratio=_x(ratio))
    return replace(found, value=ratio)


# The baselines a speed row reads, in the order it names them: our 16-bit kernel (its gate's),
# upstream vLLM's bf16 and INT8 kernels, and for the prefill SDPA flash.
_SPEED_BASELINES = {
    "decode": ("16bit", "upstream_bf16", "upstream_int8"),
    "prefill": ("16bit", "upstream_bf16", "upstream_int8", "sdpa"),
}


def _speedup(op: str) -> Answer:
    low_metric = f"{op}_speedup_vs_16bit_min"

    def answer(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
        stage = _KERNEL_SPEED.stage
        record = _newest(evidence, stage, lambda r: _number(r, low_metric) is not None)
        if record is None:
            if evidence.latest(stage) is None:
                return _missing(evidence, stage, low_metric, lang)
            return NotMeasured(summary_label(lang, "why-no-timed"))
        parts, figures = [], []
        for baseline in _SPEED_BASELINES[op]:
            metric = f"{op}_speedup_vs_{baseline}"
            low, high = _number(record, f"{metric}_min"), _number(record, f"{metric}_max")
            name = summary_label(lang, f"vs-{baseline}")
            if low is None:
                why = _baseline_missing(record, baseline, lang)
                parts.append(summary_label(lang, "speedup-missing", baseline=name, why=why))
                continue
            span = _x(low) if _x(low) == _x(high or low) else f"{_x(low)} – {_x(high or low)}"
            weakest = record.metrics.get(f"{metric}_weakest")
            cell = summary_label(lang, "weakest-cell", cell=str(weakest)) if weakest else ""
            parts.append(summary_label(lang, "speedup-over", baseline=name, span=span, cell=cell))
            figures.append(summary_label(lang, "figure-over", low=_x(low), baseline=name))
        upstream = record.metrics.get("baseline_vllm")
        if isinstance(upstream, str):
            parts.append(summary_label(lang, "upstream-was", version=upstream))
        text = summary_label(
            lang, "speedup", parts=summary_label(lang, "parts-separator").join(parts)
        )
        low = _number(record, low_metric) or 0.0
        figure = summary_label(lang, "figures-separator").join(figures)
        return Measured(markdown_text(text), figure, record, value=low)

    return answer


def _baseline_missing(record: Record, baseline: str, lang: str) -> str:
    """Why a speed row has no figure over ``baseline``: the record's reason for a baseline not
    measured, else that no such pair was timed."""
    impl = {"upstream_bf16": "vllm", "upstream_int8": "vllm", "sdpa": "sdpa"}.get(baseline)
    why = record.metrics.get(f"baseline_{impl}_not_measured") if impl else None
    return why if isinstance(why, str) else summary_label(lang, "why-no-pair")


def _divergence(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
    metric = "divergence_mean_kld"
    record = _newest(evidence, _DIVERGENCE.stage, lambda r: _number(r, metric) is not None)
    if record is None:
        return _missing(evidence, _DIVERGENCE.stage, metric, lang)
    kld = (
        f"{_number(record, metric):.3g} ± {_number(record, 'divergence_mean_kld_stderr') or 0:.1g}"
    )
    fields = {
        "kld": kld,
        "top1": f"{_number(record, 'divergence_same_top1') or 0:.2%}",
        "ppl": f"{_number(record, 'divergence_ppl_ratio') or 0:.4f}",
        "positions": _count(record, "divergence_positions"),
    }
    verdict = _gates_verdict(record, "divergence")
    if record.metrics.get("divergence_controls_failed") != 0:
        verdict = "failed"  # a control that misbehaved voids the measurement
    found = _measured(lang, "divergence", kld, record, **fields)
    corpus = record.metrics.get("divergence_corpus")
    if isinstance(corpus, str):  # which text: the runs' configs choose different corpora
        found = replace(found, answer=found.answer + _corpus(lang, corpus))
    # Records from before decode runs existed hold prefill-kernel figures only.
    kernel = record.metrics.get("divergence_kernel", "prefill")
    context = record.metrics.get("divergence_context")
    answer = found.answer + _measured_by(lang, record, str(kernel), context)
    return replace(found, answer=answer, verdict=verdict)


def _measured_by(lang: str, record: Record, kernel: str, context: Scalar) -> str:
    """Which kernel read the cache, at what context, on which model and weights (the parts the
    record names), as Markdown."""
    metrics = record.metrics
    model, weights = metrics.get("model"), metrics.get("model_weights")
    dtype = metrics.get("model_dtype")
    fields = {
        "kernel": markdown_text(summary_label(lang, f"kernel-{kernel}")),
        "context": markdown_text(summary_label(lang, "context", context=str(context)))
        if context
        else "",
        "model": markdown_text(summary_label(lang, "model", model="{model}")).format(
            model=code_cell(str(model))
        )
        if model
        else "",
        "weights": summary_label(lang, "weights-gap")
        + markdown_text(summary_label(lang, "weights", weights="{w}", dtype="{d}")).format(
            w=code_cell(str(weights)), d=code_cell(str(dtype))
        )
        if weights and dtype
        else "",
    }
    return summary_label(lang, "measured-by", **fields)


def _word(lang: str, value: Scalar) -> str:
    """A record's word in ``lang`` where the summaries have it, else as the record holds it."""
    return _LABELS[lang].get(str(value), str(value))


def _status(lang: str, verdict: Scalar) -> str:
    return _STATUS[lang].get(str(verdict), str(verdict))


def _divergence_decode(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
    """The decode kernel's divergence by context: the candidate's worst bucket, and whether
    every bucket passed and every control behaved."""
    metric = "decode_worst_mean_kld"
    record = _newest(evidence, _DIVERGENCE.stage, lambda r: _number(r, metric) is not None)
    if record is None:
        return _missing(evidence, _DIVERGENCE.stage, metric, lang)
    m = record.metrics
    stderr = _number(record, "decode_worst_mean_kld_stderr") or 0
    kld = f"{_number(record, metric):.3g} ± {stderr:.1g}"
    near = summary_label(lang, "no-near-gate")
    if m.get("decode_near_gate") is not None:
        near = summary_label(
            lang,
            "near-gate",
            dtype=str(m.get("decode_near_gate")),
            low=f"{_number(record, 'decode_near_gate_min_mean_kld') or 0:.3g}",
            high=f"{_number(record, 'decode_near_gate_mean_kld') or 0:.3g}",
            verdict=_status(lang, m.get("decode_near_gate_verdict")),
        )
    fields = {
        "positions": _count(record, "decode_positions"),
        "contexts": str(m.get("decode_contexts")),
        "longest": _count(record, "decode_context_max"),
        "worst": str(m.get("decode_worst_context")),
        "kld": kld,
        "top1": f"{_number(record, 'decode_min_same_top1') or 0:.2%}",
        "ppl": f"{_number(record, 'decode_max_ppl_ratio') or 0:.4f}",
        "degraded": _status(lang, m.get("decode_degraded_gate")),
        "degraded_kld": f"{_number(record, 'decode_degraded_min_mean_kld') or 0:.3g}",
        "near": near,
        "trap": _word(lang, m.get("decode_trap_verdict")),
        "texts": _count(record, "decode_texts"),
        "documents": _word(lang, m.get("decode_documents")),
    }
    found = _measured(lang, "divergence-decode", kld, record, **fields)
    verdict = _gates_verdict(record, "decode divergence")
    if m.get("divergence_controls_failed") != 0:
        verdict = "failed"  # a control that misbehaved voids the measurement
    corpus = m.get("decode_corpus")
    answer = found.answer + (_corpus(lang, corpus) if isinstance(corpus, str) else "")
    answer += _measured_by(lang, record, "decode", None)
    return replace(found, answer=answer, verdict=verdict)


def _corpus(lang: str, corpus: str) -> str:
    return markdown_text(summary_label(lang, "corpus")) + " " + code_cell(corpus)


def _tasks(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
    # A record of a divergence-only run scored no task: it answers nothing here.
    record = _newest(evidence, _TASKS.stage, lambda r: (_number(r, "rows") or 0) > 0)
    if record is None:
        return _missing(evidence, _TASKS.stage, "rows", lang)
    counts = {k: _count(record, f"rows_{k}") for k in ("passed", "inconclusive", "failed")}
    rows = _count(record, "rows")
    found = _measured(lang, "tasks", f"{counts['passed']}/{rows}", record, rows=rows, **counts)
    verdict = "passed"
    if counts["failed"] != "0":
        verdict = "failed"
    elif counts["inconclusive"] != "0":
        verdict = "inconclusive"
    return replace(found, verdict=verdict)


def _correctness(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
    metric = "worst_error_to_tolerance"
    record = _newest(evidence, _CORRECTNESS.stage, lambda r: _number(r, metric) is not None)
    if record is None:
        return _missing(evidence, _CORRECTNESS.stage, metric, lang)
    worst = f"{_number(record, metric):.2g}"
    edge = _count(record, "edge_cases_failed")
    found = _measured(lang, "correct", worst, record, worst=worst, edge=edge)
    return replace(found, verdict=_gates_verdict(record))


def _built_for(record: Record, target: str) -> list[dict[str, Scalar]]:
    return _rows(record.tables.get(_KERNEL_BUILD.table), target=target)


def compiled_for(evidence: Evidence, target: str) -> bool:
    """Whether the newest kernel build passed and compiled and verified every cell for
    ``target``: a hardware class it targets that no stage ran on is "compiled, not yet run"."""
    kernels = evidence.latest(_KERNEL_BUILD.stage)
    if kernels is None or kernels.record.status != "passed":
        return False
    built = _built_for(kernels.record, target)
    return bool(built) and all(row.get("failed") == 0 for row in built)


_GFX90A_BUILD_COLUMNS = ("cells", "failed", "spill_bytes", "waves_per_simd")


def _gfx90a_build(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
    """The gfx90a build at the Triton its target runs, which the row's gate judges (a build
    record of one release, from before the builds named theirs, is read whole); the other
    release's least waves beside it."""
    record = _newest(evidence, _KERNEL_BUILD.stage, lambda r: bool(_built_for(r, "gfx90a")))
    if record is None:
        return _missing(evidence, _KERNEL_BUILD.stage, _KERNEL_BUILD.table, lang)
    target = record.metrics.get("triton_target")
    missing = record.metrics.get("triton_target_not_built")
    if isinstance(target, str) and isinstance(missing, str):
        return NotMeasured(
            markdown_text(summary_label(lang, "why-no-target-build", release=target))
            + " "
            + code_cell(missing)
        )
    rows = _built_for(record, "gfx90a")
    releases = list(dict.fromkeys(str(r["triton"]) for r in rows if "triton" in r))
    gated = str(record.metrics.get("triton_gated") or (releases[0] if releases else ""))
    if releases:
        rows = [r for r in rows if r.get("triton") == gated]
    # A build record of another layout (an older kvquant) may lack a column this row reads:
    # then the row is not measured, rather than read as zero.
    absent = [c for c in _GFX90A_BUILD_COLUMNS if any(c not in r for r in rows)]
    if absent:
        return _missing(evidence, _KERNEL_BUILD.stage, f"{_KERNEL_BUILD.table}.{absent[0]}", lang)
    total = {k: sum(int(_float(r[k]) or 0) for r in rows) for k in ("cells", "failed")}
    spills = sum(int(_float(r["spill_bytes"]) or 0) for r in rows)
    waves, weakest = _fewest_waves(rows)
    fields = {k: str(v) for k, v in total.items()} | {"waves": str(waves), "spills": str(spills)}
    sentence = summary_label(lang, "build", **fields)
    if weakest:
        sentence += summary_label(lang, "weakest", cell=weakest)
    if releases:
        roles = summary_label(lang, "the-target")
        sentence = summary_label(lang, "at-triton", release=gated, roles=roles) + sentence
    for other in (r for r in releases if r != gated):
        other_rows = [r for r in _built_for(record, "gfx90a") if r.get("triton") == other]
        other_waves, other_weakest = _fewest_waves(other_rows)
        sentence += summary_label(
            lang, "other-triton", release=other, waves=str(other_waves), cell=other_weakest or "—"
        )
    verdict = "passed" if total["failed"] == 0 and spills == 0 and record.gates_passed else "failed"
    return Measured(markdown_text(sentence), f"≥ {waves}", record, float(waves), verdict)


def _fewest_waves(rows: list[dict[str, Scalar]]) -> tuple[int, str]:
    """The least waves per SIMD over ``rows``, and the kernel and cache of the row with them."""
    known = [(int(w), r) for r in rows if (w := _float(r.get("waves_per_simd"))) is not None]
    if not known:
        return 0, ""
    waves, row = min(known, key=lambda item: item[0])
    return waves, f"{row.get('kernel', '—')} {row.get('cache', '—')}"


def _gfx90a_runs(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
    name = hardware.label("gfx90a", lang)
    for stage in (_CORRECTNESS.stage, _KERNEL_SPEED.stage, _TASKS.stage):
        found = dict(evidence.by_class(stage)).get("gfx90a")
        if found is not None:
            record = found.record
            status = _STATUS[lang][record.status]
            measured = _measured(lang, "runs", status, record, hardware=name, status=status)
            return replace(measured, verdict=_gates_verdict(record))
    key = "compiled-not-yet-run" if compiled_for(evidence, "gfx90a") else "not-yet-run"
    return NotMeasured(summary_label(lang, key, hardware=markdown_text(name)))


_INT8 = "int8_per_token_head"
_SHAPE = ("block_size", "input_len", "output_len", "batch", "compilation", "graphs")
# INT8 is paired only with a 16-bit row of the same engine: the vLLM release and model dtype its
# row names (absent from records written before rows named them).
_ENGINE = ("vllm_version", "model_dtype")


def _timed_e2e(record: Record, bench: str) -> list[dict[str, Scalar]]:
    """The end-to-end cells of ``bench`` that were timed and measured."""
    rows = _rows(record.tables.get(_E2E.table), bench=bench)
    return [
        row
        for row in rows
        if row.get("measurement") == "timed"
        and row.get("verdict") == "passed"
        and _float(row.get("value")) is not None
    ]


_E2E_COLUMNS = ("bench", "measurement", "verdict", "value", "kv_cache_dtype", *_SHAPE)


def _block_size(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
    def by_block(record: Record) -> dict[Scalar, float]:
        best: dict[Scalar, float] = {}
        for row in _timed_e2e(record, "throughput"):
            if row.get("kv_cache_dtype") != _INT8:
                value = _float(row.get("value")) or 0.0
                block = row.get("block_size")
                best[block] = max(best.get(block, 0.0), value)
        return best

    if gap := _column_gap(evidence, _E2E, _E2E_COLUMNS, lang):
        return gap
    record = _newest(evidence, _E2E.stage, lambda r: len(by_block(r)) > 1)
    if record is None:
        return NotMeasured(summary_label(lang, "why-no-rows"))
    ranked = sorted(by_block(record).items(), key=lambda item: -item[1])
    figures = ", ".join(f"{block}: {value:.4g} tok/s" for block, value in ranked)
    return _measured(
        lang, "block-size", str(ranked[0][0]), record, best=str(ranked[0][0]), figures=figures
    )


def _compilation(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
    def by_variant(record: Record) -> dict[str, float]:
        best: dict[str, float] = {}
        for row in _timed_e2e(record, "latency"):
            name = f"O{row.get('compilation')} {'graphs' if row.get('graphs') else 'eager'}"
            best[name] = min(best.get(name, math.inf), _float(row.get("value")) or math.inf)
        return best

    if gap := _column_gap(evidence, _E2E, _E2E_COLUMNS, lang):
        return gap
    record = _newest(evidence, _E2E.stage, lambda r: len(by_variant(r)) > 1)
    if record is None:
        return NotMeasured(summary_label(lang, "why-no-rows"))
    ranked = sorted(by_variant(record).items(), key=lambda item: item[1])
    figures = ", ".join(f"{name}: {value:.4g} s" for name, value in ranked)
    return _measured(lang, "compile", ranked[0][0], record, best=ranked[0][0], figures=figures)


def _int8_e2e(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
    def ratios(record: Record) -> list[float]:
        rows = _timed_e2e(record, "throughput")
        key = (*_ENGINE, *_SHAPE)
        baseline = {
            tuple(r.get(k) for k in key): r for r in rows if r.get("kv_cache_dtype") != _INT8
        }
        found = []
        for row in rows:
            base = baseline.get(tuple(row.get(k) for k in key))
            base_value = _float(base.get("value")) if base is not None else None
            if row.get("kv_cache_dtype") == _INT8 and base_value:
                found.append((_float(row.get("value")) or 0.0) / base_value)
        return found

    if gap := _column_gap(evidence, _E2E, _E2E_COLUMNS, lang):
        return gap
    record = _newest(evidence, _E2E.stage, lambda r: bool(ratios(r)))
    if record is None:
        return NotMeasured(summary_label(lang, "why-no-timed"))
    found = ratios(record)
    figure = f"{_x(min(found))} – {_x(max(found))}"
    measured = _measured(lang, "int8-e2e", figure, record, ratio=figure, cells=str(len(found)))
    return replace(measured, value=min(found))


_SIXTEEN_BIT = ("bfloat16", "float16")


def _capacity(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
    """INT8's tokens over a 16-bit cache's in the same budget, both computed from the model's
    shape (the engine's own `auto` stores the model's dtype, which for a float32 model would
    double the ratio); the engine's own ratio, as it reported it, beside it."""

    def computed(record: Record) -> tuple[dict[str, Scalar], dict[str, Scalar]] | None:
        rows = _rows(record.tables.get(_CAPACITY.table), source_kind="computed")
        int8 = next((r for r in rows if r.get("kv_cache_dtype") == _INT8), None)
        sixteen = next((r for r in rows if r.get("cache_dtype") in _SIXTEEN_BIT), None)
        if int8 is None or sixteen is None or not _float(sixteen.get("max_tokens")):
            return None
        return int8, sixteen

    columns = ("source_kind", "kv_cache_dtype", "cache_dtype", "max_tokens")
    if gap := _column_gap(evidence, _CAPACITY, columns, lang):
        return gap
    record = _newest(evidence, _CAPACITY.stage, lambda r: computed(r) is not None)
    if record is None:
        return NotMeasured(summary_label(lang, "why-no-sixteen-bit-row"))
    int8, sixteen = computed(record) or ({}, {})
    tokens = _float(int8.get("max_tokens")) or 0.0
    base = _float(sixteen.get("max_tokens")) or 1.0
    value = tokens / base
    fields = {
        "ratio": _x(value),
        "dtype": str(sixteen.get("cache_dtype")),
        "tokens": f"{tokens:,.0f} / {base:,.0f}",
    }
    text = summary_label(lang, "capacity", **fields)
    engine = _engine_capacity(record)
    if engine is not None:
        text += summary_label(lang, "capacity-engine", ratio=_x(engine[0]), dtype=engine[1])
    return Measured(markdown_text(text), _x(value), record, value=value)


def _engine_capacity(record: Record) -> tuple[float, str] | None:
    """INT8's tokens over the engine's `auto` cache's, as the engine reported both."""
    rows = _rows(record.tables.get(_CAPACITY.table), source_kind="engine")
    auto = {r.get("block_size"): r for r in rows if r.get("kv_cache_dtype") == "auto"}
    for row in rows:
        base = auto.get(row.get("block_size"))
        tokens = _float(row.get("max_tokens"))
        base_tokens = _float(base.get("max_tokens")) if base is not None else None
        if row.get("kv_cache_dtype") == _INT8 and tokens and base_tokens and base is not None:
            return tokens / base_tokens, str(base.get("cache_dtype") or "auto")
    return None


def _span(low: float, high: float) -> str:
    return _x(low) if _x(low) == _x(high) else f"{_x(low)} – {_x(high)}"


def _served(field: str, key: str) -> Answer:
    """The INT8 served step's ``field`` (a time ratio: lower is better), from the newest record
    that timed one: its range over the steps, and the step where it is highest, which a row's gate
    judges."""
    metric = f"served_int8_{field}_max"

    def answer(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
        stage = _SERVED.stage
        record = _newest(evidence, stage, lambda r: _number(r, metric) is not None)
        if record is None:
            if evidence.latest(stage) is None:
                return _missing(evidence, stage, metric, lang)
            return NotMeasured(summary_label(lang, "why-no-timed-step"))
        high = _number(record, metric) or 0.0
        low = _number(record, f"served_int8_{field}_min") or high
        fields = {
            "span": _span(low, high),
            "step": str(record.metrics.get(f"served_int8_{field}_worst")),
        }
        if key == "served-step":
            sixteen = _number(record, "served_int8_time_vs_16bit_max")
            fields["sixteen"] = (
                _x(sixteen) if sixteen is not None else summary_label(lang, "not-measured")
            )
            fields["sixteen_step"] = str(record.metrics.get("served_int8_time_vs_16bit_worst"))
            upstream = record.metrics.get("served_baseline_vllm")
            fields["upstream"] = str(
                upstream or record.metrics.get("served_baseline_vllm_not_measured")
            )
        return replace(_measured(lang, key, _x(high), record, **fields), value=high)

    return answer


def _fork_base(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
    record = _newest(evidence, _AUDIT.stage, lambda r: isinstance(r.metrics.get("surprise"), bool))
    if record is None:
        return _missing(evidence, _AUDIT.stage, "surprise", lang)
    key = "fork-differs" if record.metrics["surprise"] else "fork-same"
    total, risk = _count(record, "files_total"), _count(record, "vendor_risk_files")
    measured = _measured(lang, key, f"{risk}/{total}", record, total=total, risk=risk)
    return replace(measured, verdict=_gates_verdict(record))


def _stream(stream: str) -> Answer:
    metric = f"vendor_risk_stream_{stream.lower()}"

    def answer(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
        record = _newest(evidence, _FINDINGS.stage, lambda r: _number(r, metric) is not None)
        if record is None:
            return _missing(evidence, _FINDINGS.stage, metric, lang)
        count = _count(record, metric)
        findings = _rows(record.tables.get(_FINDINGS.table), stream=stream)
        paths = sorted({str(row.get("path")) for row in findings if row.get("path") is not None})
        files = "".join(
            [": ", ", ".join(code_cell(p) for p in paths[:5]), ", …" if len(paths) > 5 else ""]
        )
        sentence = summary_label(lang, "stream", count=count, stream=stream)
        verdict = "passed" if count == "0" else "failed"
        answer = markdown_text(sentence) + (files if paths else "")
        return Measured(answer, count, record, value=float(count), verdict=verdict)

    return answer


def _kv_dtypes(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
    stage, table = _QUESTIONS.stage, _QUESTIONS.table
    record = _newest(evidence, stage, lambda r: bool(_rows(r.tables.get(table))))
    if record is None:
        return _missing(evidence, stage, table, lang)
    if gap := _column_gap(evidence, _QUESTIONS, ("question", "answer"), lang):
        return gap
    answers = {
        str(r.get("question")): str(r.get("answer")) for r in _rows(record.tables.get(table))
    }
    words = _ANSWER_WORDS[lang]
    asked = {"fp8": "fp8_kv_cache", "int8": "int8_kv_cache", "backend": "attention_backend"}
    fields = {key: words.get(answers.get(question, ""), "—") for key, question in asked.items()}
    changed = [q for q in asked.values() if answers.get(q) in ("yes", "unknown")]
    measured = _measured(lang, "kv-dtypes", str(len(changed)), record, **fields)
    return replace(measured, verdict="failed" if changed else "passed")


def _plugin_hooks(evidence: Evidence, hardware: HardwareClasses, lang: str) -> Result:
    """Whether the fork still offers every upstream symbol the plugin relies on; the hooks it
    changed or lacks are named."""
    metric = "plugin_hooks_checked"
    record = _newest(evidence, _HOOKS.stage, lambda r: _number(r, metric) is not None)
    if record is None:
        return _missing(evidence, _HOOKS.stage, metric, lang)
    checked = _count(record, metric)
    if checked == "0":
        found = _measured(lang, "hooks-unchecked", "0", record)
        return replace(found, verdict="failed")
    changed, missing = (
        _count(record, "plugin_hooks_changed"),
        _count(record, "plugin_hooks_missing"),
    )
    fields = {
        "checked": checked,
        "changed": changed,
        "missing": missing,
        "release": str(record.metrics.get("plugin_hooks_release")),
    }
    broken = [
        str(row["symbol"])
        for row in _rows(record.tables.get(_HOOKS.table))
        if row.get("status") != "unchanged"
    ]
    key = "hooks-broken" if broken or changed != "0" or missing != "0" else "hooks-kept"
    kept = int(checked) - int(changed) - int(missing)
    found = _measured(lang, key, f"{kept}/{checked}", record, **fields)
    named = "".join(
        [": ", ", ".join(code_cell(s) for s in broken[:5]), ", …" if len(broken) > 5 else ""]
    )
    answer = found.answer + (named if broken else "")
    return replace(found, answer=answer, verdict=_gates_verdict(record, "plugin_hooks"))


ANSWERS: dict[str, Answer] = {
    "kv-memory": _kv_memory,
    "decode-speed": _speedup("decode"),
    "prefill-speed": _speedup("prefill"),
    "divergence": _divergence,
    "divergence-decode": _divergence_decode,
    "tasks": _tasks,
    "correctness": _correctness,
    "gfx90a-build": _gfx90a_build,
    "gfx90a-runs": _gfx90a_runs,
    "block-size": _block_size,
    "compilation": _compilation,
    "int8-e2e": _int8_e2e,
    "kv-capacity": _capacity,
    "fork-base": _fork_base,
    "stream-a": _stream("A"),
    "stream-b": _stream("B"),
    "stream-c": _stream("C"),
    "kv-dtypes": _kv_dtypes,
    "plugin-hooks": _plugin_hooks,
    "served-step": _served("time_vs_upstream_bf16", "served-step"),
    "served-host": _served("eager_over_graph", "served-host"),
}


# ---- the declarations, the rows and the blocks ----


def load_decisions(adr_dir: Path) -> Decisions:
    """``<adr dir>/decisions.toml``, checked whole; no file means no summaries."""
    path = adr_dir / DECISIONS_FILE
    data = read_declarations(path, _MAX_DECISIONS_BYTES)
    if data is None:
        return Decisions()
    max_age = None
    blocks: dict[str, tuple[RowSpec, ...]] = {}
    for key, value in data.items():
        if key == "milestone":
            max_age = _max_age(path, value)
        elif key in SUMMARY_KEYS and isinstance(value, list):
            blocks[key] = tuple(_row_spec(path, key, i, entry) for i, entry in enumerate(value))
        else:
            msg = f"{path}: `{key}` is not one of milestone, {', '.join(SUMMARY_KEYS)} ([[...]])"
            raise AdrError(msg)
    return Decisions(blocks, max_age)


def _max_age(path: Path, value: object) -> float:
    age = value.get("max_age_days") if isinstance(value, dict) else None
    if not isinstance(value, dict) or set(value) != {"max_age_days"} or not _positive(age):
        msg = f"{path}: [milestone] must hold exactly `max_age_days`, a positive number"
        raise AdrError(msg)
    return float(age)  # type: ignore[arg-type]


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _row_spec(path: Path, block: str, index: int, entry: object) -> RowSpec:
    where = f"{path}: {block}[{index}]"
    known = {"answer", "question", "gate", "milestone"}
    if not isinstance(entry, dict) or not {"answer", "question"} <= set(entry) <= known:
        msg = f"{where} must be a table of `answer`, `question` and optional `gate`, `milestone`"
        raise AdrError(msg)
    answer, question = entry["answer"], entry["question"]
    if answer not in ANSWERS:
        msg = f"{where}: answer {answer!r} is not one of {', '.join(ANSWERS)}"
        raise AdrError(msg)
    if not is_language_table(question):
        msg = f"{where}: `question` must be a table of language = text"
        raise AdrError(msg)
    gate = entry.get("gate")
    parsed_gate = None
    if gate is not None:
        threshold = gate.get("threshold") if isinstance(gate, dict) else None
        op = gate.get("op") if isinstance(gate, dict) else None
        if not isinstance(gate, dict) or set(gate) != {"op", "threshold"}:
            msg = f"{where}: `gate` must be {{ op = ..., threshold = ... }}"
            raise AdrError(msg)
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            msg = f"{where}: gate threshold {threshold!r} is not a number"
            raise AdrError(msg)
        try:
            Gate.judge(answer, 0.0, str(op), float(threshold))
        except RecordError as exc:
            raise AdrError(f"{where}: {exc}") from None
        if not math.isfinite(threshold):
            msg = f"{where}: gate threshold {threshold!r} is not finite"
            raise AdrError(msg)
        parsed_gate = (str(op), float(threshold))
    milestone = entry.get("milestone", False)
    if not isinstance(milestone, bool):
        msg = f"{where}: `milestone` must be true or false"
        raise AdrError(msg)
    return RowSpec(answer, answer, dict(question), parsed_gate, milestone)


def decision_rows(
    block: str, decisions: Decisions, evidence: Evidence, hardware: HardwareClasses, lang: str
) -> list[DecisionRow]:
    rows = []
    for spec in decisions.blocks.get(block, ()):
        result = ANSWERS[spec.answer](evidence, hardware, lang)
        rows.append(DecisionRow(spec, result, _verdict(spec, result)))
    return rows


def _verdict(spec: RowSpec, result: Result) -> str:
    if isinstance(result, NotMeasured):
        return "not-measured"
    if spec.gate is not None and result.value is not None:
        op, threshold = spec.gate
        gate_verdict = (
            "passed" if Gate.judge(spec.id, result.value, op, threshold).passed else "failed"
        )
        if result.verdict == "failed":
            return "failed"
        return gate_verdict
    return result.verdict or "no-gate"


def render_summary(
    block: str,
    evidence: Evidence,
    hardware: HardwareClasses,
    decisions: Decisions,
    lang: str,
    sources: Sources | None = None,
) -> str:
    """The decision summary ``block``: a table of its rows, in the ADR's language; each row
    names the commit its evidence came from, and says so when the sources it measured changed
    since (``sources``: none judged when None)."""
    rows = decision_rows(block, decisions, evidence, hardware, lang)
    if not rows:
        return markdown_text(summary_label(lang, "no-decisions", file=DECISIONS_FILE))
    judged = sources or Sources()
    return markdown_table(lang, _COLUMNS, [_cells(row, hardware, lang, judged) for row in rows])


_COLUMNS = [
    "question",
    "answer",
    "evidence_figure",
    "hardware",
    "date",
    "evidence_commit",
    "verdict",
]


def _cells(
    row: DecisionRow, hardware: HardwareClasses, lang: str, sources: Sources
) -> list[Scalar]:
    question = row.spec.question.get(lang) or row.spec.question.get("en") or row.spec.id
    verdict = Markdown(markdown_text(_verdict_word(row.verdict, lang)))
    if isinstance(row.result, NotMeasured):
        missing = Markdown(markdown_text(summary_label(lang, "not-measured")))
        return [question, Markdown(row.result.why), missing, None, None, None, verdict]
    record = row.result.record
    name = hardware.label(hardware_class(record), lang, record)
    date = record.provenance.ended.strftime("%Y-%m-%d")
    commit = code_cell((record.provenance.repo_commit or "unknown")[:12])
    found = stale(record, sources)
    if found is not None:
        note = stale_note(found, sources, lang)
        commit = Markdown(label(lang, "with-note", text=commit, note=note))
    return [
        question,
        Markdown(row.result.answer),
        Markdown(markdown_text(row.result.figure)),
        name,
        date,
        commit,
        verdict,
    ]


def _verdict_word(verdict: str, lang: str) -> str:
    if verdict in _STATUS[lang]:
        return _STATUS[lang][verdict]
    key = {"not-measured": "not-measured", "no-gate": "no-gate", "inconclusive": "inconclusive"}
    return summary_label(lang, key[verdict])


def milestone_problems(
    adr_dir: Path, results: Path | None, now: datetime | None = None
) -> list[str]:
    """One line per decision-summary row a milestone needs (``milestone = true``) that is not
    measured, failed, older than ``max_age_days``, or stale (its sources changed since it ran,
    `adrkit._freshness`), from the evidence of ``results`` and the store; empty when the
    milestone's evidence stands."""
    decisions, hardware = load_decisions(adr_dir), load_hardware(adr_dir)
    declared = load_sources(adr_dir)
    read = [*(read_source(results) if results is not None else []), *read_store(adr_dir)]
    evidence = collect(read)
    now = now or datetime.now(UTC)
    problems = []
    for block in decisions.blocks:
        for row in decision_rows(block, decisions, evidence, hardware, "en"):
            if not row.spec.milestone:
                continue
            where = f"{block} row `{row.spec.id}`"
            if isinstance(row.result, NotMeasured):
                problems.append(f"{where}: not measured ({row.result.why})")
                continue
            if row.verdict == "failed":
                problems.append(f"{where}: failed ({row.result.figure})")
            found = stale(row.result.record, declared)
            if found is not None:
                problems.append(f"{where}: {_plain(stale_note(found, declared, 'en'))}")
            age = now - row.result.record.provenance.ended
            if decisions.max_age_days is not None and age > timedelta(days=decisions.max_age_days):
                problems.append(
                    f"{where}: its evidence is {age.days} days old, over the "
                    f"{decisions.max_age_days:g} a milestone accepts"
                )
    return problems


def _plain(markdown: str) -> str:
    """A stale note as a line of a message: its code spans' backticks dropped."""
    return markdown.replace("`", "")


SUMMARY_KEYS = ("decision-0009", "decision-0010", "decision-0012")
