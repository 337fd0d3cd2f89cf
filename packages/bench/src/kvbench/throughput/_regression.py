"""Is today's value of a cell worse than its recent history by more than that history's noise?

The noise is the history's own robust spread (1.4826 x the median absolute deviation, which
estimates one standard deviation and ignores an odd outlier night). A cell is flagged when it is
worse than the history median by more than ``noise_sigmas`` of those and by at least
``min_change`` of the median; the second condition keeps a history that happened to be almost
constant from alarming on a 1% wobble.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._matrix import Gates

# Scales the median absolute deviation to a standard deviation for normally distributed noise.
_MAD_TO_SIGMA = 1.4826


# What a comparison with the history concluded; ids the ADR writer translates.
REGRESSION = "regression"
WITHIN_NOISE = "within-noise"
HISTORY_TOO_SHORT = "history-too-short"
# A functional check's: it is never compared with its history.
NOT_JUDGED = "not-judged"


@dataclass(frozen=True)
class Verdict:
    """The comparison of one value with its history.

    Attributes:
        regression: worse beyond the noise and the minimum change.
        baseline_median: the history's median; None when the history is too short to judge.
        noise: the history's robust standard deviation, in the metric's unit.
        change: (value - baseline) / baseline, signed so that negative is worse.
        history_runs: how many earlier values there were to compare with.
    """

    regression: bool
    baseline_median: float | None
    noise: float | None
    change: float | None
    history_runs: int

    @property
    def judgement(self) -> str:
        """``regression``, ``within-noise``, or ``history-too-short`` (nothing was judged)."""
        if self.baseline_median is None:
            return HISTORY_TOO_SHORT
        return REGRESSION if self.regression else WITHIN_NOISE


def judge(value: float, history: list[float], *, higher_is_better: bool, gates: Gates) -> Verdict:
    """Compare ``value`` with ``history`` (earlier values of the same cell, any order)."""
    if len(history) < gates.min_history:
        return Verdict(
            regression=False,
            baseline_median=None,
            noise=None,
            change=None,
            history_runs=len(history),
        )
    baseline = statistics.median(history)
    noise = _MAD_TO_SIGMA * statistics.median(abs(v - baseline) for v in history)
    worse_by = baseline - value if higher_is_better else value - baseline
    regression = worse_by > gates.noise_sigmas * noise and worse_by > gates.min_change * abs(
        baseline
    )
    change = -worse_by / abs(baseline) if baseline else None
    return Verdict(
        regression=regression,
        baseline_median=baseline,
        noise=noise,
        change=change,
        history_runs=len(history),
    )


def describe_history_check(regressions: int, check: Mapping[str, Any]) -> str:
    """One sentence for a run's ``regressions`` count and its ``history_check``: how many cells
    were judged, and, where the history was too short, that nothing could be said about them."""
    judged, short = check["cells_judged"], check["cells_history_too_short"]
    parts = []
    if judged:
        parts.append(
            f"{regressions} regression(s) in {judged} cell(s) judged against their history"
        )
    if short:
        parts.append(
            f"history too short to judge {short} cell(s) ({check['fewest_history_runs']} of "
            f"{check['min_history']} earlier runs)"
        )
    return "; ".join(parts) or "no timed cell to judge against a history"
