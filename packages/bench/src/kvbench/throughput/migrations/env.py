"""Alembic's entry point: migrate the connection that ``History`` hands over.

There is no alembic.ini; ``History.upgrade`` builds the configuration and passes an open
connection in ``config.attributes["connection"]``.
"""

from __future__ import annotations

from alembic import context

from kvbench.throughput._history import METADATA

context.configure(
    connection=context.config.attributes["connection"],
    target_metadata=METADATA,
    # SQLite cannot ALTER most things; batch mode rebuilds tables for it.
    render_as_batch=True,
)
with context.begin_transaction():
    context.run_migrations()
