"""sampling generation: a set's count of resamples, the fence a worker's write checks

Revision ID: 20261126_0018
Revises: 20261126_0017
Create Date: 2026-11-26 20:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "20261126_0018"
down_revision = "20261126_0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "problem_sets", sa.Column("sampling_generation", sa.Integer(), server_default="0", nullable=False)
    )


def downgrade() -> None:
    # SQLite drops a column in place (3.35+); rebuilding the table would trip the views over it
    op.execute("ALTER TABLE problem_sets DROP COLUMN sampling_generation")
