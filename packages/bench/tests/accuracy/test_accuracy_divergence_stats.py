"""Divergence statistics against values worked out by hand on a two-token vocabulary."""

from __future__ import annotations

import math

import pytest
import torch

from kvbench.accuracy._divergence import TokenScores, divergence_stats, token_scores

_LN = math.log

# Three positions, vocabulary of two. Logits chosen so the softmaxes are simple fractions:
#   1: reference [0, 0] -> p = (1/2, 1/2); candidate [ln 3, 0] -> q = (3/4, 1/4); next token 1
#   2: both [ln 3, 0] -> (3/4, 1/4), identical; next token 0
#   3: reference [ln 4, 0] -> (4/5, 1/5); candidate [0, ln 4] -> (1/5, 4/5); next token 0
_REFERENCE = torch.tensor([[0.0, 0.0], [_LN(3), 0.0], [_LN(4), 0.0]])
_CANDIDATE = torch.tensor([[_LN(3), 0.0], [_LN(3), 0.0], [0.0, _LN(4)]])
_TARGETS = torch.tensor([1, 0, 0])
# KL(p || q) at each position
_KLD = [0.5 * _LN(0.5 / 0.75) + 0.5 * _LN(0.5 / 0.25), 0.0, 0.8 * _LN(4) + 0.2 * _LN(0.25)]


def _sample_stderr(values: list[float]) -> float:
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(variance / len(values))


def test_token_scores_of_each_position() -> None:
    scores = token_scores(_REFERENCE, _CANDIDATE, _TARGETS)
    torch.testing.assert_close(scores.kld, torch.tensor(_KLD, dtype=torch.float64))
    # Position 1's reference is a tie: the first token counts as its top-1, as for the candidate.
    assert scores.same_top1.tolist() == [True, True, False]
    expected_nll_reference = [_LN(2), _LN(4 / 3), _LN(5 / 4)]
    expected_nll = [_LN(4), _LN(4 / 3), _LN(5)]
    torch.testing.assert_close(scores.nll_reference, torch.tensor(expected_nll_reference).double())
    torch.testing.assert_close(scores.nll, torch.tensor(expected_nll).double())
    assert not scores.identical


def test_summary_over_chunks_matches_the_hand_computed_figures() -> None:
    # The same three positions split over two chunks: the summary pools positions.
    first = token_scores(_REFERENCE[:2], _CANDIDATE[:2], _TARGETS[:2])
    second = token_scores(_REFERENCE[2:], _CANDIDATE[2:], _TARGETS[2:])
    stats = divergence_stats([first, second])
    assert stats.tokens == 3
    assert stats.mean_kld == pytest.approx(sum(_KLD) / 3)
    assert stats.mean_kld_stderr == pytest.approx(_sample_stderr(_KLD))
    _, middle, high = sorted(_KLD)
    assert stats.median_kld == pytest.approx(middle)
    # Linear interpolation between order statistics: rank 0.99 * (3 - 1) = 1.98.
    assert stats.p99_kld == pytest.approx(middle + 0.98 * (high - middle))
    assert stats.p999_kld == pytest.approx(middle + 0.998 * (high - middle))
    assert stats.max_kld == pytest.approx(high)
    # Two of three top-1s unchanged; binomial error sqrt(p (1 - p) / (n - 1)) = 1/3.
    assert stats.same_top1 == pytest.approx(2 / 3)
    assert stats.same_top1_stderr == pytest.approx(1 / 3)
    # nll - nll_reference = ln 2, 0, ln 4: mean ln 2, so perplexity doubles.
    assert stats.ppl_ratio == pytest.approx(2.0)
    assert stats.ppl_ratio_stderr == pytest.approx(2.0 * _sample_stderr([_LN(2), 0.0, _LN(4)]))
    # p(next) moves by 1/4 - 1/2, 0 and 1/5 - 4/5.
    squares = [0.25**2, 0.0, 0.6**2]
    rms = math.sqrt(sum(squares) / 3)
    assert stats.rms_dp == pytest.approx(rms)
    assert stats.rms_dp_stderr == pytest.approx(_sample_stderr(squares) / (2 * rms))
    assert stats.ppl_reference == pytest.approx(math.exp((_LN(2) + _LN(4 / 3) + _LN(5 / 4)) / 3))
    assert stats.ppl == pytest.approx(math.exp((_LN(4) + _LN(4 / 3) + _LN(5)) / 3))
    assert not stats.identical


def test_identical_logits_give_exact_zeros() -> None:
    stats = divergence_stats([token_scores(_REFERENCE, _REFERENCE.clone(), _TARGETS)])
    assert stats.identical
    assert (stats.mean_kld, stats.max_kld, stats.rms_dp, stats.rms_dp_stderr) == (0, 0, 0, 0)
    assert (stats.same_top1, stats.same_top1_stderr) == (1.0, 0.0)
    assert (stats.ppl_ratio, stats.ppl_ratio_stderr) == (1.0, 0.0)


def test_one_differing_bit_is_not_identical() -> None:
    nudged = _REFERENCE.clone()
    nudged[1, 0] = torch.nextafter(nudged[1, 0], torch.tensor(10.0))
    assert not token_scores(_REFERENCE, nudged, _TARGETS).identical


def test_large_vocabulary_is_scored_in_row_blocks_with_the_same_result() -> None:
    # More positions than one block: each position's figures must not depend on its block.
    generator = torch.Generator().manual_seed(0)
    reference = torch.randn(150, 1000, generator=generator)
    candidate = reference + 0.1 * torch.randn(150, 1000, generator=generator)
    targets = torch.randint(0, 1000, (150,), generator=generator)
    whole = token_scores(reference, candidate, targets)
    one_by_one = [
        token_scores(reference[i : i + 1], candidate[i : i + 1], targets[i : i + 1])
        for i in range(150)
    ]
    torch.testing.assert_close(
        whole.kld, torch.cat([s.kld for s in one_by_one]), rtol=0, atol=1e-12
    )
    assert (whole.kld > 0).all()


def test_block_standard_errors_are_those_of_the_block_means() -> None:
    # Two blocks of 4 equal positions each: the positions carry no more information than the
    # two block means, so the error is that of two values, not of eight.
    kld = torch.tensor([0.1] * 4 + [0.3] * 4, dtype=torch.float64)
    same = torch.tensor([True] * 4 + [False] * 4)
    nll = torch.zeros(8, dtype=torch.float64)
    scores = token_scores_like(kld, same, nll)
    blocks = torch.tensor([7] * 4 + [2] * 4)
    blocked = divergence_stats([scores], blocks)
    independent = divergence_stats([scores])
    assert blocked.stderr_blocks == 2 and independent.stderr_blocks == 0
    assert blocked.mean_kld == pytest.approx(0.2)
    assert blocked.mean_kld_stderr == pytest.approx(_sample_stderr([0.1, 0.3]))
    assert blocked.same_top1_stderr == pytest.approx(_sample_stderr([1.0, 0.0]))
    assert independent.mean_kld_stderr == pytest.approx(_sample_stderr([0.1] * 4 + [0.3] * 4))
    assert blocked.mean_kld_stderr > 2 * independent.mean_kld_stderr


def test_one_block_has_no_standard_error() -> None:
    scores = token_scores_like(
        torch.tensor([0.1, 0.3], dtype=torch.float64),
        torch.tensor([True, False]),
        torch.zeros(2, dtype=torch.float64),
    )
    assert divergence_stats([scores], torch.tensor([5, 5])).mean_kld_stderr == 0.0


def token_scores_like(kld: torch.Tensor, same: torch.Tensor, nll: torch.Tensor) -> TokenScores:
    return TokenScores(kld, same, nll, nll.clone(), identical=False)
