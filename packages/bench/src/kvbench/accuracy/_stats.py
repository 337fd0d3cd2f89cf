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

# Two-sided 95% normal quantile; with a few hundred items the t quantile differs below 1%.
_Z_95 = NormalDist().inv_cdf(0.975)


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


def mcnemar_exact(flips_up: int, flips_down: int) -> float:
    """Exact two-sided McNemar p-value: a binomial(b + c, 1/2) test on the discordant pairs."""
    discordant = flips_up + flips_down
    if discordant == 0:
        return 1.0
    smaller = min(flips_up, flips_down)
    tail = sum(math.comb(discordant, k) for k in range(smaller + 1)) / (1 << discordant)
    return min(1.0, 2.0 * tail)


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
    )


def gate_passes(stats: PairedStats, tolerance: float) -> bool:
    """The accuracy gate: ``|delta| <= max(tolerance, 2 * stderr)``.

    A delta inside twice its standard error cannot be told from noise, so the gate only fails
    on a difference that is both larger than the tolerance and statistically visible.
    """
    return abs(stats.delta) <= max(tolerance, 2.0 * stats.stderr)
