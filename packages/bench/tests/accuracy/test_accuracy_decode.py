"""The decode-kernel divergence on the real SmolLM2 (CPU): a batch of two Qasper papers decoded
together, each scored position one decode step. Through kvquant's decode kernel in Triton's
interpreter (bf16), INT8 passes the shipped gate where the 4-bit control, its codes read by the
same kernel, fails it; through the torch reference (fp32), the whole run: rows per context
bucket with block standard errors, the near-gate control reported but not gated, the trap
exactly 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kvbench.accuracy import DivergenceResult
from kvbench.accuracy._config import DEFAULT_CONFIG, DivergenceSpec, load_config
from kvbench.accuracy._corpus import WHOLE_DOCUMENTS, corpus_texts
from kvbench.accuracy._decode_divergence import (
    BLOCK_POSITIONS,
    EXPECT_REPORTED,
    _Arm,
    _bucket_rows,
    _decode_pass,
    run_decode_divergence,
)
from kvbench.accuracy._divergence import EXPECT_FAIL, EXPECT_PASS

# The nightly's own gate, so the tests show that the shipped thresholds tell the caches apart.
_SHIPPED_GATE = load_config(DEFAULT_CONFIG).divergence_gate
_BUCKETS = (24, 64)
_SPEC = DivergenceSpec(
    index=0,
    corpus="qasper-papers",
    tokens=0,
    chunk_length=0,
    control_tokens=0,
    attention=None,
    attention_name="runs[0].attention",
    kernel="decode",
    texts=2,
    text_length=64,
    # 8 prefilled tokens, 16 decode steps up to context 24, 16 prefilled, 16 steps to context 56.
    windows=((8, 24), (40, 56)),
    control_windows=((8, 24), (40, 56)),
    buckets=_BUCKETS,
    near_gate="int6",
)


@pytest.fixture(scope="module")
def reference_run(smollm2: Any, tmp_path_factory: pytest.TempPathFactory) -> DivergenceResult:
    assert _SHIPPED_GATE is not None
    model, tokenizer = smollm2
    return run_decode_divergence(
        _SPEC,
        _SHIPPED_GATE,
        ("reference",),
        model=model,
        tokenizer=tokenizer,
        baseline="auto",
        candidate="int8",
        plot_path=tmp_path_factory.mktemp("decode") / "kld.png",
        progress=False,
    )


def test_every_arm_has_a_row_per_bucket_with_block_errors(reference_run: DivergenceResult) -> None:
    rows = {(row["arm"], row["context"]): row for row in reference_run.rows}
    assert set(rows) == {
        (arm, bucket)
        for arm in ("candidate", "degraded", "near-gate", "twin-trap")
        for bucket in ("≤24", "25-64")
    }
    for (_, bucket), row in rows.items():
        assert row["kernel"] == "decode" and row["documents"] == WHOLE_DOCUMENTS
        # Two texts of 16 positions in each bucket, each text's 16 within one block of 64.
        assert row["tokens"] == 32 and row["stderr_blocks"] == 2
        assert row["context_keys"] == ([9, 24] if bucket == "≤24" else [41, 56])
    assert reference_run.passed
    assert reference_run.kernel == "decode" and reference_run.texts == 2


def test_int8_passes_each_bucket_the_4_bit_control_fails_each_and_the_trap_is_0(
    reference_run: DivergenceResult,
) -> None:
    for row in reference_run.rows:
        expected = {
            "candidate": EXPECT_PASS,
            "degraded": EXPECT_FAIL,
            "near-gate": EXPECT_REPORTED,
            "twin-trap": "exactly-0",
        }[row["arm"]]
        assert row["expected"] == expected and row["behaved"], row
        if row["arm"] == "twin-trap":
            assert row["max_kld"] == 0.0 and row["identical"]
        if row["arm"] == "degraded":
            assert row["mean_kld"] > 10 * _SHIPPED_GATE.max_mean_kld  # type: ignore[union-attr]
    # Each bucket is gated on its own: one gate check per candidate bucket and figure.
    names = [check.name for check in reference_run.gates()]
    assert len(names) == 6 and all(name.startswith("decode divergence int8") for name in names)
    assert any("context 25-64" in name for name in names)


def test_the_near_gate_control_lies_between_int8_and_the_4_bit_control(
    reference_run: DivergenceResult,
) -> None:
    kld = {(row["arm"], row["context"]): row["mean_kld"] for row in reference_run.rows}
    for bucket in ("≤24", "25-64"):
        assert kld[("candidate", bucket)] < kld[("near-gate", bucket)] < kld[("degraded", bucket)]


def test_the_record_gives_the_worst_bucket_and_the_controls(
    reference_run: DivergenceResult,
) -> None:
    from kvbench.accuracy._result import _decode_metrics

    metrics = _decode_metrics(reference_run)
    candidate = [row for row in reference_run.rows if row["arm"] == "candidate"]
    assert metrics["decode_positions"] == 64
    assert metrics["decode_worst_mean_kld"] == max(row["mean_kld"] for row in candidate)
    assert metrics["decode_contexts"] == "≤24, 25-64"
    assert metrics["decode_degraded_gate"] == "failed"
    assert metrics["decode_trap_verdict"] == "exactly-0"
    assert metrics["decode_near_gate"] == "int6"


def test_the_4_bit_control_fails_through_the_decode_kernel_where_int8_passes(
    tmp_path: Path,
) -> None:
    """The interpreter runs every layer's decode kernel (~0.5 s a call): 2 papers, 3 steps from
    the first token, no prefill, 3 caches (16-bit, INT8, 4-bit codes in an INT8 cache)."""
    from kvbench.accuracy._hf_model import load_model
    from kvquant.ops._common import interpreted

    if not interpreted() and not torch.cuda.is_available():
        pytest.skip("kvquant's kernels need a GPU or Triton's interpreter")
    assert _SHIPPED_GATE is not None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_model(None, device, "bfloat16")
    spec = DivergenceSpec(
        0, "qasper-papers", 0, 0, 0, ("kernels",), "attention", kernel="decode", texts=2,
        text_length=8, windows=((0, 3),), control_windows=((0, 3),), buckets=(512,),
    )  # fmt: skip
    texts, documents = corpus_texts(spec.corpus, tokenizer, spec.text_length, spec.texts)
    arms = [
        _Arm("candidate", "int8", control=False, expected=EXPECT_PASS),
        _Arm("degraded", "int4", control=True, expected=EXPECT_FAIL),
    ]
    seconds: dict[str, float] = {}
    scored = _decode_pass(
        model,
        torch.tensor(texts, device=model.device),
        spec.windows,
        "auto",
        arms,
        kernels=True,
        seconds=seconds,
        progress=False,
    )
    rows = {
        arm.name: _bucket_rows(arm, scored[arm.name], spec, _SHIPPED_GATE, "kernels", documents, 0)
        for arm in arms
    }
    (candidate,) = rows["candidate"]
    (degraded,) = rows["degraded"]
    assert candidate["tokens"] == degraded["tokens"] == 6
    assert candidate["verdict"] == "passed", candidate
    assert degraded["verdict"] == "failed", degraded
    assert degraded["mean_kld"] > 10 * candidate["mean_kld"]
    assert BLOCK_POSITIONS == 64 and candidate["stderr_blocks"] == 2


def test_the_accuracy_record_holds_the_decode_rows_and_gates(
    reference_run: DivergenceResult,
) -> None:
    from kvbench.accuracy import AccuracyResult

    result = AccuracyResult(
        backend="kvquant-hf",
        model="SmolLM2-135M-Instruct.Q4_1",
        device="cpu",
        tasks=[],
        rows=[],
        divergence=[reference_run],
        tolerance=0.02,
        plot=None,
        timings=[],
        elapsed_s=1.0,
        weights="Q4_1 GGUF",
        model_dtype="float32",
    )
    parts = result.record_parts()
    table = parts.tables["divergence"]
    assert len(table.rows) == 8
    kernel, context = table.columns.index("kernel"), table.columns.index("context")
    assert {(row[kernel], row[context]) for row in table.rows} == {
        ("decode", "≤24"),
        ("decode", "25-64"),
    }
    assert "through the decode kernel on 64 positions to context 56" in parts.summary
    assert parts.metrics["model_weights"] == "Q4_1 GGUF"
    assert all(gate.passed for gate in parts.gates) and len(parts.gates) == 6
    assert AccuracyResult.from_dict(result.to_dict()).divergence[0] == reference_run
