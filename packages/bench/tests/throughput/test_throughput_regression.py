"""The regression detector on synthetic histories: noise stays quiet, a real drop alarms; and a
run's cells judged against a real history database: only timed cells, only on the same hardware,
and a history too short to judge says so."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import pytest

from kvbench.throughput import Gates, History, Matrix, describe_history_check, judge
from kvbench.throughput._kernels import add_ratios
from kvbench.throughput._matrix import parse_matrix
from kvbench.throughput._run import _judge

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


# ---- Judging a run's cells against the history database -----------------------------------

_NIGHT = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def _cell(
    value: float, *, functional_check: bool = False, name: str = "decode int8"
) -> dict[str, Any]:
    """A successful cell as ``run_throughput`` leaves it before judging."""
    return {
        "kind": "kernel", "name": name, "status": "ok", "error": None, "metric": "time_ms",
        "value": value, "unit": "ms", "spread": 0.0, "engine_start_s": None,
        "functional_check": functional_check, "regression": False, "judgement": None,
        "history_runs": None, "baseline_median": None,
    }  # fmt: skip


def _history(tmp_path: Path, hardware_key: str, values: list[float]) -> History:
    """A real history database holding one night per value of the cell, on ``hardware_key``."""
    history = History(f"sqlite:///{tmp_path / 'h.sqlite3'}")
    for night, value in enumerate(values):
        run = {"hardware": {"key": hardware_key}, "cells": [_cell(value)], "elapsed_s": 1.0}
        history.record(run, matrix="m", started_at=_NIGHT + dt.timedelta(days=night))
    return history


def _matrix(min_history: int = 3) -> Matrix:
    return parse_matrix(f"[gates]\nmin_history = {min_history}\n", "m.toml")


def test_a_slower_night_on_the_same_hardware_is_flagged(tmp_path: Path) -> None:
    history = _history(tmp_path, "h200", [1.0, 1.01, 0.99, 1.0])
    cells = [_cell(1.5)]
    regressions, check = _judge(_matrix(), cells, history, "h200")
    history.close()
    assert [r["name"] for r in regressions] == ["decode int8"]
    assert cells[0]["judgement"] == "regression" and cells[0]["history_runs"] == 4
    assert check["cells_judged"] == 1 and check["cells_history_too_short"] == 0


def test_a_history_of_another_hardware_class_never_flags(tmp_path: Path) -> None:
    # Fast nights on a GPU node; tonight's cell runs on another machine and is 50x slower.
    history = _history(tmp_path, "h200", [1.0, 1.01, 0.99, 1.0])
    cells = [_cell(50.0)]
    regressions, check = _judge(_matrix(), cells, history, "cpu-nightly")
    history.close()
    assert regressions == [] and not cells[0]["regression"]
    assert cells[0]["judgement"] == "history-too-short" and cells[0]["history_runs"] == 0
    assert describe_history_check(0, check) == (
        "history too short to judge 1 cell(s) (0 of 3 earlier runs)"
    )


def test_a_too_short_history_says_so_instead_of_counting_no_regressions(tmp_path: Path) -> None:
    history = _history(tmp_path, "h200", [1.0, 1.0])
    cells = [_cell(5.0), _cell(1.0, name="decode bfloat16")]
    regressions, check = _judge(_matrix(), cells, history, "h200")
    history.close()
    assert regressions == []
    assert [c["judgement"] for c in cells] == ["history-too-short", "history-too-short"]
    assert check == {
        "min_history": 3,
        "cells_judged": 0,
        "cells_history_too_short": 2,
        "fewest_history_runs": 0,
    }
    assert describe_history_check(0, check) == (
        "history too short to judge 2 cell(s) (0 of 3 earlier runs)"
    )


def test_a_functional_check_is_never_judged_however_slow(tmp_path: Path) -> None:
    history = _history(tmp_path, "cpu", [1.0, 1.0, 1.0, 1.0])
    cells = [_cell(100.0, functional_check=True), _cell(1.0)]
    regressions, check = _judge(_matrix(), cells, history, "cpu")
    history.close()
    assert regressions == [] and cells[0]["judgement"] == "not-judged"
    assert cells[0]["baseline_median"] is None and not cells[0]["regression"]
    # The same value, timed, is judged against the same history.
    assert cells[1]["judgement"] == "within-noise" and cells[1]["baseline_median"] == 1.0
    assert describe_history_check(0, check) == (
        "0 regression(s) in 1 cell(s) judged against their history"
    )


def _kernel(
    cache_dtype: str,
    value: float,
    nbytes: int,
    *,
    check: bool,
    heads: str = "32/8x128",
    impl: str = "kvquant",
    status: str = "ok",
) -> dict[str, Any]:
    return {
        "kind": "kernel", "status": status, "op": "decode", "heads": heads, "batch": 16,
        "context": 8192, "prefix": 0, "cache_dtype": cache_dtype, "value": value,
        "bytes": nbytes, "functional_check": check, "impl": impl,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("int8_check", "baseline_check", "speedup"),
    [(False, False, 2.0), (True, False, None), (False, True, None), (True, True, None)],
)
def test_a_speed_up_needs_both_cells_timed_and_the_bytes_ratio_does_not(
    int8_check: bool, baseline_check: bool, speedup: float | None
) -> None:
    int8 = _kernel("int8", 0.05, 264, check=int8_check)
    cells = [int8, _kernel("bfloat16", 0.1, 512, check=baseline_check)]
    add_ratios(cells)
    assert int8["speedup_vs_16bit"] == speedup
    assert int8["bytes_vs_16bit"] == 264 / 512
    assert cells[1]["speedup_vs_16bit"] is None  # no speed-up over itself


def test_an_int8_cell_is_paired_with_the_16_bit_cell_of_its_own_geometry() -> None:
    gqa, mqa = (
        _kernel("int8", 0.05, 264, check=False),
        _kernel("int8", 0.04, 66, check=False, heads="32/1x128"),
    )
    cells = [
        gqa,
        mqa,
        _kernel("bfloat16", 0.1, 512, check=False),
        _kernel("bfloat16", 0.06, 128, check=False, heads="32/1x128"),
    ]
    add_ratios(cells)
    assert (gqa["speedup_vs_16bit"], gqa["bytes_vs_16bit"]) == (0.1 / 0.05, 264 / 512)
    assert (mqa["speedup_vs_16bit"], mqa["bytes_vs_16bit"]) == (0.06 / 0.04, 66 / 128)


def test_each_kvquant_cell_gets_its_speed_up_over_each_baseline_of_its_shape() -> None:
    int8, sixteen = (
        _kernel("int8", 0.05, 264, check=False),
        _kernel("bfloat16", 0.1, 512, check=False),
    )
    cells = [
        int8,
        sixteen,
        _kernel("int8", 0.2, 264, check=False, impl="vllm"),
        _kernel("bfloat16", 0.15, 512, check=False, impl="vllm"),
        # A baseline of another geometry, and one not measured here: neither is this shape's.
        _kernel("int8", 9.0, 264, check=False, impl="vllm", heads="32/1x128"),
        _kernel("bfloat16", 0.0, 512, check=False, impl="sdpa", status="not-measured"),
    ]
    add_ratios(cells)
    assert int8["speedup_vs_upstream_int8"] == 0.2 / 0.05
    assert int8["speedup_vs_upstream_bf16"] == 0.15 / 0.05
    assert int8["speedup_vs_sdpa"] is None
    # Our 16-bit cell against upstream's bf16; never against an INT8 baseline.
    assert sixteen["speedup_vs_upstream_bf16"] == 0.15 / 0.1
    assert sixteen["speedup_vs_upstream_int8"] is None
    assert "speedup_vs_upstream_int8" not in cells[2]  # a baseline gets no ratios of its own
