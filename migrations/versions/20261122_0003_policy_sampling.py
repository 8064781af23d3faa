"""policy sampling

Revision ID: 20261122_0003
Revises: 20261122_0002
Create Date: 2026-11-22 11:49:23.803638
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '20261122_0003'
down_revision = '20261122_0002'
branch_labels = None
depends_on = None


# Chunk statistics per segmentation method (how much annotation each method costs); words
# are counted as spaces + 1, the same on both dialects.
SEGMENTATION_STATS = """
CREATE VIEW segmentation_stats AS
SELECT
    ps.name AS problem_set,
    t.segmentation AS segmentation,
    count(DISTINCT t.id) AS trajectories,
    count(c.id) AS chunks,
    1.0 * count(c.id) / count(DISTINCT t.id) AS chunks_per_trajectory,
    avg(length(c.text)) AS chars_per_chunk,
    avg(length(c.text) - length(replace(c.text, ' ', '')) + 1) AS words_per_chunk
FROM trajectories t
JOIN problems p ON p.id = t.problem_id
JOIN problem_sets ps ON ps.id = p.problem_set_id
JOIN chunks c ON c.trajectory_id = t.id
GROUP BY ps.name, t.segmentation
"""


def upgrade() -> None:
    # A plain ADD COLUMN (no batch copy on SQLite, which would trip over the views).
    op.add_column('problems', sa.Column('excluded', sa.Boolean(), server_default=sa.false(), nullable=False))
    op.execute(SEGMENTATION_STATS)



def downgrade() -> None:
    op.execute("DROP VIEW segmentation_stats")
    with op.batch_alter_table('problems', schema=None) as batch_op:
        batch_op.drop_column('excluded')

