"""The tables the ADR blocks read against the tables the stages record: checked when the pipeline
starts, from what each package's result declares, and again on each record as it is made."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from adrkit import utc_now
from adrkit.schema import RecordParts, Table
from flows._stage import RunContext, stage_record
from flows.pipeline import STAGES, MisdeclaredBlockError, check_block_sources

RENAMED = (
    "block `kvbench-accuracy` reads table `deltas` of stage `accuracy`, which is not among its "
    "tables (`delta`, `divergence`)"
)


def test_every_table_a_block_reads_is_one_its_stage_records() -> None:
    check_block_sources()


def test_a_stage_whose_result_renamed_a_table_stops_the_pipeline_at_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    renamed = replace(STAGES["accuracy"], tables=("delta", "divergence"))
    monkeypatch.setitem(STAGES, "accuracy", renamed)
    with pytest.raises(MisdeclaredBlockError) as raised:
        check_block_sources()
    assert str(raised.value) == RENAMED


def test_a_record_without_a_table_its_blocks_read_fails_its_stage(tmp_path: Path) -> None:
    empty = Table(["task"], [])
    tables = {"delta": empty, "divergence": empty}
    parts = RecordParts("INT8 against 16-bit", {"divergence_controls_failed": 0}, tables)
    record = stage_record(RunContext("run-1", tmp_path), "accuracy", utc_now(), parts)
    # Every gate passed; the table the block reads is missing.
    assert [g.passed for g in record.gates] == [True]
    assert (record.status, record.reason) == ("failed", RENAMED)
