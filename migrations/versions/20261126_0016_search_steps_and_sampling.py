"""step searches record how candidates are cut into steps and how they are sampled

Revision ID: 20261126_0016
Revises: 20261126_0015
Create Date: 2026-11-26 13:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "20261126_0016"
down_revision = "20261126_0015"
branch_labels = None
depends_on = None

# A search takes one turn per step of the policy: its candidates are cut with the segmentation
# of the set's trajectories (``segmentation``), and sampled with the search's own settings
# (``sampling``: the process-based self-rewarding method's T = 0.5, top_p = 0.95 unless asked
# otherwise).  Both NULL for searches started before this revision: they go on as they were
# started (cut at the first blank line, sampled with the set's settings).


def upgrade() -> None:
    op.add_column("step_searches", sa.Column("segmentation", sa.String(length=40), nullable=True))
    op.add_column("step_searches", sa.Column("sampling", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("step_searches") as batch_op:
        batch_op.drop_column("sampling")
        batch_op.drop_column("segmentation")
