"""The CPU cache keeps what it reads back as fp32, written one step at a time: its attention must
equal kvquant's torch reference over the whole paged cache bit for bit, NaN policy included; and
decode-mode scoring that reuses a shared prefill must give the very same numbers."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvbench.accuracy._kv_attention import _ReadBackLayerCache
from kvbench.accuracy._lm import KVQuantHFLM
from kvquant import allocate_cache, reference

from conftest import build_requests

_KV_HEADS, _Q_HEADS, _HEAD_SIZE, _MAX_TOKENS, _BLOCK = 3, 9, 64, 96, 16
_SCALE = _HEAD_SIZE**-0.5


class _Reference:
    """The attention the session computed before the read-back copy: kvquant's reference over a
    paged cache (INT8, 16-bit), or ``attention_ref`` over the rounded values (fp32, fp8)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self._dtype = dtype
        self._paged = None
        if dtype in (torch.int8, torch.bfloat16):
            blocks = _MAX_TOKENS // _BLOCK
            self._paged = allocate_cache(blocks, _KV_HEADS, _HEAD_SIZE, _BLOCK, dtype, "cpu")
            self._table = torch.arange(blocks, dtype=torch.int32)[None]
        self._k = torch.zeros(_MAX_TOKENS, _KV_HEADS, _HEAD_SIZE)
        self._v = torch.zeros(_MAX_TOKENS, _KV_HEADS, _HEAD_SIZE)

    def write(self, key: torch.Tensor, value: torch.Tensor, start: int) -> None:
        end = start + key.shape[0]
        if self._paged is not None:
            reference.cache_write_ref(self._paged, key, value, torch.arange(start, end))
            return
        if self._dtype == torch.float8_e4m3fn:
            key, value = key.clamp(-448, 448), value.clamp(-448, 448)
        self._k[start:end] = key.to(self._dtype).float()
        self._v[start:end] = value.to(self._dtype).float()

    def attend(self, query: torch.Tensor, seq_len: int, window: int | None) -> torch.Tensor:
        if self._paged is None:
            k, v = self._k[:seq_len], self._v[:seq_len]
            return reference.attention_ref(query, k, v, _SCALE, window, None)
        return reference.paged_attention_ref(
            query,
            self._paged,
            self._table,
            torch.tensor([seq_len], dtype=torch.int32),
            torch.tensor([0, query.shape[0]], dtype=torch.int32),
            _SCALE,
            window,
        )


def _steps(
    ours: _ReadBackLayerCache, ref: _Reference, kv: torch.Tensor, spans: list[tuple[int, int]]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ours, reference) outputs after each write of ``kv[:, a:b]`` at a, queried for a..b."""
    generator = torch.Generator().manual_seed(1)
    outputs = []
    for a, b in spans:
        query = torch.randn(b - a, _Q_HEADS, _HEAD_SIZE, generator=generator)
        ours.write(kv[0, a:b], kv[1, a:b], a)
        ref.write(kv[0, a:b], kv[1, a:b], a)
        outputs.append((ours.attend(query, b, _SCALE, None, None), ref.attend(query, b, None)))
    return outputs


@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16, torch.float32, torch.float8_e4m3fn])
def test_prefill_then_decode_equals_the_reference_bit_for_bit(dtype: torch.dtype) -> None:
    kv = 4 * torch.randn(2, 60, _KV_HEADS, _HEAD_SIZE, generator=torch.Generator().manual_seed(0))
    kv[:, 5, 1, 7] = 900.0  # beyond fp8's range: clamped, and a large INT8 scale
    ours = _ReadBackLayerCache(dtype, _KV_HEADS, _HEAD_SIZE, _MAX_TOKENS, torch.device("cpu"))
    # A 40-token prefill, decode steps, then a rewind that overwrites positions 30...
    spans = [(0, 40)] + [(p, p + 1) for p in range(40, 60)] + [(30, 45), (45, 46)]
    for got, expected in _steps(ours, _Reference(dtype), kv, spans):
        assert torch.equal(got, expected)


def test_sliding_window_prefill_equals_the_reference_bit_for_bit() -> None:
    kv = torch.randn(2, 50, _KV_HEADS, _HEAD_SIZE, generator=torch.Generator().manual_seed(2))
    ours = _ReadBackLayerCache(torch.int8, _KV_HEADS, _HEAD_SIZE, _MAX_TOKENS, torch.device("cpu"))
    ref = _Reference(torch.int8)
    query = torch.randn(50, _Q_HEADS, _HEAD_SIZE, generator=torch.Generator().manual_seed(3))
    ours.write(kv[0], kv[1], 0)
    ref.write(kv[0], kv[1], 0)
    assert torch.equal(ours.attend(query, 50, _SCALE, 7, None), ref.attend(query, 50, 7))


def test_a_nan_value_poisons_as_the_reference_does_until_overwritten() -> None:
    kv = torch.randn(2, 30, _KV_HEADS, _HEAD_SIZE, generator=torch.Generator().manual_seed(4))
    poisoned = kv.clone()
    poisoned[1, 12, 2, 0] = float("nan")
    ours = _ReadBackLayerCache(torch.int8, _KV_HEADS, _HEAD_SIZE, _MAX_TOKENS, torch.device("cpu"))
    ref = _Reference(torch.int8)
    outputs = _steps(ours, ref, poisoned, [(0, 20), (20, 21)])
    for got, expected in outputs:
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    # Only the query heads served by kv head 2, at positions that see token 12, turn NaN.
    prefill = outputs[0][0]
    assert not prefill[:12].isnan().any() and not prefill[12:, :6].isnan().any()
    assert prefill[12:, 6:].isnan().all()
    # Rewriting from position 12 with finite values clears the poison for later queries.
    for got, expected in _steps(ours, ref, kv, [(12, 20), (20, 21)]):
        assert not got.isnan().any()
        assert torch.equal(got, expected)


def test_decode_mode_reuses_a_shared_prefill_with_identical_scores(smollm2: Any) -> None:
    model, _ = smollm2
    requests = build_requests("kvb_arc_easy", 2)  # each question's choices share its context
    by_doc: dict[int, list[Any]] = {}
    for request in requests:
        by_doc.setdefault(request.doc_id, []).append(request)
    first, second = by_doc.values()
    assert len(first) == len(second)
    # The same requests with no two neighbours of one question: no prefill can be reused.
    interleaved = [r for pair in zip(first, second, strict=True) for r in pair]
    forwards = 0

    def count(*_: object) -> None:
        nonlocal forwards
        forwards += 1

    results, calls = {}, {}
    hook = model.register_forward_pre_hook(count)
    try:
        for name, order in (("shared", requests), ("interleaved", interleaved)):
            lm = KVQuantHFLM(kv_cache_dtype="int8", score_mode="decode", loaded=smollm2)
            forwards = 0
            scores = lm.loglikelihood(order, disable_tqdm=True)
            results[name] = {id(r): s for r, s in zip(order, scores, strict=True)}
            calls[name] = forwards
    finally:
        hook.remove()
    assert results["shared"] == results["interleaved"]
    # Every choice after a question's first skips its prefill forward.
    assert calls["interleaved"] - calls["shared"] == len(requests) - len(by_doc)
