"""Renderers for generated blocks, one per block key, in English and Chinese.

A renderer turns the latest results records into Markdown. It reads records only, never a
package, so a block shows exactly what a stage recorded. Every block ends with the run id and the
commit of each record it used, so each figure can be traced to the run that produced it.

Every text a renderer shows, whether it comes from a record or from the labels here, goes through
`markdown_text`, so no record can write a marker, an HTML comment or a table cell of its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from adrkit._block_sources import BLOCK_SOURCES
from adrkit._evidence import hardware_class
from adrkit._record import Record, Scalar, Table

Records = Mapping[str, Record]
Renderer = Callable[[Records, str], str]


class Markdown(str):
    """A table cell a renderer has already written as Markdown, every piece of record text in it
    escaped (see `code_cell`); `markdown_table` keeps it as it is."""

    __slots__ = ()


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
        "stage-message": "The stage's own message:",
        "evidence_figure": "Figure",
        "hardware": "Hardware",
        "date": "Date",
        "candidate": "candidate",
        "degraded": "degraded control",
        "trap": "prefill trap",
        "prefill": "Prefill",
        "reads-cache": "reads the cache",
        "skips-cache": "skips the cache",
        "kernels": "Triton kernels",
        "reference": "torch reference",
        "op": "Kernel",
        "cache_dtype": "Cache element dtype",
        "batch": "Batch",
        "context": "Context",
        "prefix": "Cached prefix",
        "measurement": "Measurement",
        "bytes_vs_16bit": "Bytes vs 16-bit",
        "judgement": "Against history",
        "history_runs": "Earlier runs / needed",
        "bytes_per_token": "Bytes per token",
        "computed": "computed",
        "engine": "engine's own",
        "timed": "timed",
        "functional-check-interpreter": "functional check (Triton's CPU interpreter), not a speed",
        "functional-check-reference": (
            "functional check (kvquant's fp32 torch reference), not a speed"
        ),
        "within-noise": "within noise",
        "history-too-short": "history too short to judge",
        "not-judged": "not judged (functional check)",
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
        # The audit blocks (ADR 0012): display columns, then codes of forkaudit's report.
        "files_large": "Large files (compared by hash only)",
        "question": "Question",
        "answer": "Answer",
        "evidence": "Evidence",
        "change": "Change",
        "excerpt": "Changed lines",
        "no-questions": "No question was answered: the audit recorded none.",
        "audit-surprise": (
            "Surprise patch: {risk} of {total} changed files are vendor changes in risk areas"
            "{record} ({streams})."
        ),
        "audit-record-files": ", {count} fork files fail their RECORD check",
        "audit-no-surprise": (
            "No surprise patch: none of {total} changed files is a vendor change in a risk area."
        ),
        "audit-no-base": "No base was given, so every change counts as the vendor's.",
        "audit-stream-count": "stream {stream}: {count}",
        "audit-no-stream-count": "outside the streams: {count}",
        "audit-list-separator": ", ",
        "audit-no-stream": "none",
        "question:fp8_kv_cache": "Did the vendor add or change an FP8 KV cache?",
        "question:int8_kv_cache": "Did the vendor add or change an INT8 KV cache?",
        "question:attention_backend": "Did the vendor add or change an attention backend?",
        "question:backend_kv_cache_dtypes": (
            "Did the KV-cache dtypes an attention backend accepts change?"
        ),
        "question:env_vars": "Were env vars added, removed, or their defaults changed?",
        "answer:yes": "Yes",
        "answer:no": "No",
        "answer:mentioned": "Not in the declared dtypes; the vendor's changed lines name it",
        "answer:unknown": "Cannot tell: a changed file could not be parsed",
        "fact:cache_dtype:added": "KV-cache dtype {name} added",
        "fact:cache_dtype:removed": "KV-cache dtype {name} removed",
        "fact:backend_kv_cache_dtype:added": "{name} now accepts {new}",
        "fact:backend_kv_cache_dtype:removed": "{name} no longer accepts {old}",
        "fact:attention_backend:added": "backend {name} registered ({new})",
        "fact:attention_backend:removed": "backend {name} removed (was {old})",
        "fact:attention_backend:changed": "backend {name} now points to {new} (was {old})",
        "fact:env_var:added": "env var {name} added (default {new})",
        "fact:env_var:removed": "env var {name} removed (default was {old})",
        "fact:env_var:changed": "default of {name} changed from {old} to {new}",
        "evidence:file": "backend code changed ({change})",
        "evidence:mention": "changed lines name {name}",
        "evidence:unread": "not parsed",
        "evidence-in": "{what}: {path}",
        "change:added": "added",
        "change:deleted": "deleted",
        "change:modified": "modified",
        "change:renamed": "renamed from {old_path}",
        "change:mode-changed": "mode {old_mode} → {new_mode}",
        "change:record-missing": "patched after install: listed in RECORD but missing",
        "change:record-content-differs": (
            "patched after install: content does not match its RECORD hash"
        ),
        "change:record-unknown-algorithm": (
            "patched after install: RECORD names an unknown hash algorithm"
        ),
        "content:binary": "binary",
        "content:large": "large file, compared by hash only",
        "origin:vendor": "vendor",
        "origin:upstream-drift": "upstream drift",
        "origin:both": "both",
        "side:fork": "fork",
        "side:upstream": "upstream",
        "side:both": "both",
        "left-out:sdist-metadata": "sdist metadata written by the build",
        "left-out:egg-info-metadata": "egg-info metadata written by the build",
        "left-out:wheel-metadata": "wheel metadata written by the build",
        "left-out:compiled-output": "compiled build output",
        "left-out:egg-info-section": "[egg_info] section written by the sdist build",
        "left-out:generated-version-file": "version file generated at build time",
        "left-out:exec-bit-only": "only the executable bit differs, which wheels do not keep",
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
        "stage-message": "阶段自身的消息：",
        "evidence_figure": "数据",
        "hardware": "硬件",
        "date": "日期",
        "candidate": "被测缓存",
        "degraded": "降级对照",
        "trap": "预填充陷阱",
        "prefill": "预填充",
        "reads-cache": "读取缓存",
        "skips-cache": "不读缓存",
        "kernels": "Triton 内核",
        "reference": "torch 参考实现",
        "op": "内核",
        "cache_dtype": "缓存元素类型",
        "batch": "批大小",
        "context": "上下文长度",
        "prefix": "已缓存前缀",
        "measurement": "测量方式",
        "bytes_vs_16bit": "相对 16 位的字节比",
        "judgement": "与历史比较",
        "history_runs": "已有 / 所需历史运行数",
        "bytes_per_token": "每 token 字节数",
        "computed": "计算值",
        "engine": "引擎报告",
        "timed": "计时",
        "functional-check-interpreter": "功能检查（Triton CPU 解释器），不代表速度",
        "functional-check-reference": "功能检查（kvquant 的 fp32 torch 参考实现），不代表速度",
        "within-noise": "在噪声范围内",
        "history-too-short": "历史过短，无法判断",
        "not-judged": "不判断（功能检查）",
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
        # 审计区块（ADR 0012）：显示列，以及 forkaudit 报告中的代码。
        "files_large": "大文件（仅按哈希比较）",
        "question": "问题",
        "answer": "回答",
        "evidence": "依据",
        "change": "改动",
        "excerpt": "改动行",
        "no-questions": "没有回答任何问题：审计没有记录问题。",
        "audit-surprise": (
            "存在意外补丁：{total} 个差异文件中有 {risk} 个是落在风险区域内的厂商改动"
            "{record}（{streams}）。"
        ),
        "audit-record-files": "，另有 {count} 个分支文件与 RECORD 哈希不符",
        "audit-no-surprise": "无意外补丁：{total} 个差异文件中没有落在风险区域内的厂商改动。",
        "audit-no-base": "未给出真实基线，因此所有改动都算作厂商改动。",
        "audit-stream-count": "计划流 {stream}：{count}",
        "audit-no-stream-count": "不属于任何计划流：{count}",
        "audit-list-separator": "，",
        "audit-no-stream": "无",
        "question:fp8_kv_cache": "厂商是否新增或修改了 FP8 KV 缓存？",
        "question:int8_kv_cache": "厂商是否新增或修改了 INT8 KV 缓存？",
        "question:attention_backend": "厂商是否新增或修改了注意力后端？",
        "question:backend_kv_cache_dtypes": "注意力后端接受的 KV 缓存数据类型是否有变化？",
        "question:env_vars": "是否新增、删除环境变量，或修改了其默认值？",
        "answer:yes": "是",
        "answer:no": "否",
        "answer:mentioned": "声明的数据类型未变；厂商的改动行中提到了它",
        "answer:unknown": "无法判定：有改动文件未能解析",
        "fact:cache_dtype:added": "新增 KV 缓存数据类型 {name}",
        "fact:cache_dtype:removed": "删除 KV 缓存数据类型 {name}",
        "fact:backend_kv_cache_dtype:added": "{name} 新增支持 {new}",
        "fact:backend_kv_cache_dtype:removed": "{name} 不再支持 {old}",
        "fact:attention_backend:added": "新注册后端 {name}（{new}）",
        "fact:attention_backend:removed": "删除后端 {name}（原为 {old}）",
        "fact:attention_backend:changed": "后端 {name} 改为指向 {new}（原为 {old}）",
        "fact:env_var:added": "新增环境变量 {name}（默认值 {new}）",
        "fact:env_var:removed": "删除环境变量 {name}（原默认值 {old}）",
        "fact:env_var:changed": "{name} 的默认值由 {old} 改为 {new}",
        "evidence:file": "后端代码有改动（{change}）",
        "evidence:mention": "改动行中提到 {name}",
        "evidence:unread": "未能解析",
        "evidence-in": "{what}：{path}",
        "change:added": "新增",
        "change:deleted": "删除",
        "change:modified": "修改",
        "change:renamed": "由 {old_path} 重命名",
        "change:mode-changed": "权限位 {old_mode} → {new_mode}",
        "change:record-missing": "安装后被修改：RECORD 中列出但文件缺失",
        "change:record-content-differs": "安装后被修改：内容与 RECORD 中的哈希不符",
        "change:record-unknown-algorithm": "安装后被修改：RECORD 使用了未知的哈希算法",
        "content:binary": "二进制",
        "content:large": "大文件，仅按哈希比较",
        "origin:vendor": "厂商",
        "origin:upstream-drift": "上游演进",
        "origin:both": "两者都有",
        "side:fork": "厂商分支",
        "side:upstream": "上游",
        "side:both": "两侧",
        "left-out:sdist-metadata": "构建生成的 sdist 元数据",
        "left-out:egg-info-metadata": "构建生成的 egg-info 元数据",
        "left-out:wheel-metadata": "构建生成的 wheel 元数据",
        "left-out:compiled-output": "编译产物",
        "left-out:egg-info-section": "sdist 构建写入的 [egg_info] 小节",
        "left-out:generated-version-file": "构建时生成的版本文件",
        "left-out:exec-bit-only": "只有可执行位不同，而 wheel 不保留可执行位",
    },
}


# Line breaks of every kind `str.splitlines` knows: one would end a table row or start a block.
_LINE_BREAKS = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
# Control characters and lone surrogates (JSON can carry "\ud800", UTF-8 cannot): shown as U+FFFD.
_UNSHOWABLE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff]")
# `<` and `>` become entities, so no text can open or close an HTML comment (a generated-block
# marker is one) or a tag; `&` too, so an entity in the text shows as written.
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# Backslash-escaped wherever they stand: `|` would split a table cell; `\` could escape the
# backslash of an escaped `|`; a backtick or `~` run could open a code span or fence; brackets
# would make a link or an image. Emphasis (`*`, `_`) is left as is: it changes how a word looks,
# never the structure, and escaping it would clutter every path and id.
_BACKSLASHED = re.compile(r"([\\`|~\[\]])")
# At the start of a line Markdown reads these as a heading, a list item or a thematic break.
_BLOCK_START = re.compile(r"#{1,6}(?=[ \t]|$)|[-+*](?=[ \t]|$)|[0-9]{1,9}[.)](?=[ \t]|$)")
_THEMATIC_BREAK = re.compile(r"([-*_])(?:[ \t]*\1){2,}[ \t]*")


def markdown_text(text: str) -> str:
    """``text`` as Markdown that shows it as written, on one line, in a paragraph or a table cell.

    The one escaping function of every renderer: line breaks become spaces, `<`, `>` and `&`
    entities (so no HTML comment, hence no block marker, can form), and the characters that
    would split a table cell, open a code span, a fence or a link are backslash-escaped, as is a
    heading, list or rule marker at the start. Code spans cannot be escaped (Markdown shows
    their content literally); the record fields shown in them are held to formats instead.
    """
    text = _LINE_BREAKS.sub(" ", text).replace("\t", " ")
    text = _UNSHOWABLE.sub("\ufffd", text).strip(" ")
    text = "".join(_ENTITIES.get(char, char) for char in text)
    text = _BACKSLASHED.sub(r"\\\1", text)
    if _THEMATIC_BREAK.fullmatch(text):
        return "\\" + text
    start = _BLOCK_START.match(text)
    if start:
        marker = start.group(0)
        return marker[:-1] + "\\" + marker[-1] + text[len(marker) :]
    return text


def label(lang: str, key: str, **fields: str) -> str:
    """The ADR's words for ``key`` (an id without a label shows as itself), with ``fields``
    filled in; the caller escapes the result (`markdown_text`) or, for a label of its own
    Markdown, each field."""
    text = _LABELS[lang].get(key, key)
    return text.format(**fields) if fields else text


# Cell values that are words of the record schema, shown in the ADR's language: statuses and
# verdicts, and the throughput stage's capacity sources, measurement kinds and judgements.
_TRANSLATED_CELLS = frozenset(
    {
        "passed",
        "failed",
        "skipped",
        "inconclusive",
        "exactly-0",
        "not-0",
        "candidate",
        "degraded",
        "trap",
        "reads-cache",
        "skips-cache",
        "kernels",
        "reference",
        "computed",
        "engine",
        "timed",
        "functional-check-interpreter",
        "functional-check-reference",
        "regression",
        "within-noise",
        "history-too-short",
        "not-judged",
    }
)


def _cell(lang: str, value: Scalar) -> str:
    """A table cell as Markdown: a `Markdown` value as its renderer wrote it, anything else
    shown in the ADR's words and escaped."""
    if isinstance(value, Markdown):
        return value
    if isinstance(value, str) and value in _TRANSLATED_CELLS:
        text = label(lang, value)
    elif value is None:
        text = "—"
    elif isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = str(value)
    return markdown_text(text)


def markdown_table(lang: str, columns: Sequence[str], rows: Sequence[Sequence[Scalar]]) -> str:
    """A Markdown table: ``columns`` are ids shown by their labels, each cell escaped."""
    header = "| " + " | ".join(markdown_text(label(lang, c)) for c in columns) + " |"
    rule = "|" + "---|" * len(columns)
    body = ["| " + " | ".join(_cell(lang, v) for v in row) + " |" for row in rows]
    return "\n".join([header, rule, *body])


def source_line(record: Record, lang: str) -> str:
    """The run, flow run and commit a block's record came from. They are shown in code spans,
    where an escape would show literally, so they are not escaped: `Provenance` holds them to
    formats that Markdown cannot misread, and `Record` the stage's name."""
    p = record.provenance
    flow = label(lang, "flow-run", id=p.flow_run_id) if p.flow_run_id else ""
    commit = (p.repo_commit or "unknown")[:12]
    fields = {"stage": record.stage, "run": p.run_id, "flow": flow, "commit": commit}
    return "_" + label(lang, "source", ended=markdown_text(p.ended_at), **fields) + "_"


def _require(records: Records, stage: str, lang: str) -> Record | str:
    """The stage's record, or the localized note that it has not run yet."""
    record = records.get(stage)
    if record is not None:
        return record
    return "_" + label(lang, "no-results", stage=stage) + "_"  # a stage of `BLOCKS`


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
    "files_large",
    "files_left_out",
    "env_vars_added",
    "env_vars_removed",
    "env_vars_default_changed",
    "vendor_risk_changes",
)


def render_audit_summary(records: Records, lang: str) -> str:
    """ADR 0012: the verdict, in the ADR's language, and what differs, in counts."""
    record = _require(records, BLOCK_SOURCES["audit-summary"].stage, lang)
    if isinstance(record, str):
        return record
    parts = [f"**{markdown_text(label(lang, 'verdict'))}:** {_audit_verdict(record, lang)}"]
    if record.status != "skipped" and record.metrics:
        parts += [_metrics_table(record, lang, _AUDIT_SUMMARY_METRICS), _gate_table(record, lang)]
    elif record.reason:
        parts.append(stage_message(record.reason, lang))
    parts.append(source_line(record, lang))
    return "\n\n".join(parts)


def _audit_verdict(record: Record, lang: str) -> str:
    """The verdict sentence, composed from the record's counts; a record without them (a crashed
    or skipped stage, or one written before they were recorded) shows its own summary."""
    m = record.metrics
    if not isinstance(m.get("surprise"), bool):
        return markdown_text(record.summary)
    counts = [
        label(lang, "audit-stream-count", stream=stream, count=_count(m.get(key)))
        for stream, key in (
            ("A", "vendor_risk_stream_a"),
            ("B", "vendor_risk_stream_b"),
            ("C", "vendor_risk_stream_c"),
        )
        if m.get(key)
    ]
    if m.get("vendor_risk_no_stream"):
        counts.append(
            label(lang, "audit-no-stream-count", count=_count(m["vendor_risk_no_stream"]))
        )
    record_files = m.get("record_mismatch_files")
    fields = {
        "risk": _count(m.get("vendor_risk_files")),
        "total": _count(m.get("files_total")),
        "record": (
            label(lang, "audit-record-files", count=_count(record_files)) if record_files else ""
        ),
        "streams": label(lang, "audit-list-separator").join(counts),
    }
    sentence = label(lang, "audit-surprise" if m["surprise"] else "audit-no-surprise", **fields)
    if m.get("base_given") is False:
        sentence += ("" if lang == "zh" else " ") + label(lang, "audit-no-base")
    return sentence


# Text from a record that can be shown as a backtick code span in a table cell: no `<` or `>`
# (a span could carry `<!--` into the ADR's source), no line break, control character or lone
# surrogate (an undecodable path byte).
# Line breaks beyond ASCII's (NEL, the line and paragraph separators) count as unprintable too.
_SPAN_SAFE = re.compile(r"[^<>\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]*")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_ESCAPED_IN_CODE = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "\\|"}
_MARKDOWN_INLINE = frozenset("\\`*_[]~")


def code_cell(text: str) -> Markdown:
    """TEXT (a path, a name, a line of a patch: hostile input) as code in a table cell, exactly
    as written: a backtick span where that is safe, else a `<code>` element whose special
    characters are entities or escaped, so that no record can form an HTML comment or a marker
    and unprintable characters show as `\\uXXXX`."""
    if text.strip(" ") and _SPAN_SAFE.fullmatch(text):
        longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
        fence = "`" * (longest + 1)
        # A span drops one space at each end when both ends have one: pad to keep the text's own.
        padded = f" {text} " if text.startswith(("`", " ")) or text.endswith(("`", " ")) else text
        return Markdown(fence + padded.replace("|", "\\|") + fence)
    visible = _UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    escaped = "".join(
        _ESCAPED_IN_CODE.get(c, "\\" + c if c in _MARKDOWN_INLINE else c) for c in visible
    )
    return Markdown(f"<code>{escaped}</code>")


class _Fields(dict[str, str]):
    """Fields of a label; one a record lacks shows as a dash instead of failing the render."""

    def __missing__(self, key: str) -> str:
        return "—"


def _compose(lang: str, key: str, **fields: str) -> Markdown:
    """The label KEY with FIELDS (Markdown already) filled in."""
    return Markdown(_LABELS[lang][key].format_map(_Fields(fields)))


def _word(lang: str, prefix: str, code: Scalar) -> Markdown:
    """The label of a code of forkaudit's report; an unknown code shows as code."""
    key = f"{prefix}:{code}"
    return _compose(lang, key) if key in _LABELS[lang] else code_cell(str(code))


def _code_fields(row: Mapping[str, Scalar], *keys: str) -> dict[str, str]:
    return {key: code_cell(str(row[key])) for key in keys if row.get(key) is not None}


_STREAMS = frozenset({"A", "B", "C"})
_STATUSES = frozenset({"A", "M", "D", "R"})


def _known(value: Scalar, known: frozenset[str]) -> Markdown:
    """VALUE as it is when it is one of KNOWN (a stream, a git status), else as code."""
    return Markdown(value) if value in known and isinstance(value, str) else code_cell(str(value))


def _count(value: Scalar) -> str:
    """A count from a record: a whole number as it is, anything else as code."""
    is_count = isinstance(value, int) and not isinstance(value, bool)
    return str(value) if is_count else code_cell(str(value))


def _lines(cells: Sequence[str]) -> Markdown | None:
    return Markdown("<br>".join(cells)) if cells else None


def _rows(table: Table) -> list[dict[str, Scalar]]:
    return [dict(zip(table.columns, row, strict=True)) for row in table.rows]


def _present_questions(table: Table, lang: str) -> tuple[list[str], list[list[Scalar]]]:
    """One row per question: the question and its answer in words, then each piece of
    evidence with its file."""
    by_question: dict[Scalar, list[dict[str, Scalar]]] = {}
    for row in _rows(table):
        by_question.setdefault(row["question"], []).append(row)
    rows: list[list[Scalar]] = []
    for question, evidence in by_question.items():
        shown = [
            _compose(lang, "evidence-in", what=_evidence(e, lang), path=code_cell(str(e["path"])))
            for e in evidence
            if e["kind"] is not None
        ]
        answer = _word(lang, "answer", evidence[0]["answer"])
        rows.append([_word(lang, "question", question), answer, _lines(shown)])
    return ["question", "answer", "evidence"], rows


def _evidence(row: Mapping[str, Scalar], lang: str) -> Markdown:
    """One piece of evidence in words: a fact of the semantic diff, or why a file counts."""
    if row["kind"] == "fact":
        key = f"fact:{row['subject']}:{row['change']}"
    else:
        key = f"evidence:{row['kind']}"
    if key not in _LABELS[lang]:
        return code_cell(" ".join(str(row[k]) for k in ("kind", "subject", "change", "name")))
    return _compose(lang, key, **_code_fields(row, "name", "old", "new", "change"))


def _change(row: Mapping[str, Scalar], lang: str) -> Markdown:
    """What happened to a file and how much: "modified, +4/-1"; a file patched after install
    has no size of change."""
    key = f"change:{row['change']}"
    if key in _LABELS[lang]:
        what = _compose(lang, key, **_code_fields(row, "old_path", "old_mode", "new_mode"))
    else:
        what = code_cell(str(row["change"]))
    if row["content"] is None:
        return what
    if row["content"] == "text":
        size = f"+{_count(row['lines_added'])}/-{_count(row['lines_removed'])}"
    else:
        size = _word(lang, "content", row["content"])
    return Markdown(what + label(lang, "audit-list-separator") + size)


def _present_findings(table: Table, lang: str) -> tuple[list[str], list[list[Scalar]]]:
    """The vendor changes in risk areas: the streams each touches, what changed, and its first
    changed lines (an ellipsis when there are more). The record has a row per stream; a change
    that touches several streams shows once."""
    streams: dict[tuple[Scalar, ...], list[str]] = {}
    for row in _rows(table):
        change = tuple(v for k, v in row.items() if k != "stream")
        stream = row["stream"]
        streams.setdefault(change, []).append(
            label(lang, "audit-no-stream") if stream is None else _known(stream, _STREAMS)
        )
    rows: list[list[Scalar]] = []
    for change, touched in streams.items():
        row = dict(zip([c for c in table.columns if c != "stream"], change, strict=True))
        excerpt = str(row["excerpt"]).split("\n") if row["excerpt"] else []
        shown: list[str] = [code_cell(line) for line in excerpt]
        added, removed = row["lines_added"], row["lines_removed"]
        if isinstance(added, int) and isinstance(removed, int) and added + removed > len(excerpt):
            shown.append("…")
        rows.append(
            [
                Markdown(",".join(touched)),
                code_cell(str(row["path"])),
                code_cell(str(row["area"])),
                _change(row, lang),
                _lines(shown),
            ]
        )
    return ["streams", "path", "area", "change", "excerpt"], rows


def _present_changes(table: Table, lang: str) -> tuple[list[str], list[list[Scalar]]]:
    rows: list[list[Scalar]] = [
        [
            _known(row["status"], _STATUSES),
            code_cell(str(row["path"])),
            code_cell(str(row["category"])),
            None
            if row["streams"] is None
            else Markdown(",".join(_known(s, _STREAMS) for s in str(row["streams"]).split(","))),
            None if row["origin"] is None else _word(lang, "origin", row["origin"]),
            _change(row, lang),
        ]
        for row in _rows(table)
    ]
    return ["status", "path", "area", "streams", "origin", "change"], rows


def _present_left_out(table: Table, lang: str) -> tuple[list[str], list[list[Scalar]]]:
    rows: list[list[Scalar]] = [
        [
            code_cell(str(row["path"])),
            _word(lang, "side", row["side"]),
            _word(lang, "left-out", row["code"]),
        ]
        for row in _rows(table)
    ]
    return ["path", "side", "reason"], rows


# The columns each presenter reads (forkaudit's record parts write them).
_QUESTION_COLUMNS = frozenset(
    {"question", "answer", "kind", "subject", "change", "name", "old", "new", "path"}
)
_CHANGE_COLUMNS = frozenset(
    {"change", "old_path", "old_mode", "new_mode", "content", "lines_added", "lines_removed"}
)
_FINDING_COLUMNS = _CHANGE_COLUMNS | {"stream", "path", "area", "excerpt"}
_CHANGES_COLUMNS = _CHANGE_COLUMNS | {"status", "path", "category", "streams", "origin"}
_LEFT_OUT_COLUMNS = frozenset({"path", "side", "code"})


ASSETS_DIR = "assets"
# The figure types a block embeds, by the name's suffix, and the bytes such a file begins with:
# a figure is copied beside the ADRs only if its content is of the type its name says.
FIGURE_SIGNATURES = {".png": b"\x89PNG\r\n\x1a\n"}


def asset_name(record: Record, artifact: str) -> str:
    """Where a record's figure is copied beside the ADRs, relative to the ADR directory: one
    name per stage, hardware class and figure, since each class's newest record is shown."""
    return f"{ASSETS_DIR}/{record.stage}-{hardware_class(record)}-{artifact}"


def figure_signature(artifact: str) -> bytes | None:
    """The bytes a figure named ``artifact`` begins with, or None for an artifact that is no
    figure."""
    return next(
        (sig for suffix, sig in FIGURE_SIGNATURES.items() if artifact.endswith(suffix)), None
    )


Presenter = Callable[[Table, str], tuple[list[str], list[list[Scalar]]]]


def stage_message(message: str, lang: str) -> str:
    """A stage's own message (why it was skipped, what it crashed on), quoted as written: it is
    the stage's English, whatever the ADR's language."""
    return f"{markdown_text(label(lang, 'stage-message'))} {code_cell(message)}"


def _quoted(table: Table, verbatim: frozenset[str]) -> list[list[Scalar]]:
    """The table's rows with the text of its ``verbatim`` columns quoted as code; the record's
    schema words (passed, failed) stay words."""
    quoted = {i for i, column in enumerate(table.columns) if column in verbatim}
    return [
        [
            code_cell(v) if i in quoted and isinstance(v, str) and v not in _TRANSLATED_CELLS else v
            for i, v in enumerate(row)
        ]
        for row in table.rows
    ]


@dataclass(frozen=True)
class StageRenderer:
    """A renderer of one stage's record; the writer calls it once per hardware class where the
    stage runs on several (`adrkit._render`)."""

    stage: str
    render: Renderer

    def __call__(self, records: Records, lang: str) -> str:
        return self.render(records, lang)


def render_record_table(
    key: str,
    empty_key: str,
    no_baseline_key: str | None = None,
    present: tuple[Presenter, frozenset[str]] | None = None,
    verbatim: frozenset[str] = frozenset(),
) -> StageRenderer:
    """A renderer for block ``key`` that shows the one table of one stage's record that
    `BLOCK_SOURCES` declares for it, then the declared figures the record has (PNG artifacts,
    which the writer copies beside the ADRs).

    `present` is a function that turns the table into the columns and rows shown, in the ADR's
    language, and the columns it needs; a table without them (from an older record) is shown
    as recorded. `verbatim` columns hold a check's own words (an error, a detail in English):
    they are quoted as code, since no record sentence is in the ADR's language.

    A table without rows shows the label `empty_key`, or `no_baseline_key` when the table says
    there was no earlier result to compare against (`Table.baseline_found` is False). A record
    without the table (its stage crashed first) shows its reason instead.
    """
    source = BLOCK_SOURCES[key]
    stage, (table,), figures = source.stage, source.tables, source.figures

    def render(records: Records, lang: str) -> str:
        record = _require(records, stage, lang)
        if isinstance(record, str):
            return record
        if record.status == "skipped":
            reason = stage_message(record.reason or record.summary, lang)
            return "\n\n".join([reason, source_line(record, lang)])
        found: Table | None = record.tables.get(table)
        if found is None and record.reason:  # the stage ended (crashed) before the table
            body = stage_message(record.reason, lang)
        elif found is not None and found.rows:
            if present is not None and present[1] <= set(found.columns):
                body = markdown_table(lang, *present[0](found, lang))
            else:
                body = markdown_table(lang, found.columns, _quoted(found, verbatim))
        elif found is not None and found.baseline_found is False and no_baseline_key:
            body = markdown_text(label(lang, no_baseline_key))
        else:
            body = markdown_text(label(lang, empty_key))
        shown = [
            f"![{markdown_text(label(lang, 'figure'))}: {markdown_text(name)}]"
            f"({asset_name(record, name)})"
            for name in figures
            if name in record.artifacts
        ]
        return "\n\n".join([body, *shown, source_line(record, lang)])

    return StageRenderer(stage, render)


BLOCKS: dict[str, Renderer] = {
    "audit-summary": render_audit_summary,
    "audit-questions": render_record_table(
        "audit-questions", "no-questions", present=(_present_questions, _QUESTION_COLUMNS)
    ),
    "audit-findings": render_record_table(
        "audit-findings", "no-findings", present=(_present_findings, _FINDING_COLUMNS)
    ),
    "audit-changes": render_record_table(
        "audit-changes", "no-changes", present=(_present_changes, _CHANGES_COLUMNS)
    ),
    "audit-left-out": render_record_table(
        "audit-left-out", "nothing-left-out", present=(_present_left_out, _LEFT_OUT_COLUMNS)
    ),
    "kvquant-correctness": render_record_table(
        "kvquant-correctness", "no-cases", verbatim=frozenset({"verdict"})
    ),
    "kvquant-edge-cases": render_record_table(
        "kvquant-edge-cases", "no-cases", verbatim=frozenset({"detail"})
    ),
    "kvquant-resources": render_record_table("kvquant-resources", "no-cases"),
    "kvquant-resource-diff": render_record_table(
        "kvquant-resource-diff", "no-diff", no_baseline_key="no-previous-build"
    ),
    "kvbench-accuracy": render_record_table("kvbench-accuracy", "no-rows"),
    "kvbench-divergence": render_record_table("kvbench-divergence", "no-rows"),
    "kvbench-kernel-throughput": render_record_table(
        "kvbench-kernel-throughput", "no-rows", verbatim=frozenset({"verdict"})
    ),
    "kvbench-capacity": render_record_table("kvbench-capacity", "no-rows"),
    "kvbench-e2e": render_record_table("kvbench-e2e", "no-rows", verbatim=frozenset({"verdict"})),
}
