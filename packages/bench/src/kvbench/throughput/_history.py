"""The results history: any SQLAlchemy database (SQLite by default), its schema kept by Alembic.

A run is written in one transaction at its end, so a failure leaves the database as it was.
Regression baselines are read per (hardware fingerprint, cell name, metric).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

from ._errors import HistoryError

METADATA = sa.MetaData()

RUNS = sa.Table(
    "runs",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("hardware_key", sa.String(64), nullable=False, index=True),
    sa.Column("hardware", sa.JSON, nullable=False),
    sa.Column("matrix", sa.String(200), nullable=False),
    sa.Column("elapsed_s", sa.Float, nullable=False),
)

RESULTS = sa.Table(
    "results",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("run_id", sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("cell", sa.String(500), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("metric", sa.String(64), nullable=False),
    sa.Column("value", sa.Float, nullable=True),
    sa.Column("unit", sa.String(32), nullable=False),
    sa.Column("spread", sa.Float, nullable=True),
    sa.Column("engine_start_s", sa.Float, nullable=True),
    # Everything else the cell reported (parameters, bytes, bandwidth, speedup), for the record.
    sa.Column("details", sa.JSON, nullable=False),
    sa.Index("ix_results_cell_metric", "cell", "metric"),
)

# How long a writer waits for another process's lock on a SQLite file before giving up.
SQLITE_LOCK_TIMEOUT_S = 10.0


def default_history_url(out_dir: Path) -> str:
    """SQLite in the parent of the output folder, so successive nights' folders share it."""
    return f"sqlite:///{(out_dir.resolve().parent / 'kvbench-history.sqlite3').as_posix()}"


def check_history_url(url: str, *, create: bool = True, made_folders: Collection[Path] = ()) -> URL:
    """The parsed ``url``, checked without connecting or creating anything.

    Raises HistoryError when it is not a SQLAlchemy URL, or names a SQLite file whose folder does
    not exist and is not among ``made_folders`` (those the caller makes before opening it), or
    (``create`` False) a SQLite file that does not exist.
    """
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError:
        raise HistoryError(
            f"`history` is {url!r}; expected a SQLAlchemy URL such as sqlite:///FILE"
        ) from None
    # An empty database name and ":memory:" are SQLite's in-memory databases.
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return parsed
    database = Path(parsed.database)
    if not create and not database.exists():
        raise HistoryError(
            f"no history at {database}: the file does not exist "
            "(`kvbench throughput` creates it on its first run)"
        )
    if not database.parent.is_dir() and database.parent.resolve() not in made_folders:
        label = parsed.render_as_string(hide_password=True)
        raise HistoryError(f"history database {label}: its folder does not exist")
    return parsed


def _migrations_config(connection: sa.Connection) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(resources.files(__package__) / "migrations"))
    config.attributes["connection"] = connection
    return config


class History:
    """An open history database at the newest schema.

    Args:
        url: a SQLAlchemy URL, e.g. ``sqlite:///history.sqlite3`` or
            ``postgresql+psycopg://user@host/bench``.
        lock_timeout_s: SQLite only: how long to wait for another writer's lock.
        create: SQLite only: make the database file when it does not exist. False (reading
            the history) refuses a missing file instead of leaving an empty one behind.
    """

    def __init__(
        self, url: str, *, lock_timeout_s: float = SQLITE_LOCK_TIMEOUT_S, create: bool = True
    ) -> None:
        parsed = check_history_url(url, create=create)
        self.label = parsed.render_as_string(hide_password=True)
        is_sqlite = parsed.get_backend_name() == "sqlite"
        connect_args = {"timeout": lock_timeout_s} if is_sqlite else {}
        try:
            self.engine = sa.create_engine(url, connect_args=connect_args)
        except (sa.exc.ArgumentError, ImportError) as error:
            raise HistoryError(f"history database {self.label}: {error}") from None
        if is_sqlite:
            sa.event.listen(self.engine, "connect", _sqlite_foreign_keys)
        self.upgrade()

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Turn a database failure into one HistoryError line; the transaction rolls back."""
        try:
            yield
        except sa.exc.SQLAlchemyError as error:
            cause = getattr(error, "orig", None) or error
            detail = str(cause).splitlines()[0]
            raise HistoryError(
                f"history database {self.label}: cannot {action}: {detail}"
            ) from None

    def upgrade(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` with the packaged migrations (no-op when there)."""
        from alembic import command

        with self._errors("migrate the schema"), self.engine.begin() as connection:
            command.upgrade(_migrations_config(connection), revision)

    def downgrade(self, revision: str) -> None:
        """Undo migrations down to ``revision`` (``base`` removes every table)."""
        from alembic import command

        with self._errors("migrate the schema"), self.engine.begin() as connection:
            command.downgrade(_migrations_config(connection), revision)

    def record(self, run: dict[str, Any], *, matrix: str, started_at: dt.datetime) -> int:
        """Store a run (the dict ``run_throughput`` returns) in one transaction; returns its id."""
        hardware = run["hardware"]
        with self._errors("record the run"), self.engine.begin() as connection:
            inserted = connection.execute(
                RUNS.insert().values(
                    started_at=started_at,
                    hardware_key=hardware["key"],
                    hardware=hardware,
                    matrix=matrix,
                    elapsed_s=run["elapsed_s"],
                )
            ).inserted_primary_key
            assert inserted is not None  # an INSERT always yields its key
            run_id = inserted[0]
            rows = [_result_row(int(run_id), cell) for cell in run["cells"]]
            if rows:
                connection.execute(RESULTS.insert(), rows)
        return int(run_id)

    def recent_values(
        self, hardware_key: str, cell: str, metric: str, limit: int
    ) -> list[tuple[dt.datetime, float]]:
        """The newest ``limit`` successful values of one cell on one hardware, oldest first."""
        query = (
            sa.select(RUNS.c.started_at, RESULTS.c.value)
            .join(RUNS, RUNS.c.id == RESULTS.c.run_id)
            .where(
                RUNS.c.hardware_key == hardware_key,
                RESULTS.c.cell == cell,
                RESULTS.c.metric == metric,
                RESULTS.c.status == "ok",
                RESULTS.c.value.is_not(None),
            )
            .order_by(RUNS.c.started_at.desc(), RUNS.c.id.desc())
            .limit(limit)
        )
        with self._errors("read the history"), self.engine.connect() as connection:
            rows = connection.execute(query).all()
        return [(_aware(row[0]), float(row[1])) for row in reversed(rows)]

    def runs(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` runs, newest first, with their result counts."""
        failed = sa.func.sum(sa.case((RESULTS.c.status == "failed", 1), else_=0))
        query = (
            sa.select(
                RUNS.c.id,
                RUNS.c.started_at,
                RUNS.c.matrix,
                RUNS.c.hardware_key,
                RUNS.c.elapsed_s,
                sa.func.count(RESULTS.c.id),
                failed,
            )
            .outerjoin(RESULTS, RESULTS.c.run_id == RUNS.c.id)
            .group_by(RUNS.c.id)
            .order_by(RUNS.c.started_at.desc(), RUNS.c.id.desc())
            .limit(limit)
        )
        with self._errors("read the history"), self.engine.connect() as connection:
            rows = connection.execute(query).all()
        return [
            {
                "id": row[0],
                "started_at": _aware(row[1]).isoformat(),
                "matrix": row[2],
                "hardware_key": row[3],
                "elapsed_s": row[4],
                "cells": row[5],
                "failed": int(row[6] or 0),
            }
            for row in rows
        ]

    def close(self) -> None:
        self.engine.dispose()


def _sqlite_foreign_keys(dbapi_connection: Any, _record: object) -> None:
    # SQLite ignores ON DELETE CASCADE unless asked per connection.
    dbapi_connection.execute("PRAGMA foreign_keys=ON")


def _aware(when: dt.datetime) -> dt.datetime:
    """SQLite returns naive datetimes; every time stored here is UTC."""
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


_COLUMNS = ("kind", "status", "error", "metric", "value", "unit", "spread", "engine_start_s")


def _result_row(run_id: int, cell: dict[str, Any]) -> dict[str, Any]:
    row = {column: cell.get(column) for column in _COLUMNS}
    row.update(run_id=run_id, cell=cell["name"])
    row["details"] = {k: v for k, v in cell.items() if k not in (*_COLUMNS, "name")}
    return row
