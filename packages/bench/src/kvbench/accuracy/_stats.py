"""Paired statistics of a baseline against a candidate scored on the same items.

Both runs see the same items, so the question is about the per-item differences
``d_i = candidate_i - baseline_i``: their mean is the delta, their spread its standard error.
Pairing removes the item-difficulty variance that dominates an unpaired comparison.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from ._errors import AccuracyError
from ._result import delta_gate

# Two-sided 95% normal quantile; with a few hundred items the t quantile differs below 1%.
_Z_95 = NormalDist().inv_cdf(0.975)
# A delta this many standard errors from 0 is found by a two-sided 5% test 80% of the time.
_DETECTABLE_Z = _Z_95 + NormalDist().inv_cdf(0.80)
# Confidence of the upper bound on a row's rate of flipped items (see `detectable_delta`).
_FLIP_RATE_CONFIDENCE = 0.95


@dataclass(frozen=True)
class PairedStats:
    """Summary of paired per-item scores.

    Attributes:
        baseline, candidate: mean scores.
        delta: ``candidate - baseline``, the mean per-item difference.
        stderr: standard error of ``delta`` (sample std of the differences / sqrt(n)).
        ci_low, ci_high: normal 95% interval of ``delta``.
        n: number of paired items.
        flips_up, flips_down: binary scores only: items wrong -> right and right -> wrong.
        mcnemar_p: binary scores only: exact two-sided McNemar p-value of the flips.
        detectable_delta: the smallest true delta this comparison would find 80% of the time
            (`detectable_delta`).
    """

    baseline: float
    candidate: float
    delta: float
    stderr: float
    ci_low: float
    ci_high: float
    n: int
    flips_up: int | None
    flips_down: int | None
    mcnemar_p: float | None
    detectable_delta: float


def mcnemar_exact(flips_up: int, flips_down: int) -> float:
    """Exact two-sided McNemar p-value: a binomial(b + c, 1/2) test on the discordant pairs."""
    discordant = flips_up + flips_down
    if discordant == 0:
        return 1.0
    smaller = min(flips_up, flips_down)
    tail = sum(math.comb(discordant, k) for k in range(smaller + 1)) / (1 << discordant)
    return min(1.0, 2.0 * tail)


def flip_rate_upper_bound(flips: int, n: int, confidence: float = _FLIP_RATE_CONFIDENCE) -> float:
    """One-sided exact (Clopper-Pearson) upper bound on the rate of flipped items, having seen
    ``flips`` of ``n``: the rate r at which seeing ``flips`` or fewer has probability
    ``1 - confidence``. For no flips, ``1 - (1 - confidence) ** (1 / n)``, about 3 / n."""
    if flips >= n:
        return 1.0
    alpha = 1.0 - confidence

    def at_most_flips(rate: float) -> float:  # P(X <= flips), X ~ binomial(n, rate)
        log_terms = [
            math.lgamma(n + 1)
            - math.lgamma(k + 1)
            - math.lgamma(n - k + 1)
            + k * math.log(rate)
            + (n - k) * math.log1p(-rate)
            for k in range(flips + 1)
        ]
        top = max(log_terms)
        return math.exp(top) * sum(math.exp(t - top) for t in log_terms)

    low, high = flips / n, 1.0
    for _ in range(100):  # the tail falls as the rate grows: bisect to float precision
        middle = (low + high) / 2
        if at_most_flips(middle) > alpha:
            low = middle
        else:
            high = middle
    return high


def detectable_delta(
    n: int, stderr: float, flips_up: int | None = None, flips_down: int | None = None
) -> float:
    """The smallest true delta a two-sided 5% test finds with 80% power: 2.80 standard errors.

    Binary scores: a paired delta moves only through flipped items, and its standard error is
    about ``sqrt(flip_rate / n)``. The sample standard error is 0 when nothing flipped, which
    would claim any delta detectable; so the flip rate used is its 95% upper bound
    (`flip_rate_upper_bound`), never below the rate seen. With no flips that gives about
    ``4.8 / n``: 0.019 at 250 items. Continuous scores use their sample standard error.
    """
    if flips_up is None or flips_down is None:
        return _DETECTABLE_Z * stderr
    rate = flip_rate_upper_bound(flips_up + flips_down, n)
    return _DETECTABLE_Z * max(stderr, math.sqrt(rate / n))


def paired_stats(baseline: Sequence[float], candidate: Sequence[float]) -> PairedStats:
    """Paired delta, its standard error and 95% CI; flips and McNemar when scores are 0/1."""
    if len(baseline) != len(candidate):
        msg = f"`candidate` has {len(candidate)} items; expected {len(baseline)} like `baseline`"
        raise AccuracyError(msg)
    n = len(baseline)
    if n == 0:
        raise AccuracyError("`baseline` is empty; expected at least one scored item")
    diffs = [c - b for b, c in zip(baseline, candidate, strict=True)]
    delta = sum(diffs) / n
    variance = sum((d - delta) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    stderr = math.sqrt(variance / n)
    binary = all(v in (0, 1) for v in (*baseline, *candidate))
    flips_up = flips_down = None
    mcnemar_p = None
    if binary:
        flips_up = sum(1 for b, c in zip(baseline, candidate, strict=True) if c > b)
        flips_down = sum(1 for b, c in zip(baseline, candidate, strict=True) if c < b)
        mcnemar_p = mcnemar_exact(flips_up, flips_down)
    return PairedStats(
        baseline=sum(baseline) / n,
        candidate=sum(candidate) / n,
        delta=delta,
        stderr=stderr,
        ci_low=delta - _Z_95 * stderr,
        ci_high=delta + _Z_95 * stderr,
        n=n,
        flips_up=flips_up,
        flips_down=flips_down,
        mcnemar_p=mcnemar_p,
        detectable_delta=detectable_delta(n, stderr, flips_up, flips_down),
    )


def gate_passes(stats: PairedStats, tolerance: float) -> bool:
    """The accuracy gate, ``|delta| <= max(tolerance, 2 * stderr)`` (`delta_gate`)."""
    return delta_gate("|delta|", stats.delta, stats.stderr, tolerance).passed


def verdict(stats: PairedStats, tolerance: float) -> str:
    """``failed`` when the gate fails; else ``inconclusive`` when the comparison could not have
    found a delta of ``tolerance`` (its detectable delta is larger); else ``passed``."""
    if not gate_passes(stats, tolerance):
        return "failed"
    return "inconclusive" if stats.detectable_delta > tolerance else "passed"
