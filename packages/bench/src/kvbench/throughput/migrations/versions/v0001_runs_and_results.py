"""Runs and their per-cell results.

Revision ID: v0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "v0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hardware_key", sa.String(64), nullable=False),
        sa.Column("hardware", sa.JSON, nullable=False),
        sa.Column("matrix", sa.String(200), nullable=False),
        sa.Column("elapsed_s", sa.Float, nullable=False),
    )
    op.create_index("ix_runs_hardware_key", "runs", ["hardware_key"])
    op.create_table(
        "results",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("cell", sa.String(500), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("value", sa.Float, nullable=True),
        sa.Column("unit", sa.String(32), nullable=False),
        sa.Column("spread", sa.Float, nullable=True),
        sa.Column("engine_start_s", sa.Float, nullable=True),
        sa.Column("details", sa.JSON, nullable=False),
    )
    op.create_index("ix_results_cell_metric", "results", ["cell", "metric"])


def downgrade() -> None:
    op.drop_index("ix_results_cell_metric", table_name="results")
    op.drop_table("results")
    op.drop_index("ix_runs_hardware_key", table_name="runs")
    op.drop_table("runs")
