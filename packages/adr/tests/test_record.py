from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adrkit import ResultsError, load_latest, read_record, write_record
from adrkit.schema import Gate, Record, RecordError

from conftest import assert_one_line_error, make_record, python_env, run_update, tree_hashes


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
        dataclasses.replace(make_record(), artifacts={name: "out/x.png"})
    plain = {"e2e-vs_batch.png": "out/x.png"}
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


@pytest.mark.parametrize(
    ("value", "op", "threshold"),
    [
        (math.inf, ">=", 0.7),
        (-math.inf, "<=", 0.0),
        (-math.inf, "<", 0.0),
        (math.nan, "==", math.nan),
        (0.5, "<=", math.inf),
        (0.5, ">=", -math.inf),
        (0.5, "<=", math.nan),
    ],
)
def test_a_value_or_threshold_that_is_not_finite_never_passes(
    value: float, op: str, threshold: float
) -> None:
    assert Gate.judge("g", value, op, threshold).passed is False


def test_a_gate_whose_stored_verdict_disagrees_is_refused() -> None:
    with pytest.raises(RecordError, match=r"stored verdict `passed: true` disagrees with nan <= 1"):
        Gate("g", math.nan, "<=", 1.0, passed=True)
    with pytest.raises(RecordError, match=r"`passed: false` disagrees with 0 <= 1, which passes"):
        Gate("g", 0.0, "<=", 1.0, passed=False)


def _raw_record(tmp_path: Path, edit: Callable[[dict[str, Any]], object]) -> Path:
    """A record file as a careless or hostile writer leaves it: valid, then ``edit``ed as JSON."""
    path = write_record(tmp_path / "results", make_record())
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


def _gate(**fields: object) -> Callable[[dict[str, Any]], object]:
    return lambda r: r["gates"][0].update(fields)


def _provenance(**fields: object) -> Callable[[dict[str, Any]], object]:
    return lambda r: r["provenance"].update(fields)


def _nested(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


RAW_TEXT = {
    # JSON that Python's json module writes but a record reader must still refuse in one line.
    "nested-2000-levels": '{"schema_version": 1, "metrics": ' + "[" * 2000 + "]" * 2000 + "}",
    "integer-of-5000-digits": '{"schema_version": 1, "metrics": {"n": ' + "9" * 5000 + "}}",
    "not-utf8": b"\xff\xfe{}",
    "a-list": "[]",
}
EDITS: dict[str, tuple[Callable[[dict[str, Any]], object], str]] = {
    "nan-gate-stored-as-passed": (_gate(value=math.nan, passed=True), "stored verdict"),
    "infinite-gate-stored-as-passed": (
        _gate(value=math.inf, op=">=", threshold=0.7, passed=True),
        "stored verdict",
    ),
    "failing-gate-stored-as-passed": (_gate(value=1, passed=True), "stored verdict"),
    "gate-threshold-too-large": (_gate(threshold=10**400), "too large"),
    "run-id-a-path": (_provenance(run_id="../../elsewhere"), "`provenance.run_id`"),
    "run-id-with-backtick": (_provenance(run_id="run`1"), "`provenance.run_id`"),
    "commit-not-hex": (_provenance(repo_commit="HEAD`; rm"), "`provenance.repo_commit`"),
    "flow-run-id-with-pipe": (_provenance(flow_run_id="a|b"), "`provenance.flow_run_id`"),
    "ended-at-not-a-time": (_provenance(ended_at="yesterday"), "`provenance.ended_at`"),
    "started-at-month-13": (_provenance(started_at="2026-13-01T00:00:00Z"), "started_at"),
    "stage-too-long": (lambda r: r.update(stage="a" * 65), "`stage`"),
    "deep-nesting-in-a-field": (lambda r: r.update(summary=_nested(500)), "`summary`"),
}


@pytest.mark.parametrize("check", [False, True], ids=["update", "check"])
@pytest.mark.parametrize("case", [*RAW_TEXT, *EDITS])
def test_a_corrupt_record_is_one_line_exit_2_and_changes_nothing(
    adr_dir: Path, tmp_path: Path, case: str, check: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    # Exit 2 under --check too: exit 1 would read as "stale", a verdict on good input.
    if case in RAW_TEXT:
        path = write_record(tmp_path / "results", make_record())
        raw = RAW_TEXT[case]
        path.write_bytes(raw if isinstance(raw, bytes) else raw.encode())
        expected = str(path)
    else:
        edit, expected = EDITS[case]
        _raw_record(tmp_path, edit)
    before = tree_hashes(tmp_path)
    code, err = run_update(capsys, adr_dir, tmp_path / "results", *(["--check"] if check else []))
    assert code == 2
    assert_one_line_error(err, expected)
    assert tree_hashes(tmp_path) == before


def test_a_record_over_the_size_cap_is_refused_unread(
    adr_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from adrkit import MAX_RECORD_BYTES

    path = write_record(tmp_path / "results", make_record())
    data = json.loads(path.read_text())
    data["summary"] = "x" * MAX_RECORD_BYTES  # valid, and one byte is enough to be too large
    path.write_text(json.dumps(data))
    before = tree_hashes(tmp_path)
    code, err = run_update(capsys, adr_dir, tmp_path / "results")
    assert code == 2
    assert_one_line_error(err, str(path), f"over the limit of {MAX_RECORD_BYTES}")
    assert tree_hashes(tmp_path) == before


def test_a_record_that_is_a_fifo_is_refused_without_blocking(adr_dir: Path, tmp_path: Path) -> None:
    # A subprocess with a timeout: a reader that opened the FIFO would wait for a writer forever.
    run_dir = tmp_path / "results" / "run-1"
    run_dir.mkdir(parents=True)
    os.mkfifo(run_dir / "audit.json")
    args = ["update", "--adr-dir", str(adr_dir), "--results", str(tmp_path / "results")]
    done = subprocess.run(
        [sys.executable, "-m", "adrkit", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=python_env(),
        check=False,
    )
    assert done.returncode == 2
    assert_one_line_error(done.stderr, "not a regular file")


def test_a_lone_surrogate_in_a_record_text_shows_as_a_replacement_character(
    adr_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # JSON can carry "\ud800"; UTF-8 cannot, so writing it into an ADR would fail midway.
    _raw_record(tmp_path, lambda r: r.update(summary="before\ud800after"))
    assert run_update(capsys, adr_dir, tmp_path / "results") == (0, "")
    assert "before\ufffdafter" in (adr_dir / "0012-fork-audit.md").read_text(encoding="utf-8")


def test_the_newest_record_is_found_by_time_not_by_text(tmp_path: Path) -> None:
    # As text "02:00:00Z" sorts after "02:00:00.5Z", though it is half a second earlier.
    write_record(tmp_path, make_record(run_id="later", ended_at="2026-11-29T02:00:00.5Z"))
    write_record(tmp_path, make_record(run_id="earlier", ended_at="2026-11-29T02:00:00Z"))
    assert load_latest(tmp_path)["audit"].provenance.run_id == "later"


def test_write_record_refuses_an_artifact_outside_the_run_directory(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.png"
    record = dataclasses.replace(make_record(), artifacts={"plot.png": str(outside)})
    with pytest.raises(RecordError, match="outside the run directory"):
        write_record(tmp_path / "results", record)
    assert not (tmp_path / "results").exists()


def test_a_run_id_that_is_a_path_cannot_write_outside_the_results_root(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match=r"`provenance\.run_id`"):
        write_record(tmp_path / "results", make_record(run_id="../outside"))
    assert list(tmp_path.iterdir()) == []


def test_read_record_returns_artifacts_as_paths_from_the_record_directory(tmp_path: Path) -> None:
    stage_dir = tmp_path / "run-1" / "audit"
    record = dataclasses.replace(make_record(), artifacts={"report.md": str(stage_dir / "r.md")})
    path = write_record(tmp_path, record)
    assert json.loads(path.read_text())["artifacts"] == {"report.md": "audit/r.md"}
    assert read_record(path) == record
