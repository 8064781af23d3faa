"""worker health: why a worker stopped taking work (every job it ran failed, one after another),
and the latest work it refused (a set whose rollouts another generator drew)

Revision ID: 20261126_0017
Revises: 20261126_0016
Create Date: 2026-11-26 20:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "20261126_0017"
down_revision = "20261126_0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("workers", sa.Column("unhealthy", sa.Text(), nullable=True))
    op.add_column("workers", sa.Column("refused", sa.Text(), nullable=True))


def downgrade() -> None:
    # SQLite drops a column in place (3.35+); rebuilding the table would trip the views over it
    op.execute("ALTER TABLE workers DROP COLUMN refused")
    op.execute("ALTER TABLE workers DROP COLUMN unhealthy")
