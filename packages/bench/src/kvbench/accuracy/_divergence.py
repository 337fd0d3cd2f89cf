"""Token-level divergence of a KV cache from the 16-bit one on running text.

Both caches score the same chunks of a corpus in one forward each, the prefill reading the cache
it has just written, so every position's attention sees its own and all earlier K/V as a decode
step would: rounded by the cache. Against the baseline's next-token distribution at every
position, the statistics are those of llama.cpp's ``llama-perplexity --kl-divergence``: mean KL
divergence with its standard error, its median, 99th and 99.9th percentiles and maximum, the
share of positions whose top-1 token is unchanged, the perplexity ratio, and the RMS change in
the probability of the token that really came next. Standard errors treat positions as
independent, as llama.cpp does; neighbouring positions are correlated, so the per-chunk figures
show the spread between chunks too.

Two controls run on the first chunks, beside the candidate:
- degraded: the emulated 4-bit cache (`_kv_attention`); it must fail the gate that INT8 passes,
  or the gate could not tell a bad cache from a good one;
- trap: the candidate cache with the prefill attending to the fresh K/V (prefill_reads_cache
  false), against the baseline run the same way; a single pass never reads that cache, so its
  logits must equal the baseline's bit for bit, or the measurement sees something else than the
  cache.

Logits stay per chunk (the vocabulary is ~49k wide); only per-position values are kept.
Needs torch and transformers only, no lm-eval.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ._config import DEGRADED_KV_CACHE_DTYPE, DivergenceGate, DivergenceSpec
from ._corpus import CONCATENATED, corpus_chunks
from ._hf_model import forward, model_session
from ._result import DivergenceResult, agreement_gate, divergence_gates

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from ._kv_attention import KVSession

PLOT_NAME = "divergence_kld.png"


def plot_name(run_index: int) -> str:
    """The KLD plot of the config's divergence run ``run_index`` (0: the first)."""
    return PLOT_NAME if run_index == 0 else PLOT_NAME.replace(".png", f"-{run_index + 1}.png")


# Positions scored at once: bounds the float64 log-softmax work arrays to 64 x vocab.
_ROWS_PER_BLOCK = 64
# What each row must show for the run to be trusted.
EXPECT_PASS, EXPECT_FAIL, EXPECT_ZERO = "passed", "failed", "exactly-0"
NOT_ZERO = "not-0"


@dataclass(frozen=True)
class TokenScores:
    """One chunk's positions, a cache's next-token distribution against a reference's.

    Attributes:
        kld: float64 ``[n]``, KL(reference || cache) in nats at each position.
        same_top1: bool ``[n]``, the most likely token is the same.
        nll_reference, nll: float64 ``[n]``, -log p of the token that came next.
        identical: the two logits tensors were equal bit for bit.
    """

    kld: torch.Tensor
    same_top1: torch.Tensor
    nll_reference: torch.Tensor
    nll: torch.Tensor
    identical: bool


def token_scores(
    reference_logits: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor
) -> TokenScores:
    """Compare ``logits`` with ``reference_logits`` (both ``[n, vocab]``) at each position;
    ``targets [n]`` are the tokens that came next."""
    parts: list[tuple[torch.Tensor, ...]] = []
    for start in range(0, logits.shape[0], _ROWS_PER_BLOCK):
        rows = slice(start, start + _ROWS_PER_BLOCK)
        # float64: a mean KLD of 1e-4 is a sum over ~49k terms that must not drown in rounding.
        log_p = torch.log_softmax(reference_logits[rows].double(), dim=-1)
        log_q = torch.log_softmax(logits[rows].double(), dim=-1)
        target = targets[rows, None]
        parts.append(
            (
                (log_p.exp() * (log_p - log_q)).sum(dim=-1),
                reference_logits[rows].argmax(dim=-1) == logits[rows].argmax(dim=-1),
                -log_p.gather(1, target)[:, 0],
                -log_q.gather(1, target)[:, 0],
            )
        )
    kld, same, nll_reference, nll = (torch.cat(column).cpu() for column in zip(*parts, strict=True))
    return TokenScores(kld, same, nll_reference, nll, bool(torch.equal(reference_logits, logits)))


@dataclass(frozen=True)
class DivergenceStats:
    """llama.cpp's ``--kl-divergence`` summary of some positions (see the module docstring).

    ``ppl_ratio`` is ``exp(mean(nll - nll_reference))``; ``rms_dp`` is the root mean square of
    ``p(next token) - p_reference(next token)``. Each ``*_stderr`` is the standard error of the
    figure before it; 0 for fewer than two positions. ``identical``: every position's logits
    equalled the reference's bit for bit.
    """

    tokens: int
    mean_kld: float
    mean_kld_stderr: float
    median_kld: float
    p99_kld: float
    p999_kld: float
    max_kld: float
    same_top1: float
    same_top1_stderr: float
    ppl_ratio: float
    ppl_ratio_stderr: float
    rms_dp: float
    rms_dp_stderr: float
    ppl_reference: float
    ppl: float
    identical: bool
    # Blocks the standard errors allow to be correlated within; 0: positions independent.
    stderr_blocks: int = 0


def _mean_and_stderr(
    values: torch.Tensor, blocks: torch.Tensor | None = None
) -> tuple[float, float]:
    """The mean and its standard error: positions independent, or with ``blocks`` (an id per
    position) the cluster-robust error that lets positions of one block be correlated,
    ``sqrt(C / (C - 1) * sum_c (S_c - n_c * mean)**2) / n`` over the C blocks' sums S_c."""
    n = values.numel()
    mean = float(values.double().mean())
    if blocks is None:
        if n < 2:
            return mean, 0.0
        return mean, math.sqrt(float(values.double().var(correction=1)) / n)
    ids, inverse = torch.unique(blocks, return_inverse=True)
    count = ids.numel()
    if count < 2:
        return mean, 0.0
    sums = torch.zeros(count, dtype=torch.float64).index_add_(0, inverse, values.double() - mean)
    return mean, math.sqrt(count / (count - 1) * float((sums**2).sum())) / n


def divergence_stats(
    scores: Sequence[TokenScores], blocks: torch.Tensor | None = None
) -> DivergenceStats:
    """Summarize the positions of ``scores`` (one chunk, or all chunks of a run). ``blocks``:
    an id per position, for standard errors that let positions of a block be correlated
    (`_mean_and_stderr`); None treats positions as independent, as llama.cpp does."""
    kld = torch.cat([s.kld for s in scores])
    same = torch.cat([s.same_top1 for s in scores]).double()
    nll_reference = torch.cat([s.nll_reference for s in scores])
    nll = torch.cat([s.nll for s in scores])
    n = kld.numel()
    mean_kld, mean_kld_stderr = _mean_and_stderr(kld, blocks)
    quantiles = torch.quantile(kld, torch.tensor([0.5, 0.99, 0.999], dtype=torch.float64))
    same_top1 = float(same.mean())
    same_top1_stderr = math.sqrt(same_top1 * (1 - same_top1) / (n - 1)) if n > 1 else 0.0
    if blocks is not None:
        same_top1_stderr = _mean_and_stderr(same, blocks)[1]
    log_ratio, log_ratio_stderr = _mean_and_stderr(nll - nll_reference, blocks)
    ppl_ratio = math.exp(log_ratio)
    dp_squared = (torch.exp(-nll) - torch.exp(-nll_reference)) ** 2
    mean_dp_squared, mean_dp_squared_stderr = _mean_and_stderr(dp_squared, blocks)
    rms_dp = math.sqrt(mean_dp_squared)
    return DivergenceStats(
        tokens=n,
        mean_kld=mean_kld,
        mean_kld_stderr=mean_kld_stderr,
        median_kld=float(quantiles[0]),
        p99_kld=float(quantiles[1]),
        p999_kld=float(quantiles[2]),
        max_kld=float(kld.max()),
        same_top1=same_top1,
        same_top1_stderr=same_top1_stderr,
        ppl_ratio=ppl_ratio,
        # d exp(x) = exp(x) dx
        ppl_ratio_stderr=ppl_ratio * log_ratio_stderr,
        rms_dp=rms_dp,
        # d sqrt(x) = dx / (2 sqrt(x)); an unchanged probability everywhere has no spread.
        rms_dp_stderr=mean_dp_squared_stderr / (2 * rms_dp) if rms_dp > 0 else 0.0,
        ppl_reference=math.exp(float(nll_reference.mean())),
        ppl=math.exp(float(nll.mean())),
        identical=all(s.identical for s in scores),
        stderr_blocks=0 if blocks is None else int(torch.unique(blocks).numel()),
    )


def gate_checks(stats: DivergenceStats, gate: DivergenceGate) -> dict[str, bool]:
    """The divergence gate's three checks (`divergence_gates`); a row passes when all hold."""
    checks = divergence_gates("", stats.mean_kld, stats.same_top1, stats.ppl_ratio, gate)
    return {name: check.passed for name, check in checks.items()}


@dataclass(frozen=True)
class _Arm:
    """One cache scored on the chunks, against its reference cache."""

    name: str  # candidate | degraded | trap
    kv_cache_dtype: str
    prefill_reads_cache: bool
    reference: tuple[str, bool]  # (kv_cache_dtype, prefill_reads_cache) it is compared with
    control: bool
    expected: str


def _arms(baseline: str, candidate: str) -> tuple[_Arm, ...]:
    reads = (baseline, True)
    skips = (baseline, False)
    return (
        _Arm("candidate", candidate, True, reads, control=False, expected=EXPECT_PASS),
        _Arm("degraded", DEGRADED_KV_CACHE_DTYPE, True, reads, control=True, expected=EXPECT_FAIL),
        _Arm("trap", candidate, False, skips, control=True, expected=EXPECT_ZERO),
    )


class _Forwards:
    """Each (attention path, cache, prefill setting)'s session, reused chunk after chunk, and
    the seconds spent in its forwards."""

    def __init__(self, model: PreTrainedModel, chunk_length: int) -> None:
        self._model = model
        self._chunk_length = chunk_length
        self._sessions: dict[tuple[str, str, bool], KVSession] = {}
        self.seconds: dict[tuple[str, str, bool], float] = {}

    def logits(self, path: str, cache: tuple[str, bool], tokens: list[int]) -> torch.Tensor:
        key = (path, *cache)
        session = self._sessions.get(key)
        if session is None:
            session = model_session(
                self._model,
                kv_cache_dtype=cache[0],
                prefill_reads_cache=cache[1],
                max_tokens=self._chunk_length,
                kernels=path == "kernels",
            )
            self._sessions[key] = session
        started = time.perf_counter()
        session.length = 0
        logits = forward(self._model, session, tokens, logits_to_keep=len(tokens))
        if logits.is_cuda:
            torch.cuda.synchronize(logits.device)
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - started
        return logits


def verdict_of(expected: str, stats: DivergenceStats, gate: DivergenceGate) -> str:
    """What a row showed: for a row that must read exactly 0, whether it did; else the gate's
    verdict."""
    if expected == EXPECT_ZERO:
        return EXPECT_ZERO if stats.identical else NOT_ZERO
    return EXPECT_PASS if all(gate_checks(stats, gate).values()) else EXPECT_FAIL


def _agreement(
    candidate_scores: dict[str, list[TokenScores]],
    cross: list[TokenScores],
    gate: DivergenceGate,
    candidate: str,
) -> dict[str, Any]:
    """Kernels against reference on the same tokens: the 16-bit model's own divergence between
    the paths, and the paired difference of the candidate's per-position KLD."""
    kernels = torch.cat([s.kld for s in candidate_scores["kernels"]])
    reference = torch.cat([s.kld for s in candidate_scores["reference"]])
    difference, difference_stderr = _mean_and_stderr(kernels - reference)
    reference_mean = float(reference.mean())
    allowed = max(3 * difference_stderr, gate.path_agreement * reference_mean)
    return {
        "baseline_kernels_vs_reference": asdict(divergence_stats(cross)),
        "candidate_mean_kld_kernels": float(kernels.mean()),
        "candidate_mean_kld_reference": reference_mean,
        "difference": difference,
        "difference_stderr": difference_stderr,
        "allowed": allowed,
        "agree": agreement_gate(candidate, difference, allowed).passed,
    }


def run_divergence(
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
    """Score ``spec``'s chunks through ``paths``; rows per path and arm, agreement, the plot at
    ``plot_path``.

    The candidate scores every chunk; the controls the first ``spec.control_tokens`` tokens.
    """
    started = time.perf_counter()
    n_chunks = spec.tokens // spec.chunk_length
    n_control_chunks = spec.control_tokens // spec.chunk_length
    chunks = corpus_chunks(spec.corpus, tokenizer, spec.chunk_length, n_chunks)
    arms = _arms(baseline, candidate)
    forwards = _Forwards(model, spec.chunk_length)
    scores: dict[tuple[str, str], list[TokenScores]] = {}
    cross: list[TokenScores] = []
    chunk_iter: Any = chunks
    if progress:
        from tqdm import tqdm  # type: ignore[import-untyped]  # installed with transformers

        chunk_iter = tqdm(chunks, desc=f"divergence {candidate} vs {baseline}")
    for index, chunk in enumerate(chunk_iter):
        inputs = chunk[:-1]
        targets = torch.tensor(chunk[1:], device=model.device)
        baselines = {}
        for path in paths:
            references: dict[tuple[str, bool], torch.Tensor] = {}
            for arm in arms:
                if arm.control and index >= n_control_chunks:
                    continue
                if arm.reference not in references:
                    references[arm.reference] = forwards.logits(path, arm.reference, inputs)
                logits = forwards.logits(
                    path, (arm.kv_cache_dtype, arm.prefill_reads_cache), inputs
                )
                scored = token_scores(references[arm.reference], logits, targets)
                scores.setdefault((path, arm.name), []).append(scored)
                del logits
            baselines[path] = references[(baseline, True)]
        if len(baselines) == 2:
            cross.append(token_scores(baselines["reference"], baselines["kernels"], targets))
    rows = []
    for arm in arms:
        for path in paths:
            arm_scores = scores.get((path, arm.name))
            if arm_scores is None:
                continue
            stats = divergence_stats(arm_scores)
            cache = (arm.kv_cache_dtype, arm.prefill_reads_cache)
            reference_seconds = forwards.seconds[(path, *arm.reference)]
            verdict = verdict_of(arm.expected, stats, gate)
            rows.append(
                {
                    "arm": arm.name,
                    "attention": path,
                    "kernel": "prefill",
                    "context": f"≤{spec.chunk_length}",
                    "documents": CONCATENATED,
                    "kv_cache_dtype": arm.kv_cache_dtype,
                    "prefill_reads_cache": arm.prefill_reads_cache,
                    "reference": {
                        "kv_cache_dtype": arm.reference[0],
                        "prefill_reads_cache": arm.reference[1],
                    },
                    **asdict(stats),
                    "checks": gate_checks(stats, gate),
                    "expected": arm.expected,
                    "verdict": verdict,
                    "behaved": verdict == arm.expected,
                    "control": arm.control,
                    "seconds": forwards.seconds[(path, *cache)],
                    "reference_seconds": reference_seconds,
                    "chunks": [asdict(divergence_stats([s])) for s in arm_scores],
                }
            )
    agreement = None
    if len(paths) == 2:
        candidate_scores = {path: scores[(path, "candidate")] for path in paths}
        agreement = _agreement(candidate_scores, cross, gate, candidate)
    labels = {"candidate": candidate, "degraded": "4-bit control", "trap": "prefill trap"}
    plot = plot_kld(
        {
            f"{labels[row['arm']]} ({row['attention']})": torch.cat(
                [s.kld for s in scores[(row["attention"], row["arm"])]]
            )
            for row in rows
        },
        gate.max_mean_kld,
        plot_path,
    )
    return DivergenceResult(
        corpus=spec.corpus,
        chunk_length=spec.chunk_length,
        chunks=n_chunks,
        control_chunks=n_control_chunks,
        attention=list(paths),
        baseline=baseline,
        candidate=candidate,
        gate=gate,
        rows=rows,
        agreement=agreement,
        plot=None if plot is None else str(plot),
        elapsed_s=time.perf_counter() - started,
    )


# Per-position KLDs below this show in the plot's first bin (a log axis cannot show 0).
_PLOT_FLOOR = 1e-7


def plot_kld(kld_by_row: dict[str, torch.Tensor], max_mean_kld: float, path: Path) -> Path | None:
    """Histograms of each row's per-position KLD on log axes, each row's mean and the gate's
    threshold on the mean; a row whose every KLD is exactly 0 is named in the legend only. None
    without matplotlib, which divergence runs need for nothing else (the JSON has every figure).
    """
    try:
        import matplotlib
    except ModuleNotFoundError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = max(max(float(kld.max()) for kld in kld_by_row.values()), max_mean_kld, _PLOT_FLOOR) * 2
    bins = torch.logspace(math.log10(_PLOT_FLOOR), math.log10(top), 64).tolist()
    figure, axes = plt.subplots(figsize=(8, 4.5))
    axes.axvline(max_mean_kld, color="0.3", linestyle="--", label=f"gate: mean <= {max_mean_kld:g}")
    for label, kld in kld_by_row.items():
        if not bool((kld != 0).any()):
            axes.plot([], [], " ", label=f"{label}: all {kld.numel()} positions exactly 0")
            continue
        (line,) = axes.plot([], [])  # takes the next colour of the cycle for both marks
        axes.hist(
            kld.clamp(min=_PLOT_FLOOR).tolist(),
            bins=bins,
            histtype="step",
            linewidth=1.5,
            color=line.get_color(),
            label=f"{label}, mean {float(kld.mean()):.2g}",
        )
        axes.axvline(float(kld.mean()), color=line.get_color(), linestyle=":")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("KL divergence from the 16-bit cache at each position, nats (dotted: means)")
    axes.set_ylabel("positions")
    axes.legend(loc="upper right", fontsize="small")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
