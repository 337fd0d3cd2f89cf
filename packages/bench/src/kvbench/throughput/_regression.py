"""Is today's value of a cell worse than its recent history by more than that history's noise?

The noise is the history's own robust spread (1.4826 x the median absolute deviation, which
estimates one standard deviation and ignores an odd outlier night). A cell is flagged when it is
worse than the history median by more than ``noise_sigmas`` of those and by at least
``min_change`` of the median; the second condition keeps a history that happened to be almost
constant from alarming on a 1% wobble.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ._matrix import Gates

# Scales the median absolute deviation to a standard deviation for normally distributed noise.
_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Verdict:
    """The comparison of one value with its history.

    Attributes:
        regression: worse beyond the noise and the minimum change.
        baseline_median: the history's median; None when the history is too short to judge.
        noise: the history's robust standard deviation, in the metric's unit.
        change: (value - baseline) / baseline, signed so that negative is worse.
    """

    regression: bool
    baseline_median: float | None
    noise: float | None
    change: float | None


def judge(value: float, history: list[float], *, higher_is_better: bool, gates: Gates) -> Verdict:
    """Compare ``value`` with ``history`` (earlier values of the same cell, any order)."""
    if len(history) < gates.min_history:
        return Verdict(regression=False, baseline_median=None, noise=None, change=None)
    baseline = statistics.median(history)
    noise = _MAD_TO_SIGMA * statistics.median(abs(v - baseline) for v in history)
    worse_by = baseline - value if higher_is_better else value - baseline
    regression = worse_by > gates.noise_sigmas * noise and worse_by > gates.min_change * abs(
        baseline
    )
    change = -worse_by / abs(baseline) if baseline else None
    return Verdict(regression=regression, baseline_median=baseline, noise=noise, change=change)
