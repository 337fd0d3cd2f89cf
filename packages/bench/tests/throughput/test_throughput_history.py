"""The history database: migrations, round trips, and corrupt or locked files left intact."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from kvbench.throughput import History, HistoryError
from kvbench.throughput._history import METADATA


def _run(value: float, name: str = "decode int8") -> dict[str, Any]:
    cell = {
        "kind": "kernel", "name": name, "status": "ok", "error": None, "metric": "time_ms",
        "value": value, "unit": "ms", "spread": 0.1, "engine_start_s": None, "batch": 4,
    }  # fmt: skip
    return {"hardware": {"key": "hw1", "cpu": "test"}, "cells": [cell], "elapsed_s": 1.0}


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def test_migrations_build_exactly_the_declared_schema_and_undo_it(tmp_path: Path) -> None:
    history = History(_url(tmp_path / "h.sqlite3"))
    with history.engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), METADATA) == []
    history.downgrade("base")
    assert set(sa.inspect(history.engine).get_table_names()) == {"alembic_version"}
    history.upgrade()
    assert {"runs", "results"} <= set(sa.inspect(history.engine).get_table_names())
    history.close()


def test_reopening_keeps_the_runs_and_reads_them_oldest_first(tmp_path: Path) -> None:
    url = _url(tmp_path / "h.sqlite3")
    start = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    history = History(url)
    for night, value in enumerate([3.0, 1.0, 2.0]):
        history.record(_run(value), matrix="m", started_at=start + dt.timedelta(days=night))
    history.close()
    reopened = History(url)
    values = reopened.recent_values("hw1", "decode int8", "time_ms", limit=2)
    assert [v for _, v in values] == [1.0, 2.0]
    assert values[-1][0] == start + dt.timedelta(days=2)
    assert reopened.recent_values("other-hw", "decode int8", "time_ms", limit=5) == []
    assert [run["cells"] for run in reopened.runs(10)] == [1, 1, 1]
    reopened.close()


def test_corrupt_database_is_a_clear_error_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    garbage = b"this is not a database\n" * 200
    path.write_bytes(garbage)
    with pytest.raises(HistoryError) as error:
        History(_url(path))
    assert "not a database" in str(error.value) and "\n" not in str(error.value)
    assert path.read_bytes() == garbage


def test_locked_database_is_a_clear_error_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    start = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    history = History(_url(path), lock_timeout_s=0.2)
    history.record(_run(1.0), matrix="m", started_at=start)
    holder = sqlite3.connect(path)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(HistoryError, match="database is locked"):
            history.record(_run(2.0), matrix="m", started_at=start + dt.timedelta(days=1))
    finally:
        holder.rollback()
        holder.close()
    assert [v for _, v in history.recent_values("hw1", "decode int8", "time_ms", 5)] == [1.0]
    history.close()


def test_bad_url_is_a_one_line_error() -> None:
    with pytest.raises(HistoryError, match="expected a SQLAlchemy URL"):
        History("not a url")


def test_reading_a_missing_database_refuses_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "typo.sqlite3"
    with pytest.raises(HistoryError) as error:
        History(_url(path), create=False)
    assert str(error.value) == (
        f"no history at {path}: the file does not exist "
        "(`kvbench throughput` creates it on its first run)"
    )
    assert not path.exists()


def test_recording_creates_the_database_that_reading_then_opens(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    History(_url(path)).close()  # as `kvbench throughput` does on its first run
    assert path.is_file()
    reader = History(_url(path), create=False)
    assert reader.runs(5) == []
    reader.close()
