from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


@pytest.mark.parametrize(
    "name", ["../../outside.png", "assets/x.png", "..", "", ".hidden.png", "x.png\n"]
)
def test_an_artifact_name_that_is_a_path_is_refused(name: str) -> None:
    # A figure's name becomes a path beside the ADRs when it is copied there.
    with pytest.raises(RecordError, match="must be a plain file name"):
        dataclasses.replace(make_record(), artifacts={name: "/tmp/x.png"})
    plain = {"e2e-vs_batch.png": "/tmp/x.png"}
    assert dataclasses.replace(make_record(), artifacts=plain).artifacts == plain


def test_a_stage_name_with_a_line_break_is_refused() -> None:
    with pytest.raises(RecordError, match="`stage` must be lowercase"):
        make_record(stage="audit\n")


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
    (tmp_path / "file").write_text("")
    with pytest.raises(ResultsError, match="exists but is not a directory"):
        load_latest(tmp_path / "file")
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


Corruption = Callable[[dict[str, Any]], object]


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda r: r.update(metrics=[1]), "`metrics` must be an object, got a list"),
        (lambda r: r.update(artifacts=[]), "`artifacts` must be an object, got a list"),
        (
            lambda r: r.update(artifacts={"a.png": 5}),
            "`artifacts.a.png` must be a string, got an integer",
        ),
        (
            lambda r: r["provenance"].update(ended_at=5),
            "`provenance.ended_at` must be a string, got an integer",
        ),
        (
            lambda r: r["provenance"].update(hardware={"gpus": ["a", "b"]}),
            "`provenance.hardware.gpus` must be a string, number, boolean or null, got a list",
        ),
        (
            lambda r: r["tables"]["findings"]["rows"][0].__setitem__(1, {"x": 1}),
            "`tables.findings.rows[0][1]` must be a string, number, boolean or null, got an object",
        ),
        (
            lambda r: r["tables"]["findings"].update(baseline_found="no"),
            "`tables.findings.baseline_found` must be a boolean or null, got a string",
        ),
        (
            lambda r: r["gates"][0].update(value=True),
            "`gates[0].value` must be a number, got a boolean",
        ),
        (lambda r: r.update(stage=3), "`stage` must be a string, got an integer"),
        (lambda r: r.update(reason=["x"]), "`reason` must be a string or null, got a list"),
    ],
    ids=[
        "metrics-list",
        "artifacts-list",
        "artifact-path-number",
        "ended-at-number",
        "hardware-list",
        "table-cell-object",
        "baseline-found-string",
        "gate-value-bool",
        "stage-number",
        "reason-list",
    ],
)
def test_a_field_of_the_wrong_type_is_named_when_the_record_is_read(
    tmp_path: Path, corrupt: Corruption, message: str
) -> None:
    # A valid record from an earlier run beside it, so the newest-record comparison runs too.
    write_record(tmp_path, make_record(run_id="a", ended_at="2026-11-28T02:00:00.000000Z"))
    path = write_record(tmp_path, make_record(run_id="b"))
    data = json.loads(path.read_text())
    corrupt(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError) as info:
        load_latest(tmp_path)
    assert str(info.value) == f"results record {path} is invalid: {message}"


def test_whole_numbers_read_as_numbers_where_the_schema_wants_a_float(tmp_path: Path) -> None:
    # Writers other than Python's json may drop the ".0" of a float; that is still the number.
    path = write_record(tmp_path, make_record())
    data = json.loads(path.read_text())
    data["gates"][0].update(value=0, threshold=1)
    path.write_text(json.dumps(data))
    gate = read_record(path).gates[0]
    assert (gate.value, gate.threshold, gate.passed) == (0, 1, True)
