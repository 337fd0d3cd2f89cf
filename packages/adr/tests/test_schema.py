from __future__ import annotations

import math

import pytest

from adrkit.schema import COMPARISONS, Gate, RecordError, Table, files_by_name, holds


@pytest.mark.parametrize(
    ("value", "op", "threshold", "expected"),
    [
        (1.0, "<=", 1.0, True),
        (1.0, "<", 1.0, False),
        (2.0, ">=", 1.0, True),
        (1.0, ">", 1.0, False),
        (3.0, "==", 3.0, True),
        (math.nan, "<=", 1.0, False),
        (math.inf, ">=", 1.0, False),
        (0.0, "<=", math.inf, False),
    ],
)
def test_holds(value: float, op: str, threshold: float, expected: bool) -> None:
    assert holds(value, op, threshold) is expected


def test_an_unknown_op_names_the_known_ones() -> None:
    with pytest.raises(RecordError, match="op '=<' is not one of") as raised:
        holds(0.0, "=<", 0.0)
    assert all(op in str(raised.value) for op in COMPARISONS)


def test_a_forged_verdict_is_refused() -> None:
    with pytest.raises(RecordError, match="disagrees with 2 <= 1"):
        Gate("g", 2.0, "<=", 1.0, passed=True)
    assert not Gate.judge("g", 2.0, "<=", 1.0).passed


def test_table_rows_by_column() -> None:
    table = Table(["a", "b"], [[1, "x"], [2, None]])
    assert table.keyed_rows() == [{"a": 1, "b": "x"}, {"a": 2, "b": None}]


def test_files_by_name_skips_files_not_written() -> None:
    assert files_by_name("out/results.json", None) == {"results.json": "out/results.json"}
