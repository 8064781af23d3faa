"""sampling fence: a set's count of resamples and the generator its rollouts are drawn by, both
checked by a worker's write

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
    op.add_column("problem_sets", sa.Column("generator", sa.String(400), nullable=True))
    # a set annotated before this revision is pinned to the generator of one of its rollouts
    op.execute(
        "UPDATE problem_sets SET generator = (SELECT r.generator FROM rollouts r "
        "JOIN trajectories t ON t.id = r.trajectory_id JOIN problems p ON p.id = t.problem_id "
        "WHERE p.problem_set_id = problem_sets.id LIMIT 1)"
    )


def downgrade() -> None:
    # SQLite drops a column in place (3.35+); rebuilding the table would trip the views over it
    op.execute("ALTER TABLE problem_sets DROP COLUMN generator")
    op.execute("ALTER TABLE problem_sets DROP COLUMN sampling_generation")
