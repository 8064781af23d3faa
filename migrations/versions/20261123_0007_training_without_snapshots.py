"""training runs on other signals: a run trains on a snapshot or on a named dataset

Revision ID: 20261123_0007
Revises: 20261123_0006
Create Date: 2026-11-23 12:00:00

Step-wise DPO trains on preference pairs and the discriminative PRM on outcome-labelled
solutions, neither of which is a snapshot: ``training_runs.snapshot_id`` becomes optional
and ``training_runs.dataset`` says what such a run read (``preferences:SET`` ...).  The
``training_progress`` view shows both.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '20261123_0007'
down_revision = '20261123_0006'
branch_labels = None
depends_on = None

VIEW = """
CREATE VIEW training_progress AS
SELECT
    tr.id AS run,
    s.name AS snapshot,
    tr.method AS method,
    tr.lineage AS lineage,
    tr.status AS status,
    tr.global_step AS step,
    tr.max_steps AS max_steps,
    tr.resumes AS resumes,
    tr.last_checkpoint AS last_checkpoint,
    m.reward AS reward,
    m.accuracy_positive AS accuracy_positive,
    m.accuracy_negative AS accuracy_negative,
    m.completion_length AS completion_length,
    m.clip_ratio AS clip_ratio,
    m.entropy AS entropy,
    m.loss AS loss,
    tr.host AS host,
    tr.error AS error,
    tr.dataset AS dataset
FROM training_runs tr
{join} snapshots s ON s.id = tr.snapshot_id
LEFT JOIN training_metrics m
    ON m.run_id = tr.id AND m.step = (SELECT max(m2.step) FROM training_metrics m2 WHERE m2.run_id = tr.id)
"""
OLD_VIEW = VIEW.replace(",\n    tr.dataset AS dataset", "")


def upgrade() -> None:
    op.execute("DROP VIEW training_progress")  # SQLite rebuilds the table below; the view must go first
    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.alter_column('snapshot_id', existing_type=sa.Integer(), nullable=True)
        batch_op.add_column(sa.Column('dataset', sa.Text(), nullable=True))
    op.execute(VIEW.format(join="LEFT JOIN"))


def downgrade() -> None:
    op.execute("DROP VIEW training_progress")
    op.execute("DELETE FROM training_runs WHERE snapshot_id IS NULL")
    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.drop_column('dataset')
        batch_op.alter_column('snapshot_id', existing_type=sa.Integer(), nullable=False)
    op.execute(OLD_VIEW.format(join="JOIN"))
