"""The decision summaries' words in each ADR language, and what an answer gives a row: its
sentence and figure (`Measured`), or why nothing answers it (`NotMeasured`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from adrkit._evidence import (
    Evidence,
    HardwareClasses,
)
from adrkit.schema import Record

# Words of the summaries, in each ADR language. Fields are filled with Markdown-escaped text.
SUMMARY_LABELS: dict[str, dict[str, str]] = {
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
STATUS_WORDS = {
    "en": {"passed": "passed", "failed": "failed", "skipped": "skipped"},
    "zh": {"passed": "通过", "failed": "失败", "skipped": "跳过"},
}
ANSWER_WORDS = {
    "en": {"yes": "yes", "no": "no", "unknown": "unknown", "mentioned": "mentioned"},
    "zh": {"yes": "是", "no": "否", "unknown": "未知", "mentioned": "被提及"},
}


def summary_label(lang: str, key: str, **fields: str) -> str:
    """A summary word or sentence in ``lang``; the caller escapes it."""
    text = SUMMARY_LABELS[lang][key]
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
