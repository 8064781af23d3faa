"""one job queue: step searches carry every job column rollout work has; locks name their lease alike

Revision ID: 20261125_0012
Revises: 20261125_0011
Create Date: 2026-11-25 18:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "20261125_0012"
down_revision = "20261125_0011"
branch_labels = None
depends_on = None

# Step searches become jobs of the one queue (``models/jobs.py``): they gain the backoff, rerun
# and bookkeeping columns rollout work has, and their ``error`` is the queue's ``last_error``.
# The locks table names its lease as training runs and jobs do, so one lease primitive serves
# all three.  RENAME COLUMN is native on PostgreSQL and on SQLite >= 3.25 (no table rebuild).

RENAMES = (
    ("step_searches", "error", "last_error"),
    ("locks", "owner", "lease_owner"),
    ("locks", "expires_at", "lease_expires_at"),
)


def _search_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("enqueue_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("retry_at", sa.Float(), nullable=True),
        sa.Column("rerun", sa.Boolean(), server_default=sa.false(), nullable=False),
    ]


def upgrade() -> None:
    for table, old, new in RENAMES:
        op.execute(f"ALTER TABLE {table} RENAME COLUMN {old} TO {new}")
    for column in _search_columns():
        op.add_column("step_searches", column)


def downgrade() -> None:
    with op.batch_alter_table("step_searches") as batch_op:
        for column in _search_columns():
            batch_op.drop_column(column.name)
    for table, old, new in RENAMES:
        op.execute(f"ALTER TABLE {table} RENAME COLUMN {new} TO {old}")
