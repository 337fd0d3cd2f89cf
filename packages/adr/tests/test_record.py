from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from adrkit import Gate, Record, RecordError, ResultsError, load_latest, read_record, write_record

from conftest import make_record


def test_record_round_trips_through_json(tmp_path: Path) -> None:
    record = make_record()
    path = write_record(tmp_path, record)
    assert path == tmp_path / "run-1" / "audit.json"
    assert read_record(path) == record
    assert json.loads(path.read_text())["schema_version"] == 1


@pytest.mark.parametrize(
    ("value", "op", "threshold", "passed"),
    [
        (0.0, "<=", 0.0, True),
        (1.0, "<=", 0.0, False),
        (0.7, ">=", 0.7, True),
        (math.nan, "<=", 1.0, False),
        (2.0, ">", 2.0, False),
    ],
)
def test_gate_verdicts(value: float, op: str, threshold: float, passed: bool) -> None:
    assert Gate.judge("g", value, op, threshold).passed is passed


def test_unknown_gate_op_is_refused() -> None:
    with pytest.raises(RecordError, match="op '~'"):
        Gate.judge("g", 1.0, "~", 1.0)


def test_failed_or_skipped_needs_a_reason() -> None:
    with pytest.raises(RecordError, match="has no `reason`"):
        make_record(status="skipped")
    assert make_record(status="skipped", reason="no GPU").reason == "no GPU"


def test_unknown_schema_version_is_named(tmp_path: Path) -> None:
    data = make_record().to_dict() | {"schema_version": 99}
    with pytest.raises(RecordError, match="`schema_version` is 99"):
        Record.from_dict(data)


def test_record_from_before_baseline_found_still_reads() -> None:
    data = make_record().to_dict()
    tables = data["tables"]
    assert isinstance(tables, dict)
    for table in tables.values():
        del table["baseline_found"]
    assert Record.from_dict(data).tables["findings"].baseline_found is None


def test_latest_record_per_stage_wins(tmp_path: Path) -> None:
    write_record(tmp_path, make_record(run_id="a", ended_at="2026-11-28T02:00:00.000000Z"))
    write_record(tmp_path, make_record(run_id="b", ended_at="2026-11-29T02:00:00.000000Z"))
    write_record(
        tmp_path, make_record("kernels", run_id="a", ended_at="2026-11-28T02:00:00.000000Z")
    )
    latest = load_latest(tmp_path)
    assert {s: r.provenance.run_id for s, r in latest.items()} == {"audit": "b", "kernels": "a"}
    assert load_latest(tmp_path / "a")["audit"].provenance.run_id == "a"


def test_missing_empty_and_corrupt_results_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="does not exist"):
        load_latest(tmp_path / "nope")
    with pytest.raises(ResultsError, match="holds no records"):
        load_latest(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "audit.json").write_text('{"stage": "audit"')
    with pytest.raises(ResultsError) as info:
        load_latest(tmp_path)
    assert "\n" not in str(info.value)
    (tmp_path / "run" / "audit.json").write_text('{"schema_version": 1, "stage": "audit"}')
    with pytest.raises(ResultsError, match="invalid"):
        load_latest(tmp_path)
