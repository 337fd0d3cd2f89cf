"""Paired statistics against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from kvbench.accuracy import AccuracyError, gate_passes, mcnemar_exact, paired_stats


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
