"""The kvquant-hf model on the real SmolLM2: exactness of the 16-bit path, and proof that the
INT8 cache is read (the prefill trap and decode-mode scoring)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvbench.accuracy import AccuracyError
from kvbench.accuracy._lm import KVQuantHFLM
from kvbench.accuracy._model_files import resolve_model

from conftest import build_requests

# Two ARC-Easy documents: 8 (context, continuation) requests of a few to ~20 tokens.
_TASK, _DOCS = "kvb_arc_easy", 2


def _loglikelihoods(lm: Any, requests: list[Any]) -> torch.Tensor:
    return torch.tensor([ll for ll, _ in lm.loglikelihood(requests)], dtype=torch.float64)


def _kvquant(smollm2: Any, kv_cache_dtype: str, mode: str, reads: bool) -> KVQuantHFLM:
    return KVQuantHFLM(
        kv_cache_dtype=kv_cache_dtype,
        score_mode=mode,
        prefill_reads_cache=reads,
        loaded=smollm2,
        progress=False,
    )


@pytest.fixture(scope="module")
def requests() -> list[Any]:
    return build_requests(_TASK, _DOCS)


def test_decode_mode_auto_cache_equals_plain_hf_model(smollm2: Any, requests: list[Any]) -> None:
    from lm_eval.models.huggingface import HFLM

    plain = HFLM(pretrained=str(resolve_model(None)), device="cpu", dtype="float32", batch_size=1)
    expected = _loglikelihoods(plain, requests)
    got = _loglikelihoods(_kvquant(smollm2, "auto", "decode", reads=True), requests)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_prefill_that_skips_the_cache_hides_int8_until_decode(
    smollm2: Any, requests: list[Any]
) -> None:
    auto = _loglikelihoods(_kvquant(smollm2, "auto", "single-pass", reads=False), requests)
    single = _loglikelihoods(_kvquant(smollm2, "int8", "single-pass", reads=False), requests)
    decode = _loglikelihoods(_kvquant(smollm2, "int8", "decode", reads=False), requests)
    assert torch.equal(single, auto), "single-pass INT8 must not see the cache here (the trap)"
    assert (decode - auto).abs().max() > 1e-3, "decode-mode INT8 must read the quantized cache"


def test_prefill_that_reads_the_cache_shows_int8_in_both_modes(
    smollm2: Any, requests: list[Any]
) -> None:
    auto = _loglikelihoods(_kvquant(smollm2, "auto", "single-pass", reads=True), requests)
    single = _loglikelihoods(_kvquant(smollm2, "int8", "single-pass", reads=True), requests)
    decode = _loglikelihoods(_kvquant(smollm2, "int8", "decode", reads=True), requests)
    int8_effect = (single - auto).abs().max()
    assert int8_effect > 1e-3
    assert (decode - auto).abs().max() > 1e-3
    # Same quantized cache, read by one prefill or one query at a time. fp32 noise from the
    # different GEMM shapes can move a value across a rounding boundary and flip one INT8 code,
    # so the modes agree only to the quantization step, not to fp32 precision: measured on
    # these requests, 0.04 apart where INT8 moves them 0.19 from the 16-bit cache.
    torch.testing.assert_close(single, decode, atol=5e-2, rtol=0)
    assert (single - decode).abs().max() < 0.5 * int8_effect


def test_unknown_kv_cache_dtype_is_refused_in_one_line(smollm2: Any) -> None:
    with pytest.raises(
        AccuracyError,
        match=r"^`kv_cache_dtype`: cache dtype 'int2' is not known for accuracy or control; "
        r"expected one of auto, int8, fp8_e4m3, int4, int5, int6, int7$",
    ) as info:
        _kvquant(smollm2, "int2", "decode", reads=True)
    assert "\n" not in str(info.value)
