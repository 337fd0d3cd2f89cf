"""The regression detector on synthetic histories: noise stays quiet, a real drop alarms."""

from __future__ import annotations

import random

from kvbench.throughput import Gates, judge

GATES = Gates()


def _noisy_history(rng: random.Random, level: float, relative_noise: float) -> list[float]:
    return [rng.gauss(level, level * relative_noise) for _ in range(GATES.history_runs)]


def test_noise_alone_does_not_alarm() -> None:
    rng = random.Random(7)
    alarms = 0
    for _ in range(500):
        history = _noisy_history(rng, 1000.0, 0.03)
        alarms += judge(
            rng.gauss(1000.0, 30.0), history, higher_is_better=True, gates=GATES
        ).regression
    # A 3-sigma gate on a spread estimated from ten nights: under 2% false alarms per cell.
    assert alarms < 10


def test_a_15_percent_drop_beyond_the_noise_alarms() -> None:
    rng = random.Random(11)
    for _ in range(200):
        history = _noisy_history(rng, 1000.0, 0.02)
        verdict = judge(850.0, history, higher_is_better=True, gates=GATES)
        assert verdict.regression
        assert verdict.change is not None and -0.2 < verdict.change < -0.1


def test_a_15_percent_drop_inside_a_noisier_history_does_not_alarm() -> None:
    history = [1000.0, 700.0, 1300.0, 850.0, 1150.0, 900.0, 1100.0, 760.0, 1240.0, 1000.0]
    assert not judge(850.0, history, higher_is_better=True, gates=GATES).regression


def test_constant_history_needs_the_minimum_change() -> None:
    history = [100.0] * 5
    assert not judge(98.0, history, higher_is_better=True, gates=GATES).regression
    assert judge(90.0, history, higher_is_better=True, gates=GATES).regression


def test_for_times_slower_is_worse_and_faster_is_fine() -> None:
    history = [10.0, 10.1, 9.9, 10.05, 9.95]
    assert judge(11.5, history, higher_is_better=False, gates=GATES).regression
    assert not judge(8.5, history, higher_is_better=False, gates=GATES).regression


def test_short_history_is_never_flagged() -> None:
    verdict = judge(1.0, [100.0, 100.0], higher_is_better=True, gates=GATES)
    assert not verdict.regression
    assert verdict.baseline_median is None
