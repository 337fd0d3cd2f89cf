"""The decision summaries' answers (`ANSWERS`): each reads the newest record of one stage that has
what it needs, and says what it found in the row's language, with the figure a row's gate judges.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from adrkit._block_sources import BLOCK_SOURCES, BlockSource
from adrkit._evidence import (
    Evidence,
    HardwareClasses,
)
from adrkit._markdown import code_cell, markdown_text
from adrkit._summary_words import (
    ANSWER_WORDS,
    STATUS_WORDS,
    SUMMARY_LABELS,
    Answer,
    Measured,
    NotMeasured,
    Result,
    summary_label,
)
from adrkit.schema import Record, Scalar, Table

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
    return SUMMARY_LABELS[lang].get(str(value), str(value))


def _status(lang: str, verdict: Scalar) -> str:
    return STATUS_WORDS[lang].get(str(verdict), str(verdict))


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
            status = STATUS_WORDS[lang][record.status]
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
    words = ANSWER_WORDS[lang]
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
