"""The declared sources of the blocks: every stage block has one, its renderer shows the table
it declares, and a record without a declared table is refused in one line naming block, stage
and table."""

from __future__ import annotations

from dataclasses import replace

import pytest

from adrkit import BLOCK_SOURCES, BLOCKS, check_records, missing_tables, render_block
from adrkit.schema import RecordError, Table

from conftest import make_record


def test_every_block_of_a_stage_declares_what_it_reads() -> None:
    assert set(BLOCK_SOURCES) == set(BLOCKS)
    for key, source in BLOCK_SOURCES.items():
        assert len(source.tables) <= 1, key  # a block shows at most one table
        assert all(figure.endswith(".png") for figure in source.figures), key


@pytest.mark.parametrize("key", [k for k, s in BLOCK_SOURCES.items() if s.tables])
def test_a_block_shows_the_table_it_declares(key: str) -> None:
    source = BLOCK_SOURCES[key]
    (table,) = source.tables
    # A column no presenter knows: each block then shows the table as recorded.
    marker = Table(["marker"], [["declared-table-row"]])
    other = Table(["marker"], [["other-table-row"]])
    record = replace(make_record(source.stage), tables={table: marker, "other": other})
    body = render_block(key, {source.stage: record}, "en")
    assert "declared-table-row" in body and "other-table-row" not in body


def test_a_record_whose_table_is_renamed_fails_in_one_line() -> None:
    # The accuracy stage renamed `deltas` to `delta`: its block would show no rows.
    tables = {"delta": Table(["task"], [["arc"]]), "divergence": Table(["arm"], [])}
    record = replace(make_record("accuracy"), tables=tables)
    with pytest.raises(RecordError) as raised:
        check_records([record])
    assert str(raised.value) == (
        "block `kvbench-accuracy` reads table `deltas` of stage `accuracy`, which is not among "
        "its tables (`delta`, `divergence`)"
    )
    check_records([replace(record, tables={**tables, "deltas": tables["delta"]})])


def test_every_missing_table_of_every_stage_is_named() -> None:
    problems = missing_tables({"throughput": ["kernels"], "kernels": []})
    assert problems == [
        "block `kvquant-resources` reads table `resources` of stage `kernels`, which is not "
        "among its tables (none)",
        "block `kvquant-resource-diff` reads table `resource-diff` of stage `kernels`, which is "
        "not among its tables (none)",
        "block `kvquant-specializations` reads table `specializations` of stage `kernels`, which "
        "is not among its tables (none)",
        "block `kvbench-served-step` reads table `served_steps` of stage `throughput`, which is "
        "not among its tables (`kernels`)",
        "block `kvbench-capacity` reads table `capacity` of stage `throughput`, which is not "
        "among its tables (`kernels`)",
        "block `kvbench-e2e` reads table `e2e` of stage `throughput`, which is not among its "
        "tables (`kernels`)",
    ]
    assert missing_tables({"no-such-stage": []}) == []


def test_a_record_without_results_is_not_judged() -> None:
    crashed = make_record("accuracy", status="failed", reason="RuntimeError: boom")
    skipped = make_record("accuracy", status="skipped", reason="not run: no vLLM")
    check_records([replace(crashed, tables={}), skipped])
    # A passed record has results: with no table at all, each block's table is missing.
    with pytest.raises(RecordError, match=r"^block `kvbench-accuracy` reads table `deltas`"):
        check_records([replace(make_record("accuracy"), tables={})])
