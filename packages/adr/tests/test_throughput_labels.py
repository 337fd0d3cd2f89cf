"""The throughput blocks say, in the ADR's language, which rows are functional checks and what the
history could judge, so a reference path's time never reads as a speed."""

from __future__ import annotations

import pytest

from adrkit import render_block
from adrkit.schema import Provenance, Record, Table

# A CPU night: vLLM's own fp32 cache timed, the INT8 cache served by kvquant's torch reference.
_E2E = Table(
    ["kv_cache_dtype", "cache_dtype", "measurement", "value", "judgement", "history_runs"],
    [
        ["auto", "float32", "timed", 117.0, "history-too-short", "0/3"],
        ["int8_per_token_head", "int8", "functional-check-reference", 84.9, "not-judged", None],
    ],
)


# Its capacity: each row names the dtype it stores; computed and engine rows agree.
_CAPACITY = Table(
    ["kv_cache_dtype", "cache_dtype", "max_tokens", "source_kind"],
    [["auto", "float32", 23296, "computed"], ["auto", "float32", 23296, "engine"]],
)


def _record() -> Record:
    return Record(
        stage="throughput",
        status="passed",
        summary="matrix cpu-nightly",
        tables={"e2e": _E2E, "capacity": _CAPACITY},
        provenance=Provenance(
            run_id="run-1",
            started_at="2026-12-01T16:00:00.000000Z",
            ended_at="2026-12-01T16:06:56.000000Z",
            repo_commit="0123456789abcdef0123",
        ),
    )


@pytest.mark.parametrize(
    ("lang", "expected", "absent"),
    [
        (
            "en",
            [
                "| Measurement |",
                "| timed |",
                "functional check (kvquant's fp32 torch reference), not a speed",
                "not judged (functional check)",
                "history too short to judge",
                "| Earlier runs / needed |",
            ],
            ["功能检查"],
        ),
        (
            "zh",
            [
                "| 测量方式 |",
                "| 计时 |",
                "功能检查（kvquant 的 fp32 torch 参考实现），不代表速度",
                "不判断（功能检查）",
                "历史过短，无法判断",
            ],
            ["functional check", "not judged", "history too short", "timed"],
        ),
    ],
)
def test_functional_checks_and_short_histories_are_labelled_in_the_adrs_language(
    lang: str, expected: list[str], absent: list[str]
) -> None:
    text = render_block("kvbench-e2e", {"throughput": _record()}, lang)
    for words in expected:
        assert words in text
    for words in absent:
        assert words not in text


def test_capacity_sources_are_in_the_adrs_language() -> None:
    zh = render_block("kvbench-capacity", {"throughput": _record()}, "zh")
    assert "| 计算值 |" in zh and "| 引擎报告 |" in zh and "| 缓存元素类型 |" in zh
    assert "computed" not in zh and "engine" not in zh
    en = render_block("kvbench-capacity", {"throughput": _record()}, "en")
    assert "| computed |" in en and "| engine's own |" in en
