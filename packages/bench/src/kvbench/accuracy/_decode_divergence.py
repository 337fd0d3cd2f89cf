"""Divergence through the decode kernel, by context length.

A batch of texts is decoded together, each cache in its own `BatchKVSession`: the tokens before
a window are prefilled (unscored), then every position of the window is one decode step, a
one-token forward whose attention reads the cache through ``kvquant.decode_attention`` on the
kernels path (kvquant's torch reference otherwise). Each step's next-token distributions are
compared with the 16-bit cache's at the same step, as the prefill divergence compares them
(`token_scores`), and each position falls in the bucket of its context length (the keys it
reads, its own included). Every row is one arm in one bucket.

The arms: the candidate (INT8, gated in every bucket); the degraded control (4-bit codes in the
INT8 cache, read by the same kernel) that must fail the gate in every bucket; optionally a
near-gate control (5 to 7-bit codes) reported beside the gate but not gated; and a trap, a second
16-bit session stepped beside the others, which must equal the baseline bit for bit: the
sessions share no state and a decode step is deterministic. The controls may score other
windows than the candidate (``control_windows``), in a second pass with its own baseline.

Standard errors let positions be correlated within blocks of `BLOCK_POSITIONS` consecutive
positions of one text (cluster-robust, `_mean_and_stderr`); each row also gives the error with
whole texts as the blocks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ._config import DEGRADED_KV_CACHE_DTYPE, DivergenceGate, DivergenceSpec
from ._corpus import corpus_texts
from ._divergence import (
    EXPECT_FAIL,
    EXPECT_PASS,
    EXPECT_ZERO,
    TokenScores,
    divergence_stats,
    gate_checks,
    plot_kld,
    token_scores,
    verdict_of,
)
from ._errors import ConfigError
from ._hf_model import forward_batch, model_batch_session
from ._result import DivergenceResult

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Positions of one text whose errors may be correlated: the standard errors' blocks.
BLOCK_POSITIONS = 64
# A near-gate control is shown beside the gate: its verdict is what the gate would say of it.
EXPECT_REPORTED = "reported"
STDERR_METHOD = f"cluster-robust over blocks of {BLOCK_POSITIONS} consecutive positions of one text"


def bucket_label(low: int, high: int) -> str:
    """A bucket of context lengths ``low...high`` keys, e.g. ``≤512`` or ``513-2048``."""
    return f"≤{high}" if low <= 1 else f"{low}-{high}"


@dataclass(frozen=True)
class _Arm:
    name: str  # candidate | degraded | near-gate | trap
    kv_cache_dtype: str
    control: bool
    expected: str


def _arms(spec: DivergenceSpec, baseline: str, candidate: str) -> tuple[list[_Arm], list[_Arm]]:
    """(the candidate's arms, the controls' arms)."""
    controls = [_Arm("degraded", DEGRADED_KV_CACHE_DTYPE, control=True, expected=EXPECT_FAIL)]
    if spec.near_gate is not None:
        controls.append(_Arm("near-gate", spec.near_gate, control=True, expected=EXPECT_REPORTED))
    controls.append(_Arm("twin-trap", baseline, control=True, expected=EXPECT_ZERO))
    return [_Arm("candidate", candidate, control=False, expected=EXPECT_PASS)], controls


@dataclass
class _Scored:
    """One arm's scored steps: a `TokenScores` of the batch per step, and the step's position."""

    steps: list[TokenScores]
    positions: list[int]


def _decode_pass(
    model: PreTrainedModel,
    texts: torch.Tensor,
    windows: Sequence[tuple[int, int]],
    baseline: str,
    arms: Sequence[_Arm],
    kernels: bool,
    seconds: dict[str, float],
    progress: bool,
) -> dict[str, _Scored]:
    """Decode ``texts [batch, length]`` through the baseline's and each arm's session in step;
    each arm's scores against the baseline at every position of ``windows``."""
    batch, length = texts.shape
    names = ["baseline", *(arm.name for arm in arms)]
    dtypes = [baseline, *(arm.kv_cache_dtype for arm in arms)]
    sessions = {
        name: model_batch_session(
            model, kv_cache_dtype=dtype, batch=batch, max_tokens=length, kernels=kernels
        )
        for name, dtype in zip(names, dtypes, strict=True)
    }
    scored = {arm.name: _Scored([], []) for arm in arms}

    def step(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = {}
        for name, session in sessions.items():
            started = time.perf_counter()
            logits[name] = forward_batch(model, session, tokens)
            if logits[name].is_cuda:
                torch.cuda.synchronize(logits[name].device)
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - started
        return logits

    positions: Any = [p for first, end in windows for p in range(first, end)]
    if progress:
        from tqdm import tqdm  # type: ignore[import-untyped]  # installed with transformers

        positions = tqdm(positions, desc=f"decode divergence, {batch} texts")
    done = 0
    for position in positions:
        if position > done:  # the tokens no window scores: one prefill forward
            step(texts[:, done:position])
        logits = step(texts[:, position : position + 1])
        targets = texts[:, position + 1]
        for arm in arms:
            scores = token_scores(logits["baseline"], logits[arm.name], targets)
            scored[arm.name].steps.append(scores)
            scored[arm.name].positions.append(position)
        done = position + 1
    return scored


def _bucket_rows(
    arm: _Arm,
    scored: _Scored,
    spec: DivergenceSpec,
    gate: DivergenceGate,
    path: str,
    documents: str,
    seconds: float,
) -> list[dict[str, Any]]:
    """One row per bucket that holds positions of ``arm``."""
    batch = spec.texts
    context = torch.tensor(scored.positions, dtype=torch.int64)[:, None].expand(-1, batch) + 1
    text = torch.arange(batch, dtype=torch.int64)[None].expand(len(scored.positions), -1)
    # Step-major, like the concatenated scores: position i of step s is text i.
    context, text = context.flatten(), text.flatten()
    blocks = text * (spec.text_length // BLOCK_POSITIONS + 1) + (context - 1) // BLOCK_POSITIONS
    whole = TokenScores(
        torch.cat([s.kld for s in scored.steps]),
        torch.cat([s.same_top1 for s in scored.steps]),
        torch.cat([s.nll_reference for s in scored.steps]),
        torch.cat([s.nll for s in scored.steps]),
        all(s.identical for s in scored.steps),
    )
    rows = []
    low = 1
    for high in spec.buckets:
        mask = (context >= low) & (context <= high)
        if bool(mask.any()):
            part = TokenScores(
                whole.kld[mask],
                whole.same_top1[mask],
                whole.nll_reference[mask],
                whole.nll[mask],
                # Bit-for-bit equality is kept per step; a bucket is identical when its KLDs
                # are all exactly 0 and the whole arm's logits were identical.
                whole.identical and bool((whole.kld[mask] == 0).all()),
            )
            stats = divergence_stats([part], blocks[mask])
            by_text = divergence_stats([part], text[mask])
            verdict = verdict_of(arm.expected, stats, gate)
            rows.append(
                {
                    "arm": arm.name,
                    "attention": path,
                    "kernel": "decode",
                    "context": bucket_label(low, high),
                    "context_keys": [int(context[mask].min()), int(context[mask].max())],
                    "documents": documents,
                    "kv_cache_dtype": arm.kv_cache_dtype,
                    "prefill_reads_cache": True,
                    "reference": {"kv_cache_dtype": "baseline", "prefill_reads_cache": True},
                    **asdict(stats),
                    "stderr_method": STDERR_METHOD,
                    "mean_kld_stderr_by_text": by_text.mean_kld_stderr,
                    "ppl_ratio_stderr_by_text": by_text.ppl_ratio_stderr,
                    "checks": gate_checks(stats, gate),
                    "expected": arm.expected,
                    "verdict": verdict,
                    "behaved": arm.expected == EXPECT_REPORTED or verdict == arm.expected,
                    "control": arm.control,
                    "seconds": seconds,
                    "chunks": [],
                }
            )
        low = high + 1
    return rows


def run_decode_divergence(
    spec: DivergenceSpec,
    gate: DivergenceGate,
    paths: tuple[str, ...],
    *,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    baseline: str,
    candidate: str,
    plot_path: Path,
    progress: bool,
) -> DivergenceResult:
    """Decode ``spec``'s texts through the one attention path of ``paths``; a row per arm and
    bucket, and the plot at ``plot_path``."""
    if len(paths) != 1:
        raise ConfigError(
            f"`{spec.attention_name}` is {list(paths)}; a decode divergence run takes one "
            "attention path"
        )
    path = paths[0]
    started = time.perf_counter()
    token_lists, documents = corpus_texts(spec.corpus, tokenizer, spec.text_length, spec.texts)
    texts = torch.tensor(token_lists, dtype=torch.long, device=model.device)
    candidate_arms, control_arms = _arms(spec, baseline, candidate)
    kernels = path == "kernels"
    seconds: dict[str, float] = {}
    passes = [(spec.windows, candidate_arms), (spec.control_windows, control_arms)]
    if spec.control_windows == spec.windows:
        passes = [(spec.windows, candidate_arms + control_arms)]
    scored: dict[str, _Scored] = {}
    for windows, arms in passes:
        scored |= _decode_pass(model, texts, windows, baseline, arms, kernels, seconds, progress)
    rows = []
    for arm in (*candidate_arms, *control_arms):
        rows += _bucket_rows(
            arm, scored[arm.name], spec, gate, path, documents, seconds.get(arm.name, 0.0)
        )
    labels = {
        "candidate": candidate,
        "degraded": "4-bit control",
        "near-gate": f"near-gate control ({spec.near_gate})",
        "twin-trap": "trap: a second 16-bit cache",
    }
    plot = plot_kld(
        {
            f"{labels[arm.name]} (decode, {path})": torch.cat(
                [s.kld for s in scored[arm.name].steps]
            )
            for arm in (*candidate_arms, *control_arms)
        },
        gate.max_mean_kld,
        plot_path,
    )
    return DivergenceResult(
        corpus=spec.corpus,
        chunk_length=0,
        chunks=0,
        control_chunks=0,
        attention=[path],
        baseline=baseline,
        candidate=candidate,
        gate=gate,
        rows=rows,
        agreement=None,
        plot=None if plot is None else str(plot),
        elapsed_s=time.perf_counter() - started,
        kernel="decode",
        texts=spec.texts,
        text_length=spec.text_length,
        windows=[list(w) for w in spec.windows],
        control_windows=[list(w) for w in spec.control_windows],
        buckets=list(spec.buckets),
        documents=documents,
        baseline_seconds=seconds.get("baseline", 0.0),
    )
