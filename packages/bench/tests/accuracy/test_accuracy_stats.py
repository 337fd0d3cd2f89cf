"""Paired statistics against values worked out by hand."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from kvbench.accuracy import (
    AccuracyError,
    flip_rate_upper_bound,
    gate_passes,
    mcnemar_exact,
    paired_stats,
    verdict,
)


def test_binary_scores_give_delta_stderr_flips_and_mcnemar() -> None:
    # diffs 0, +1, -1, 0, +1: mean 0.2; sample variance (0.04+0.64+1.44+0.04+0.64)/4 = 0.7
    stats = paired_stats([1, 0, 1, 1, 0], [1, 1, 0, 1, 1])
    assert stats.n == 5
    assert stats.baseline == pytest.approx(0.6)
    assert stats.candidate == pytest.approx(0.8)
    assert stats.delta == pytest.approx(0.2)
    assert stats.stderr == pytest.approx(math.sqrt(0.7 / 5))
    assert stats.ci_low == pytest.approx(0.2 - 1.959964 * math.sqrt(0.14), abs=1e-6)
    assert stats.ci_high == pytest.approx(0.2 + 1.959964 * math.sqrt(0.14), abs=1e-6)
    assert (stats.flips_up, stats.flips_down) == (2, 1)
    # 3 discordant pairs, 1 the smaller side: 2 * (C(3,0) + C(3,1)) / 8 = 1.0
    assert stats.mcnemar_p == pytest.approx(1.0)


def test_mcnemar_exact_matches_binomial_tails() -> None:
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64)
    assert mcnemar_exact(1, 9) == pytest.approx(2 * (1 + 10) / 1024)
    assert mcnemar_exact(0, 0) == 1.0


def test_continuous_scores_have_no_flips() -> None:
    # diffs -0.5, 0.5, 1.0: mean 1/3; variance ((5/6)^2 + (1/6)^2 + (2/3)^2) / 2 = 7/12
    stats = paired_stats([2.0, 3.0, 1.5], [1.5, 3.5, 2.5])
    assert stats.delta == pytest.approx(1 / 3)
    assert stats.stderr == pytest.approx(math.sqrt(7 / 12 / 3))
    assert stats.flips_up is None and stats.flips_down is None and stats.mcnemar_p is None


def test_gate_uses_the_larger_of_tolerance_and_two_stderr() -> None:
    noisy = paired_stats([1, 0, 1, 1, 0], [1, 1, 0, 1, 1])  # delta 0.2, 2 stderr 0.748
    assert gate_passes(noisy, tolerance=0.01)
    steady = paired_stats([0.5] * 4, [0.6] * 4)  # delta 0.1, stderr 0
    assert not gate_passes(steady, tolerance=0.05)
    assert gate_passes(steady, tolerance=0.1 + 1e-9)


def test_mismatched_or_empty_inputs_are_refused() -> None:
    with pytest.raises(AccuracyError, match="expected 2"):
        paired_stats([1, 0], [1])
    with pytest.raises(AccuracyError, match="empty"):
        paired_stats([], [])


def test_flip_rate_upper_bound_is_the_exact_binomial_bound() -> None:
    # No flips: solve (1 - r)^n = 0.05.
    assert flip_rate_upper_bound(0, 10) == pytest.approx(1 - 0.05 ** (1 / 10))
    # 3 of 100: the 95% quantile of beta(4, 97) (scipy.stats.beta.ppf(0.95, 4, 97)).
    assert flip_rate_upper_bound(3, 100) == pytest.approx(0.0757108, abs=1e-6)
    assert flip_rate_upper_bound(5, 5) == 1.0


def test_detectable_delta_with_no_flips_uses_the_upper_bound_not_the_zero_stderr() -> None:
    z = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.8)  # 2.80
    steady = paired_stats([1, 0] * 5, [1, 0] * 5)  # 10 items, nothing flipped, stderr 0
    assert steady.stderr == 0
    assert steady.detectable_delta == pytest.approx(z * math.sqrt((1 - 0.05 ** (1 / 10)) / 10))
    assert steady.detectable_delta > 0.4  # ten items can only see a huge change
    # One flip in 20: the bound on the rate, not the sample stderr of sqrt(0.05 * 0.95 / 20)...
    one = paired_stats([1] * 20, [1] * 19 + [0])
    rate = flip_rate_upper_bound(1, 20)
    assert one.detectable_delta == pytest.approx(z * math.sqrt(rate / 20))
    # ...and a continuous metric its sample stderr.
    continuous = paired_stats([2.0, 3.0, 1.5], [1.5, 3.5, 2.5])
    assert continuous.detectable_delta == pytest.approx(z * continuous.stderr)


def test_verdict_is_inconclusive_when_the_rows_could_not_see_the_tolerance() -> None:
    ten = paired_stats([1, 0] * 5, [1, 0] * 5)
    assert gate_passes(ten, 0.02) and verdict(ten, 0.02) == "inconclusive"
    # 600 items and no flip: a delta of 0.02 would have shown (detectable ~0.0097).
    many = paired_stats([1, 0] * 300, [1, 0] * 300)
    assert many.detectable_delta < 0.01 and verdict(many, 0.02) == "passed"
    # A visible loss fails, however small the sample.
    loss = paired_stats([1] * 8 + [0] * 2, [0] * 10)
    assert verdict(loss, 0.02) == "failed"
